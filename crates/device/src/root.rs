//! A data root: the directory that holds an embedded cluster's devices,
//! `dev0/ … dev{N-1}/`, and `insitu-root.json` recording N.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use insitu_format::write_atomically;
use serde::{Deserialize, Serialize};

use crate::{Device, DeviceConfig};

/// File that marks a directory as a data root.
pub const ROOT_FILE: &str = "insitu-root.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RootMeta {
    version: u32,
    devices: u32,
}

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

/// How many devices the root at `root` has, if it is one.
pub fn device_count(root: &Path) -> Result<Option<u32>, RootError> {
    let path = root.join(ROOT_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let meta: RootMeta = serde_json::from_slice(&bytes)
                .map_err(|e| root_err(root, format!("{ROOT_FILE} is not valid: {e}")))?;
            Ok(Some(meta.devices))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(root_err(root, format!("cannot read {ROOT_FILE}: {e}"))),
    }
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
    if let Some(existing) = device_count(root)? {
        if existing != devices {
            return Err(root_err(
                root,
                format!("already holds {existing} devices, not {devices}; use another --root"),
            ));
        }
    }
    std::fs::create_dir_all(root).map_err(|e| root_err(root, format!("cannot create: {e}")))?;
    let meta = serde_json::to_vec_pretty(&RootMeta {
        version: 1,
        devices,
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
