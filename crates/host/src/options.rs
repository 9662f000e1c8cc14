//! insitu's session options, under the `insitu.` prefix of DataFusion's
//! configuration: `SET insitu.join_strategy = 'sort_merge'` in SQL.

use std::fmt;
use std::str::FromStr;

use datafusion::common::config::{ConfigExtension, ConfigField, Visit};
use datafusion::common::{extensions_options, DataFusionError, Result};

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

impl ConfigField for JoinChoice {
    fn visit<V: Visit>(&self, v: &mut V, key: &str, description: &'static str) {
        v.some(key, self, description)
    }

    fn set(&mut self, _key: &str, value: &str) -> Result<()> {
        *self = value.parse()?;
        Ok(())
    }

    fn reset(&mut self, _key: &str) -> Result<()> {
        *self = JoinChoice::default();
        Ok(())
    }
}

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
}
