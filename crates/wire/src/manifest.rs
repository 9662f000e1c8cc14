//! The per-device manifest: which partitions of which tables a device holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{FormatDescriptor, WireError, WireResult};

/// File name of the manifest inside a device directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The manifest version this build writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

/// Names one partition of one table.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PartitionRef {
    pub table: String,
    pub partition: u32,
}

/// Everything a device holds, with a descriptor per partition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub device: u32,
    /// table name → partitions, ordered by partition id.
    pub tables: BTreeMap<String, Vec<FormatDescriptor>>,
}

impl Manifest {
    pub fn new(device: u32) -> Self {
        Self {
            version: MANIFEST_VERSION,
            device,
            tables: BTreeMap::new(),
        }
    }

    /// Parses manifest bytes; `path` names the file in errors.
    pub fn from_json(bytes: &[u8], path: &str) -> WireResult<Self> {
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|e| WireError::Manifest {
                path: path.to_string(),
                reason: format!("not a valid manifest ({e})"),
            })?;
        if manifest.version != MANIFEST_VERSION {
            return Err(WireError::Manifest {
                path: path.to_string(),
                reason: format!(
                    "unknown manifest version {} (this build reads {MANIFEST_VERSION})",
                    manifest.version
                ),
            });
        }
        for parts in manifest.tables.values() {
            for d in parts {
                d.check_version()?;
            }
        }
        Ok(manifest)
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("manifest serializes")
    }

    pub fn partition(&self, table: &str, partition: u32) -> Option<&FormatDescriptor> {
        self.tables
            .get(table)?
            .iter()
            .find(|d| d.partition == partition)
    }

    /// Adds or replaces one partition's descriptor.
    pub fn upsert(&mut self, descriptor: FormatDescriptor) {
        let parts = self.tables.entry(descriptor.table.clone()).or_default();
        parts.retain(|d| d.partition != descriptor.partition);
        parts.push(descriptor);
        parts.sort_by_key(|d| d.partition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_truncated_and_unknown_versions() {
        let mut m = Manifest::new(3);
        m.upsert(FormatDescriptor {
            version: crate::DESCRIPTOR_VERSION,
            table: "t".into(),
            partition: 0,
            file: "t/0.parquet".into(),
            layout: crate::LayoutKind::Parquet,
            fields: vec![],
            row_count: 0,
            byte_size: 0,
            crc32: 0,
            row_groups: vec![],
            hybrid: None,
            partitioning: None,
        });
        let bytes = m.to_json();
        assert_eq!(Manifest::from_json(&bytes, "m").unwrap(), m);
        let err = Manifest::from_json(&bytes[..bytes.len() / 2], "dev3/manifest.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("dev3/manifest.json"), "{err}");
        let text = String::from_utf8(bytes)
            .unwrap()
            .replace("\"version\": 1", "\"version\": 9");
        let err = Manifest::from_json(text.as_bytes(), "m")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown manifest version 9"), "{err}");
    }
}
