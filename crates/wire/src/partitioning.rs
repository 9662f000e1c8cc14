//! How a table's rows are spread over its partitions: the key, the
//! function from key to partition, and (through the manifests that hold
//! each partition) partition to device. Every partition's descriptor
//! carries its table's [`Partitioning`], so a host that reads the
//! manifests can tell when two tables are co-partitioned on a join's keys.
//!
//! ```text
//!  range on o_orderkey, 4 partitions       hash on c_custkey, 4 partitions
//!   p0 [1, 1.5M)  ─▶ dev0                    p = xxh64(key) mod 4
//!   p1 [1.5M, 3M) ─▶ dev1                    p ─▶ the device holding p
//!   ...  (bounds: each partition's key statistics)
//! ```

use serde::{Deserialize, Serialize};

use crate::{WireError, WireResult};

/// The partitioning format version this build writes and reads.
pub const PARTITIONING_VERSION: u32 = 1;

/// The function from a row's key to its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionScheme {
    /// Contiguous key ranges, ascending with the partition id: every key
    /// of partition `p` is above every key of `p - 1`. A partition's
    /// bounds are its key column's statistics.
    Range,
    /// Partition `xxh64(key, seed 0) mod partitions`, over the key's
    /// canonical bytes (integers as little-endian i64, decimals as i128,
    /// strings as UTF-8); null keys in partition 0.
    Hash,
}

impl PartitionScheme {
    pub fn name(self) -> &'static str {
        match self {
            PartitionScheme::Range => "range",
            PartitionScheme::Hash => "hash",
        }
    }
}

/// A table's partitioning, as recorded with each of its partitions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Partitioning {
    pub version: u32,
    /// Key columns, most significant first.
    pub columns: Vec<String>,
    pub scheme: PartitionScheme,
    /// Partitions of the whole table, over all devices.
    pub partitions: u32,
}

impl Partitioning {
    pub fn new(columns: Vec<String>, scheme: PartitionScheme, partitions: u32) -> Self {
        Self {
            version: PARTITIONING_VERSION,
            columns,
            scheme,
            partitions,
        }
    }

    /// Refuses a partitioning this build cannot use; `what` names where
    /// it was found (a file, a table).
    pub fn check(&self, what: &str) -> WireResult<()> {
        let bad = |reason: String| {
            Err(WireError::Partitioning {
                what: what.to_string(),
                reason,
            })
        };
        if self.version != PARTITIONING_VERSION {
            return bad(format!(
                "unknown partitioning version {} (this build reads {PARTITIONING_VERSION})",
                self.version
            ));
        }
        if self.columns.is_empty() || self.columns.iter().any(|c| c.is_empty()) {
            return bad("partitioned by no column".into());
        }
        if self.partitions == 0 {
            return bad("has 0 partitions".into());
        }
        Ok(())
    }
}

impl std::fmt::Display for Partitioning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} on ({}) into {} partitions",
            self.scheme.name(),
            self.columns.join(", "),
            self.partitions
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_names_what_is_wrong() {
        let p = Partitioning::new(vec!["o_orderkey".into()], PartitionScheme::Range, 4);
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.contains("\"scheme\":\"range\""), "{json}");
        assert_eq!(serde_json::from_str::<Partitioning>(&json).unwrap(), p);
        assert!(p.check("orders").is_ok());
        assert_eq!(p.to_string(), "range on (o_orderkey) into 4 partitions");
        let mut bad = p.clone();
        bad.partitions = 0;
        let e = bad.check("dev1/manifest.json table orders").unwrap_err();
        assert!(
            e.to_string().contains("dev1/manifest.json table orders"),
            "{e}"
        );
        assert!(e.to_string().contains("0 partitions"), "{e}");
        let mut bad = p.clone();
        bad.version = 7;
        assert!(bad
            .check("t")
            .unwrap_err()
            .to_string()
            .contains("version 7"));
        let mut bad = p;
        bad.columns = vec![];
        assert!(bad.check("t").is_err());
    }
}
