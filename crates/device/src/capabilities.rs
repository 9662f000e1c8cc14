//! What a device advertises when the host connects: its operators, the
//! Arrow types it computes on, its layouts and encodings, its limits and
//! profile.

use insitu_wire::{Capabilities, Encoding, LayoutKind, PROTOCOL_VERSION};

use crate::Device;

impl Device {
    /// What this device runs and stores, as it advertises it to hosts.
    pub fn capabilities(&self) -> Capabilities {
        let mut operators = self.config.operators.clone();
        operators.sort();
        operators.dedup();
        Capabilities {
            protocol_version: PROTOCOL_VERSION,
            device_id: self.config.id,
            operators,
            data_types: SUPPORTED_TYPES.iter().map(|s| s.to_string()).collect(),
            layouts: vec![
                layout_name(LayoutKind::Parquet),
                layout_name(LayoutKind::Hybrid),
            ],
            encodings: [
                Encoding::Plain,
                Encoding::Dictionary,
                Encoding::Rle,
                Encoding::DeltaBinaryPacked,
            ]
            .into_iter()
            .map(encoding_name)
            .collect(),
            mem_bytes_max: self.config.mem_bytes_max as u64,
            threads: self.config.threads as u32,
            profile: Some(self.profile.clone()),
        }
    }
}

/// Arrow types a device reads and computes on (what its Parquet reader and
/// DataFusion's kernels handle).
const SUPPORTED_TYPES: &[&str] = &[
    "Boolean",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "UInt8",
    "UInt16",
    "UInt32",
    "UInt64",
    "Float16",
    "Float32",
    "Float64",
    "Decimal128",
    "Decimal256",
    "Date32",
    "Date64",
    "Timestamp",
    "Time32",
    "Time64",
    "Utf8",
    "LargeUtf8",
    "Utf8View",
    "Binary",
    "LargeBinary",
    "BinaryView",
    "FixedSizeBinary",
    "Dictionary",
];

fn layout_name(layout: LayoutKind) -> String {
    serde_json::to_value(layout)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn encoding_name(encoding: Encoding) -> String {
    serde_json::to_value(encoding)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
