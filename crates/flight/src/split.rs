//! Turning a device's Arrow IPC stream chunks into Flight messages without
//! re-encoding: an IPC stream message is (continuation, length, flatbuffer
//! header, body), and a `FlightData` is exactly (header, body).

use arrow_flight::FlightData;
use bytes::Bytes;
use insitu_host::result_decoder::message_spans;

use crate::error::FlightError;

/// Splits one chunk of an Arrow IPC stream into its messages. The
/// end-of-stream marker (length 0) has no Flight counterpart and is
/// dropped.
pub fn ipc_chunk_to_flight(chunk: &Bytes) -> Result<Vec<FlightData>, FlightError> {
    let spans = message_spans(chunk).map_err(|e| FlightError::Ipc(e.to_string()))?;
    Ok(spans
        .into_iter()
        .filter(|span| !span.header.is_empty())
        .map(|span| FlightData {
            flight_descriptor: None,
            data_header: chunk.slice(span.header),
            app_metadata: Bytes::new(),
            data_body: chunk.slice(span.body),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Float64Array, Int32Array, StringArray, StringViewArray};
    use arrow::record_batch::RecordBatch;
    use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
    use futures::StreamExt;
    use insitu_device::IpcChunker;
    use insitu_kernels::GatherSource;

    fn batch(n: usize) -> RecordBatch {
        let ints: ArrayRef = Arc::new(Int32Array::from_iter(
            (0..n).map(|i| (i % 7 != 3).then_some(i as i32)),
        ));
        let floats: ArrayRef = Arc::new(Float64Array::from_iter_values((0..n).map(|i| {
            if i % 5 == 0 {
                f64::NAN
            } else {
                i as f64 / 3.0
            }
        })));
        let strings: ArrayRef = Arc::new(StringArray::from_iter(
            (0..n).map(|i| (i % 4 != 0).then(|| format!("value number {i}"))),
        ));
        let views: ArrayRef =
            Arc::new(StringViewArray::from_iter((0..n).map(|i| {
                (i % 6 != 1).then(|| format!("a view past twelve bytes, {i}"))
            })));
        RecordBatch::try_from_iter_with_nullable([
            ("i", ints, true),
            ("f", floats, false),
            ("s", strings, true),
            ("v", views, true),
        ])
        .unwrap()
    }

    /// `batch` gathered in reverse by the kernels' `GatherSource`, so that
    /// the chunker encodes it in its arena.
    fn gathered(batch: &RecordBatch) -> RecordBatch {
        let source = GatherSource::new(batch.schema(), std::slice::from_ref(batch)).unwrap();
        let order: Vec<u32> = (0..batch.num_rows() as u32).rev().collect();
        source.gather(&order).unwrap()
    }

    /// The chunks a device sends, split into Flight messages, decode with
    /// arrow-flight's own decoder into the same batches.
    #[tokio::test]
    async fn device_chunks_decode_as_a_flight_stream() {
        let cases = [vec![], vec![1], vec![0, 2, 7], vec![49, 50, 51, 1000]];
        for (sizes, gather) in cases.iter().flat_map(|s| [(s, false), (s, true)]) {
            let input: Vec<RecordBatch> = (sizes.iter())
                .map(|n| match gather {
                    true => gathered(&batch(*n)),
                    false => batch(*n),
                })
                .collect();
            let schema = batch(0).schema();
            let mut chunker = IpcChunker::start(&schema).unwrap();
            let mut chunks = vec![];
            for b in &input {
                chunks.extend(chunker.batch(b).unwrap());
            }
            chunks.push(chunker.finish().unwrap());
            let messages: Vec<FlightData> = chunks
                .iter()
                .flat_map(|c| ipc_chunk_to_flight(c).unwrap())
                .collect();
            let decoder =
                FlightDataDecoder::new(futures::stream::iter(messages.into_iter().map(Ok)));
            let decoded: Vec<RecordBatch> = decoder
                .filter_map(|d| async move {
                    match d.unwrap().payload {
                        DecodedPayload::RecordBatch(b) => Some(b),
                        _ => None,
                    }
                })
                .collect()
                .await;
            assert_eq!(decoded.len(), input.len(), "sizes {sizes:?}");
            for (got, want) in decoded.iter().zip(&input) {
                // NaN != NaN, so compare the IPC-independent debug form.
                assert_eq!(format!("{got:?}"), format!("{want:?}"), "sizes {sizes:?}");
            }
        }
    }

    #[test]
    fn truncated_chunks_are_errors_not_panics() {
        let schema = batch(0).schema();
        let mut chunker = IpcChunker::start(&schema).unwrap();
        let [chunk] = &chunker.batch(&batch(50)).unwrap()[..] else {
            panic!("one chunk for 50 rows")
        };
        for cut in [1, 4, 7, 9, chunk.len() / 2, chunk.len() - 1] {
            let err = ipc_chunk_to_flight(&chunk.slice(..cut))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("cut short") || err.contains("header"),
                "{cut}: {err}"
            );
        }
        assert!(ipc_chunk_to_flight(&Bytes::from_static(&[0xFF; 12])).is_err());
    }
}
