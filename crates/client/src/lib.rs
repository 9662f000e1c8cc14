//! The device-client contract: how a host reaches a device
//! ([`DeviceClient`]), what a device answers a stage with
//! ([`DeviceMessage`]), and the Arrow IPC framing of those answers.
//!
//! ```text
//!   host (insitu-host) ──▶ dyn DeviceClient ──┬─ EmbeddedClient (insitu-device, in process)
//!                                            └─ FlightDeviceClient (insitu-flight, over the network)
//! ```
//!
//! The host depends on this crate and never on a device's: every
//! implementation crosses the device's [`Link`], which meters and
//! throttles what passes, so embedded devices exchange bytes just as
//! device servers do.

use std::ops::Range;
use std::sync::Arc;

use arrow::error::ArrowError;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use datafusion::common::Result;
use futures::stream::BoxStream;
use insitu_link::Link;
use insitu_wire::{
    Capabilities, DeviceStats, FormatDescriptor, Manifest, SampleKeysRequest, SortTableRequest,
    StageStats,
};

/// A device as the host sees it.
#[async_trait]
pub trait DeviceClient: Send + Sync + std::fmt::Debug {
    fn id(&self) -> u32;
    /// How errors and logs name the device (`device 2 at 10.0.0.7:7001`).
    fn name(&self) -> String {
        format!("device {}", self.id())
    }
    fn link(&self) -> &Arc<Link>;
    /// Whether the device runs in this process (its memory is the host's).
    fn in_process(&self) -> bool {
        false
    }
    /// What the device advertised when the host connected.
    fn capabilities(&self) -> &Capabilities;
    /// The device's counters since it started.
    async fn stats(&self) -> Result<DeviceStats>;
    /// The device's manifest.
    async fn manifest(&self) -> Result<Manifest>;
    /// Sends an encoded stage plan envelope and streams the answer.
    async fn execute(&self, envelope: Vec<u8>)
        -> Result<BoxStream<'static, Result<DeviceMessage>>>;
    /// Reads a byte range of a partition file (pull mode).
    async fn read_range(&self, table: &str, partition: u32, range: Range<u64>) -> Result<Bytes>;
    /// Bytes the device has read from its storage so far.
    fn storage_bytes_read(&self) -> u64;
    /// Evenly spaced rows of some columns of a table (sort jobs pick
    /// range splitters from them).
    async fn sample_keys(&self, request: &SampleKeysRequest) -> Result<RecordBatch>;
    /// Sorts the device's partitions of a table into a new table (the
    /// device's part of a sort job); returns the partitions written.
    async fn sort_table(&self, request: &SortTableRequest) -> Result<Vec<FormatDescriptor>>;
}

/// What a device sends back for a stage plan.
#[derive(Debug, Clone)]
pub enum DeviceMessage {
    /// Part of the Arrow IPC result stream.
    Ipc(Bytes),
    /// A result batch a network client has already decoded from its wire
    /// form (Arrow Flight); devices themselves only produce `Ipc`.
    Batch(RecordBatch),
    /// The stage finished; nothing follows.
    Done(StageStats),
}

/// Marks a message prefix in the IPC stream format.
pub const IPC_CONTINUATION: u32 = 0xFFFF_FFFF;

/// Bytes a small request or control message is counted as on the link.
pub const REQUEST_HEADER_BYTES: usize = 64;

/// One batch as a complete Arrow IPC stream (small answers: key samples).
pub fn batch_to_ipc(batch: &RecordBatch) -> Result<Vec<u8>, ArrowError> {
    let mut writer = StreamWriter::try_new(Vec::new(), &batch.schema())?;
    writer.write(batch)?;
    writer.finish()?;
    writer.into_inner()
}

/// The batches of an Arrow IPC stream, concatenated into one (a stream
/// of one batch is that batch, not a copy of it).
pub fn ipc_to_batch(bytes: &[u8]) -> Result<RecordBatch, ArrowError> {
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
    let schema = reader.schema();
    let mut batches = reader.collect::<Result<Vec<_>, _>>()?;
    if batches.len() == 1 {
        return Ok(batches.swap_remove(0));
    }
    arrow::compute::concat_batches(&schema, &batches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    fn batch(rows: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let n = Int64Array::from_iter((0..rows).map(|i| (i % 3 != 0).then_some(i)));
        let s = StringArray::from_iter((0..rows).map(|i| (i % 5 != 0).then(|| format!("v{i}"))));
        RecordBatch::try_new(schema, vec![Arc::new(n), Arc::new(s)]).unwrap()
    }

    #[test]
    fn a_batch_round_trips_through_one_ipc_stream() {
        for rows in [0, 1, 2, 7, 49, 50, 51, 4096] {
            let b = batch(rows);
            let bytes = batch_to_ipc(&b).unwrap();
            assert_eq!(
                u32::from_le_bytes(bytes[..4].try_into().unwrap()),
                IPC_CONTINUATION
            );
            assert_eq!(ipc_to_batch(&bytes).unwrap(), b, "{rows} rows");
        }
    }

    #[test]
    fn a_damaged_stream_is_an_error() {
        let bytes = batch_to_ipc(&batch(10)).unwrap();
        assert!(ipc_to_batch(&bytes[..bytes.len() / 2]).is_err());
        assert!(ipc_to_batch(b"not arrow").is_err());
    }
}
