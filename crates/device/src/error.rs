//! Device errors: every one names the device.

use datafusion::error::DataFusionError;

/// What kind of failure a device reports; the host maps kinds back to
/// DataFusion error variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceErrorKind {
    /// The device directory or a table/partition is missing.
    NotFound,
    /// A partition or manifest fails its checks.
    Corrupt,
    /// The stage plan is malformed, oversized, or asks for something unsupported.
    BadPlan,
    /// The memory budget (`mem_bytes_max`) is exhausted.
    ResourcesExhausted,
    /// The host went away before the stage ended.
    Cancelled,
    /// The device's configuration contradicts its directory (another id).
    Config,
    /// Anything else while running a stage.
    Execution,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("device {device}: {message}")]
pub struct DeviceError {
    pub device: u32,
    pub kind: DeviceErrorKind,
    pub message: String,
}

impl DeviceError {
    pub fn new(device: u32, kind: DeviceErrorKind, message: impl Into<String>) -> Self {
        Self {
            device,
            kind,
            message: message.into(),
        }
    }

    /// Classifies a DataFusion error raised while running a stage.
    pub fn from_datafusion(device: u32, mem_bytes_max: usize, e: DataFusionError) -> Self {
        match e.find_root() {
            DataFusionError::ResourcesExhausted(msg) => Self::new(
                device,
                DeviceErrorKind::ResourcesExhausted,
                format!(
                    "memory budget mem_bytes_max={mem_bytes_max} bytes exhausted \
                     (queries may reserve {} bytes of it; the rest is kernel scratch): {msg}",
                    crate::query_bytes_max(mem_bytes_max)
                ),
            ),
            DataFusionError::Plan(msg) => Self::new(device, DeviceErrorKind::BadPlan, msg.clone()),
            _ => Self::new(device, DeviceErrorKind::Execution, e.to_string()),
        }
    }

    pub fn into_datafusion(self) -> DataFusionError {
        let text = self.to_string();
        match self.kind {
            DeviceErrorKind::ResourcesExhausted => DataFusionError::ResourcesExhausted(text),
            DeviceErrorKind::BadPlan => DataFusionError::Plan(text),
            DeviceErrorKind::Config => DataFusionError::Configuration(text),
            _ => DataFusionError::Execution(text),
        }
    }
}

pub type DeviceResult<T> = Result<T, DeviceError>;
