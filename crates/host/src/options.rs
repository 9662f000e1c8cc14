//! insitu's session options, under the `insitu.` prefix of DataFusion's
//! configuration: `SET insitu.join_strategy = 'sort_merge'` in SQL.

use std::fmt;
use std::str::FromStr;

use datafusion::common::config::{ConfigExtension, ConfigField, Visit};
use datafusion::common::{extensions_options, DataFusionError, Result};
use insitu_wire::ResultCodec;

extensions_options! {
    /// Options of an insitu host session.
    pub struct InsituOptions {
        /// How the host runs equi-joins: `auto` (hash joins, and sort-merge
        /// joins, which spill, where a build side would not fit the host
        /// budget), `hash`, or `sort_merge`.
        pub join_strategy: JoinChoice, default = JoinChoice::Auto
        /// The host's memory budget in bytes (`host_mem_bytes_max`), as the
        /// session was started with; the join rule weighs build sides against it.
        pub host_mem_bytes_max: usize, default = 0
        /// How devices compress their result batches: `auto` (as the cost
        /// model chooses per scan; LZ4 over links slower than
        /// `COMPRESS_BELOW_LINK_BYTES_PER_SEC` for stages it does not
        /// price), `none`, `lz4` or `zstd`.
        pub result_compression: CompressionChoice, default = CompressionChoice::Auto
        /// Whether the planner reorders inner joins by estimated sizes
        /// (see `insitu_host::reorder`); `false` keeps the written order.
        pub reorder_joins: bool, default = true
    }
}

impl ConfigExtension for InsituOptions {
    const PREFIX: &'static str = "insitu";
}

/// How the host runs equi-joins (`insitu.join_strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum JoinChoice {
    /// Hash joins, and sort-merge joins where a build side would not fit.
    #[default]
    Auto,
    Hash,
    SortMerge,
}

impl JoinChoice {
    pub const ALL: [JoinChoice; 3] = [JoinChoice::Auto, JoinChoice::Hash, JoinChoice::SortMerge];

    pub fn name(self) -> &'static str {
        match self {
            JoinChoice::Auto => "auto",
            JoinChoice::Hash => "hash",
            JoinChoice::SortMerge => "sort_merge",
        }
    }
}

impl fmt::Display for JoinChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for JoinChoice {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|c| c.name() == wanted)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|c| c.name()).collect();
                DataFusionError::Configuration(format!(
                    "insitu.join_strategy must be one of {}, not '{s}'",
                    names.join(", ")
                ))
            })
    }
}

/// A session setting read by name: set parses it ([`FromStr`]), reset
/// restores its default, and it shows as its name ([`fmt::Display`]).
macro_rules! config_field_by_name {
    ($t:ty) => {
        impl ConfigField for $t {
            fn visit<V: Visit>(&self, v: &mut V, key: &str, description: &'static str) {
                v.some(key, self, description)
            }

            fn set(&mut self, _key: &str, value: &str) -> Result<()> {
                *self = value.parse()?;
                Ok(())
            }

            fn reset(&mut self, _key: &str) -> Result<()> {
                *self = <$t>::default();
                Ok(())
            }
        }
    };
}

config_field_by_name!(JoinChoice);

/// How devices compress their results (`insitu.result_compression`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CompressionChoice {
    /// By the link's rate, see [`CompressionChoice::codec_for`].
    #[default]
    Auto,
    Fixed(ResultCodec),
}

/// Link rate below which `auto` compresses results with LZ4
/// (`compress_below_link_bytes_per_sec`): 1 GbE and slower links. At
/// TPC-H SF1 on 4 embedded devices (`insitu sql "set
/// insitu.result_compression = 'lz4'; <query>" --link 1gbe`), Q3 took
/// 0.48 s instead of 1.37 s and moved 37 MiB instead of 141 MiB; over
/// 10 GbE it took 0.37 s instead of 0.24 s, the codec costing more than
/// the bytes it saves. Stages the placement rule prices get their codec
/// from the cost model instead (`insitu_host::placement`); this rate
/// decides for the others.
pub const COMPRESS_BELOW_LINK_BYTES_PER_SEC: f64 = 500e6;

impl CompressionChoice {
    /// The codec for a link of `bytes_per_sec` (`None`: unlimited).
    pub fn codec_for(self, bytes_per_sec: Option<f64>) -> ResultCodec {
        match self {
            CompressionChoice::Fixed(codec) => codec,
            CompressionChoice::Auto => match bytes_per_sec {
                Some(rate) if rate < COMPRESS_BELOW_LINK_BYTES_PER_SEC => ResultCodec::Lz4Frame,
                _ => ResultCodec::None,
            },
        }
    }

    fn name(self) -> &'static str {
        match self {
            CompressionChoice::Auto => "auto",
            CompressionChoice::Fixed(codec) => codec.name(),
        }
    }
}

impl fmt::Display for CompressionChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CompressionChoice {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase();
        if wanted == "auto" {
            return Ok(CompressionChoice::Auto);
        }
        ResultCodec::ALL
            .into_iter()
            .find(|c| c.name() == wanted)
            .map(CompressionChoice::Fixed)
            .ok_or_else(|| {
                DataFusionError::Configuration(format!(
                    "insitu.result_compression must be one of auto, none, lz4, zstd, not '{s}'"
                ))
            })
    }
}

config_field_by_name!(CompressionChoice);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_strategies_parse_by_name_and_others_are_refused() {
        for c in JoinChoice::ALL {
            assert_eq!(c.name().parse::<JoinChoice>().unwrap(), c);
        }
        assert_eq!(
            " Sort_Merge ".parse::<JoinChoice>().unwrap(),
            JoinChoice::SortMerge
        );
        let e = "grace".parse::<JoinChoice>().unwrap_err().to_string();
        assert!(e.contains("auto, hash, sort_merge"), "{e}");
    }

    #[test]
    fn result_compression_follows_the_link_unless_set() {
        let auto = CompressionChoice::Auto;
        assert_eq!(auto.codec_for(Some(125e6)), ResultCodec::Lz4Frame);
        assert_eq!(auto.codec_for(Some(1.2e9)), ResultCodec::None);
        assert_eq!(auto.codec_for(None), ResultCodec::None);
        let zstd: CompressionChoice = " ZSTD ".parse().unwrap();
        assert_eq!(zstd.codec_for(None), ResultCodec::Zstd);
        assert_eq!(
            "none".parse::<CompressionChoice>().unwrap().to_string(),
            "none"
        );
        let e = "snappy"
            .parse::<CompressionChoice>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("auto, none, lz4, zstd"), "{e}");
    }
}
