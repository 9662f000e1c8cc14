//! Performance profiles: how fast a device (or the host) reads and
//! computes, as the cost model needs it.
//!
//! A profile is a JSON file a user can read and edit
//! (`<device dir>/profile.json`, `<root>/host-profile.json`); device
//! servers send theirs in [`crate::Capabilities`]. Every rate is per
//! thread unless its name says otherwise, and must be finite and
//! positive ([`ComputeRates::validate`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{WireError, WireResult};

/// Version of the profile format; a file of another version is measured again.
pub const PROFILE_VERSION: u32 = 4;

/// File name of a device's profile inside its directory.
pub const DEVICE_PROFILE_FILE: &str = "profile.json";

/// File name of the host's profile inside a root.
pub const HOST_PROFILE_FILE: &str = "host-profile.json";

/// Groups up to which an aggregate counts as one into few groups.
pub const FEW_GROUPS_MAX: u64 = 1024;

/// Per-thread rates of the operators a stage runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputeRates {
    /// Decoding Parquet into Arrow costs a time per value and a time per
    /// stored byte (a dictionary-encoded column has few bytes per value,
    /// a plain one many). Fixed-width values (ints, decimals, dates,
    /// floats) decoded per second, apart from their bytes:
    pub decode_fixed_values_per_sec: f64,
    /// Stored bytes of fixed-width columns decoded per second, apart from
    /// their values.
    pub decode_fixed_bytes_per_sec: f64,
    /// Strings decoded per second, apart from their bytes.
    pub decode_string_values_per_sec: f64,
    /// Stored bytes of string columns decoded per second, apart from
    /// their values.
    pub decode_string_bytes_per_sec: f64,
    /// Rows a comparison predicate is evaluated on, per second.
    pub filter_rows_per_sec: f64,
    /// Input rows of one aggregate function (a sum) into few groups (up
    /// to [`FEW_GROUPS_MAX`]), per second.
    pub aggregate_rows_per_sec: f64,
    /// Input rows of one aggregate function into many groups, per second.
    pub aggregate_many_groups_rows_per_sec: f64,
    /// Rows sorted on one fixed-width key, per second.
    pub sort_rows_per_sec: f64,
    /// Arrow bytes written as Arrow IPC, per second.
    pub ipc_encode_bytes_per_sec: f64,
    /// Arrow IPC bytes read back into Arrow, per second.
    pub ipc_decode_bytes_per_sec: f64,
    /// Arrow bytes compressed with LZ4 frame, per second.
    pub lz4_compress_bytes_per_sec: f64,
    /// Arrow bytes compressed with Zstandard (arrow-ipc's level), per second.
    pub zstd_compress_bytes_per_sec: f64,
    /// Stages started per second: planning a stage and opening its file,
    /// what a stage costs before its first row.
    pub stages_started_per_sec: f64,
}

impl ComputeRates {
    fn named(&self) -> [(&'static str, f64); 13] {
        [
            (
                "decode_fixed_values_per_sec",
                self.decode_fixed_values_per_sec,
            ),
            (
                "decode_fixed_bytes_per_sec",
                self.decode_fixed_bytes_per_sec,
            ),
            (
                "decode_string_values_per_sec",
                self.decode_string_values_per_sec,
            ),
            (
                "decode_string_bytes_per_sec",
                self.decode_string_bytes_per_sec,
            ),
            ("filter_rows_per_sec", self.filter_rows_per_sec),
            ("aggregate_rows_per_sec", self.aggregate_rows_per_sec),
            (
                "aggregate_many_groups_rows_per_sec",
                self.aggregate_many_groups_rows_per_sec,
            ),
            ("sort_rows_per_sec", self.sort_rows_per_sec),
            ("ipc_encode_bytes_per_sec", self.ipc_encode_bytes_per_sec),
            ("ipc_decode_bytes_per_sec", self.ipc_decode_bytes_per_sec),
            (
                "lz4_compress_bytes_per_sec",
                self.lz4_compress_bytes_per_sec,
            ),
            (
                "zstd_compress_bytes_per_sec",
                self.zstd_compress_bytes_per_sec,
            ),
            ("stages_started_per_sec", self.stages_started_per_sec),
        ]
    }

    /// Every rate finite and positive; the error names the first that is not.
    pub fn validate(&self) -> WireResult<()> {
        for (name, value) in self.named() {
            positive(name, value)?;
        }
        Ok(())
    }
}

fn positive(name: &str, value: f64) -> WireResult<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(WireError::Invalid(format!(
            "profile: {name} must be a positive number, found {value}"
        )))
    }
}

/// What one device can do per second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceProfile {
    pub version: u32,
    /// Bytes per second the device reads from its storage (all threads).
    pub storage_read_bytes_per_sec: f64,
    /// Threads the device computes with.
    pub threads: u32,
    pub rates: ComputeRates,
    /// How the numbers came about: `measured` (by calibration, with the
    /// Unix time), or whatever a user who edited them wrote.
    pub source: String,
}

impl DeviceProfile {
    pub fn validate(&self) -> WireResult<()> {
        check_version(self.version)?;
        positive(
            "storage_read_bytes_per_sec",
            self.storage_read_bytes_per_sec,
        )?;
        positive("threads", f64::from(self.threads))?;
        self.rates.validate()
    }

    /// Parses and validates a profile file's text.
    pub fn from_json(text: &str) -> WireResult<Self> {
        parse(text, Self::validate)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("profile serializes")
    }
}

fn check_version(version: u32) -> WireResult<()> {
    if version == PROFILE_VERSION {
        return Ok(());
    }
    Err(WireError::Invalid(format!(
        "profile: version {version} where {PROFILE_VERSION} is expected"
    )))
}

fn parse<T: serde::de::DeserializeOwned>(
    text: &str,
    validate: fn(&T) -> WireResult<()>,
) -> WireResult<T> {
    let profile: T =
        serde_json::from_str(text).map_err(|e| WireError::Invalid(format!("profile: {e}")))?;
    validate(&profile)?;
    Ok(profile)
}

/// What the host can do per second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostProfile {
    pub version: u32,
    /// Threads the host computes with.
    pub threads: u32,
    pub rates: ComputeRates,
    pub source: String,
    /// What starting a stage costs end to end through this root's devices,
    /// per link profile name (`1gbe`, `unlimited`, ...): measured by the
    /// host on the first session over that link.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stage_starts: BTreeMap<String, StageStarts>,
}

impl HostProfile {
    pub fn validate(&self) -> WireResult<()> {
        check_version(self.version)?;
        positive("threads", f64::from(self.threads))?;
        self.rates.validate()?;
        for (link, starts) in &self.stage_starts {
            starts
                .validate()
                .map_err(|e| WireError::Invalid(format!("{e} (stage_starts.{link})")))?;
        }
        Ok(())
    }

    /// Parses and validates a profile file's text.
    pub fn from_json(text: &str) -> WireResult<Self> {
        parse(text, Self::validate)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("profile serializes")
    }
}

/// What a stage costs before its first row, end to end: the host plans
/// it, sends it or opens the devices' files, and the devices plan and
/// open theirs. Linear in the stage's device count.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StageStarts {
    /// A pushed stage: the host's request and the devices' plans.
    pub push: StartCost,
    /// A pulled stage: the host opening each device's files over the link.
    pub pull: StartCost,
}

impl StageStarts {
    pub fn validate(&self) -> WireResult<()> {
        self.push.validate("push")?;
        self.pull.validate("pull")
    }
}

/// Seconds a stage start takes on `devices` devices:
/// `once_secs + per_device_secs * devices`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StartCost {
    pub once_secs: f64,
    pub per_device_secs: f64,
}

impl StartCost {
    /// Seconds of a start on `devices` devices.
    pub fn secs(&self, devices: usize) -> f64 {
        self.once_secs + self.per_device_secs * devices as f64
    }

    fn validate(&self, name: &str) -> WireResult<()> {
        for (part, value) in [
            ("once_secs", self.once_secs),
            ("per_device_secs", self.per_device_secs),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(WireError::Invalid(format!(
                    "profile: {name}.{part} must be a number of seconds at least 0, found {value}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates() -> ComputeRates {
        ComputeRates {
            decode_fixed_values_per_sec: 4e8,
            decode_fixed_bytes_per_sec: 2e9,
            decode_string_values_per_sec: 5e7,
            decode_string_bytes_per_sec: 1e9,
            filter_rows_per_sec: 5e8,
            aggregate_rows_per_sec: 1e8,
            aggregate_many_groups_rows_per_sec: 2e7,
            sort_rows_per_sec: 2e7,
            ipc_encode_bytes_per_sec: 4e9,
            ipc_decode_bytes_per_sec: 8e9,
            lz4_compress_bytes_per_sec: 1e9,
            zstd_compress_bytes_per_sec: 3e8,
            stages_started_per_sec: 1e3,
        }
    }

    #[test]
    fn a_profile_round_trips_through_its_file_text() {
        let p = DeviceProfile {
            version: PROFILE_VERSION,
            storage_read_bytes_per_sec: 2e9,
            threads: 2,
            rates: rates(),
            source: "measured".into(),
        };
        assert_eq!(DeviceProfile::from_json(&p.to_json()).unwrap(), p);
    }

    #[test]
    fn a_bad_rate_is_named() {
        let mut p = HostProfile {
            version: PROFILE_VERSION,
            threads: 2,
            rates: rates(),
            source: "edited".into(),
            stage_starts: BTreeMap::new(),
        };
        p.rates.filter_rows_per_sec = -1.0;
        let err = HostProfile::from_json(&p.to_json())
            .unwrap_err()
            .to_string();
        assert!(err.contains("filter_rows_per_sec"), "{err}");
        let err = HostProfile::from_json("{\"version\": 1").unwrap_err();
        assert!(err.to_string().contains("profile"), "{err}");
        p.rates.filter_rows_per_sec = 1.0;
        p.version = 7;
        let err = HostProfile::from_json(&p.to_json())
            .unwrap_err()
            .to_string();
        assert!(err.contains("version 7"), "{err}");
    }

    #[test]
    fn stage_starts_round_trip_and_a_negative_one_is_named() {
        let cost = StartCost {
            once_secs: 1e-3,
            per_device_secs: 5e-4,
        };
        assert_eq!(cost.secs(4), 3e-3);
        let mut p = HostProfile {
            version: PROFILE_VERSION,
            threads: 2,
            rates: rates(),
            source: "measured".into(),
            stage_starts: BTreeMap::from([(
                "1gbe".to_string(),
                StageStarts {
                    push: cost,
                    pull: cost,
                },
            )]),
        };
        assert_eq!(HostProfile::from_json(&p.to_json()).unwrap(), p);
        p.stage_starts.get_mut("1gbe").unwrap().pull.per_device_secs = -1.0;
        let err = HostProfile::from_json(&p.to_json())
            .unwrap_err()
            .to_string();
        assert!(err.contains("pull.per_device_secs"), "{err}");
        assert!(err.contains("stage_starts.1gbe"), "{err}");
    }
}
