//! A data root: the directory that holds an embedded cluster's devices,
//! `dev0/ … dev{N-1}/`, and `insitu-root.json` recording N.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use insitu_format::write_atomically;
use insitu_wire::units::ByteSize;
use serde::{Deserialize, Serialize};

use crate::{Device, DeviceConfig};

/// File that marks a directory as a data root.
pub const ROOT_FILE: &str = "insitu-root.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RootMeta {
    version: u32,
    devices: u32,
    /// See [`RootSettings`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    host_mem: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    device_mem: Option<ByteSize>,
}

/// Settings a user may write into a root's `insitu-root.json`
/// (`"host_mem": "8GiB"`, `"device_mem": "2GiB"`, bytes or a size with
/// a unit); command line flags override them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RootSettings {
    /// The host's memory budget (`host_mem_bytes_max`).
    pub host_mem: Option<usize>,
    /// Each device's memory budget (`mem_bytes_max`).
    pub device_mem: Option<usize>,
}

/// Where hosts over a root spill (each in a directory of its own).
pub const HOST_SPILL_DIR: &str = ".host-spill";

/// A problem with a data root or one of its devices.
#[derive(Debug, thiserror::Error)]
#[error("data root {root}: {message}")]
pub struct RootError {
    pub root: String,
    pub message: String,
}

/// Device budgets applied to every device of a root.
#[derive(Debug, Clone)]
pub struct DeviceBudget {
    pub mem_bytes_max: usize,
    pub threads: usize,
}

impl Default for DeviceBudget {
    fn default() -> Self {
        let d = DeviceConfig::new(0);
        Self {
            mem_bytes_max: d.mem_bytes_max,
            threads: d.threads,
        }
    }
}

pub fn device_dir(root: &Path, id: u32) -> PathBuf {
    root.join(format!("dev{id}"))
}

fn root_err(root: &Path, message: impl Into<String>) -> RootError {
    RootError {
        root: root.display().to_string(),
        message: message.into(),
    }
}

fn root_meta(root: &Path) -> Result<Option<RootMeta>, RootError> {
    let path = root.join(ROOT_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let meta: RootMeta = serde_json::from_slice(&bytes)
                .map_err(|e| root_err(root, format!("{ROOT_FILE} is not valid: {e}")))?;
            Ok(Some(meta))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(root_err(root, format!("cannot read {ROOT_FILE}: {e}"))),
    }
}

/// How many devices the root at `root` has, if it is one.
pub fn device_count(root: &Path) -> Result<Option<u32>, RootError> {
    Ok(root_meta(root)?.map(|m| m.devices))
}

/// The settings in the root's `insitu-root.json` (none if it is no root).
pub fn root_settings(root: &Path) -> Result<RootSettings, RootError> {
    Ok(root_meta(root)?
        .map(|m| RootSettings {
            host_mem: m.host_mem.map(|b| b.0),
            device_mem: m.device_mem.map(|b| b.0),
        })
        .unwrap_or_default())
}

/// Creates (or reuses) a root with `devices` devices.
pub fn create_root(
    root: &Path,
    devices: u32,
    budget: &DeviceBudget,
) -> Result<Vec<Arc<Device>>, RootError> {
    if devices == 0 {
        return Err(root_err(root, "a root needs at least one device"));
    }
    let existing = root_meta(root)?;
    if let Some(existing) = &existing {
        if existing.devices != devices {
            return Err(root_err(
                root,
                format!(
                    "already holds {} devices, not {devices}; use another --root",
                    existing.devices
                ),
            ));
        }
    }
    std::fs::create_dir_all(root).map_err(|e| root_err(root, format!("cannot create: {e}")))?;
    // The user's settings stay.
    let (host_mem, device_mem) = existing.map_or((None, None), |m| (m.host_mem, m.device_mem));
    let meta = serde_json::to_vec_pretty(&RootMeta {
        version: 1,
        devices,
        host_mem,
        device_mem,
    })
    .expect("root meta");
    write_atomically(&root.join(ROOT_FILE), &meta).map_err(|e| root_err(root, e.to_string()))?;
    (0..devices)
        .map(|id| {
            Device::create(&device_dir(root, id), config(id, budget))
                .map_err(|e| root_err(root, e.to_string()))
        })
        .collect()
}

fn config(id: u32, budget: &DeviceBudget) -> DeviceConfig {
    DeviceConfig {
        id,
        mem_bytes_max: budget.mem_bytes_max,
        threads: budget.threads,
        ..DeviceConfig::new(id)
    }
}

/// Opens every device of an existing root; a missing device directory is an
/// error naming the device.
pub fn open_root(root: &Path, budget: &DeviceBudget) -> Result<Vec<Arc<Device>>, RootError> {
    let count = device_count(root)?.ok_or_else(|| {
        root_err(
            root,
            format!(
                "not a data root (no {ROOT_FILE}); create one with `insitu gen` or `insitu load`"
            ),
        )
    })?;
    (0..count)
        .map(|id| {
            Device::open(&device_dir(root, id), config(id, budget))
                .map_err(|e| root_err(root, e.to_string()))
        })
        .collect()
}
