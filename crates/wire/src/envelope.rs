//! The stage-plan envelope: what the host sends a device to run.
//!
//! Framing: `ISTP` magic, a little-endian `u32` header length, a JSON header
//! (version, query id, device, the format descriptors of every partition the
//! plan reads), then the plan bytes (a datafusion-proto physical plan).

use serde::{Deserialize, Serialize};

use crate::{FormatDescriptor, WireError, WireResult};

pub const ENVELOPE_MAGIC: &[u8; 4] = b"ISTP";
/// The envelope version this build writes and reads.
pub const ENVELOPE_VERSION: u32 = 1;
/// Largest stage plan a device accepts, in bytes (`plan_bytes_max`).
pub const PLAN_BYTES_MAX: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Header {
    version: u32,
    query_id: String,
    device: u32,
    descriptors: Vec<FormatDescriptor>,
    /// Absent from hosts that predate it: no compression.
    #[serde(default)]
    result_codec: ResultCodec,
}

/// How a device compresses the bodies of its result batches: Arrow IPC
/// body compression, arrow-ipc's own codecs, which the host's decoder
/// reads back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultCodec {
    /// Plain buffers (the device may encode batches where they lie).
    #[default]
    None,
    /// LZ4 frames: fast both ways, for links slower than the codec.
    Lz4Frame,
    /// Zstandard: smaller than LZ4 at several times its CPU cost.
    Zstd,
}

impl ResultCodec {
    pub const ALL: [ResultCodec; 3] = [ResultCodec::None, ResultCodec::Lz4Frame, ResultCodec::Zstd];

    pub fn name(self) -> &'static str {
        match self {
            ResultCodec::None => "none",
            ResultCodec::Lz4Frame => "lz4",
            ResultCodec::Zstd => "zstd",
        }
    }
}

/// A stage plan addressed to one device.
#[derive(Debug, Clone, PartialEq)]
pub struct StagePlanEnvelope {
    pub query_id: String,
    pub device: u32,
    /// Descriptors of every partition the plan reads: the device checks them
    /// against its own manifest and never asks the host how to read its data.
    pub descriptors: Vec<FormatDescriptor>,
    /// How the device compresses its result batches.
    pub result_codec: ResultCodec,
    pub plan: Vec<u8>,
}

impl StagePlanEnvelope {
    pub fn encode(&self) -> Vec<u8> {
        let header = serde_json::to_vec(&Header {
            version: ENVELOPE_VERSION,
            query_id: self.query_id.clone(),
            device: self.device,
            descriptors: self.descriptors.clone(),
            result_codec: self.result_codec,
        })
        .expect("envelope header serializes");
        let mut out = Vec::with_capacity(8 + header.len() + self.plan.len());
        out.extend_from_slice(ENVELOPE_MAGIC);
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&self.plan);
        out
    }

    /// Decodes an envelope, enforcing `max_bytes` on the whole message.
    pub fn decode(bytes: &[u8], max_bytes: usize) -> WireResult<Self> {
        if bytes.len() > max_bytes {
            return Err(WireError::PlanTooLarge {
                size: bytes.len(),
                max: max_bytes,
            });
        }
        if bytes.len() < 8 || &bytes[..4] != ENVELOPE_MAGIC {
            return Err(WireError::Envelope(
                "not a stage plan (bad magic bytes)".into(),
            ));
        }
        let header_len = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
        let header_end = 8usize
            .checked_add(header_len)
            .filter(|end| *end <= bytes.len())
            .ok_or_else(|| {
                WireError::Envelope(format!(
                    "header length {header_len} runs past the end of a {}-byte message",
                    bytes.len()
                ))
            })?;
        let header: Header = serde_json::from_slice(&bytes[8..header_end])
            .map_err(|e| WireError::Envelope(format!("malformed header: {e}")))?;
        if header.version != ENVELOPE_VERSION {
            return Err(WireError::Envelope(format!(
                "unknown envelope version {} (this build reads {ENVELOPE_VERSION})",
                header.version
            )));
        }
        for d in &header.descriptors {
            d.check_version()?;
        }
        Ok(Self {
            query_id: header.query_id,
            device: header.device,
            descriptors: header.descriptors,
            result_codec: header.result_codec,
            plan: bytes[header_end..].to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StagePlanEnvelope {
        StagePlanEnvelope {
            query_id: "q1".into(),
            device: 2,
            descriptors: vec![],
            result_codec: ResultCodec::Lz4Frame,
            plan: vec![1, 2, 3],
        }
    }

    #[test]
    fn an_envelope_without_a_codec_asks_for_none() {
        let header = br#"{"version":1,"query_id":"q","device":0,"descriptors":[]}"#;
        let mut bytes = ENVELOPE_MAGIC.to_vec();
        bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
        bytes.extend_from_slice(header);
        let e = StagePlanEnvelope::decode(&bytes, PLAN_BYTES_MAX).unwrap();
        assert_eq!(e.result_codec, ResultCodec::None);
    }

    #[test]
    fn round_trips() {
        let e = sample();
        assert_eq!(
            StagePlanEnvelope::decode(&e.encode(), PLAN_BYTES_MAX).unwrap(),
            e
        );
    }

    #[test]
    fn rejects_garbage_truncation_and_oversize() {
        let bytes = sample().encode();
        let err = StagePlanEnvelope::decode(b"garbage!garbage", PLAN_BYTES_MAX).unwrap_err();
        assert!(err.to_string().contains("bad magic"), "{err}");
        let err = StagePlanEnvelope::decode(&bytes[..12], PLAN_BYTES_MAX).unwrap_err();
        assert!(err.to_string().contains("runs past the end"), "{err}");
        let err = StagePlanEnvelope::decode(&bytes, 10).unwrap_err();
        assert!(err.to_string().contains("plan_bytes_max=10"), "{err}");
        for cut in 0..bytes.len() {
            // Never panics, whatever the prefix.
            let _ = StagePlanEnvelope::decode(&bytes[..cut], PLAN_BYTES_MAX);
        }
    }
}
