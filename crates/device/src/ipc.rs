//! Arrow IPC stream encoding of stage results, one message per batch.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;

/// Encodes a result stream chunk by chunk: the first chunk carries the
/// schema, each following one a batch, the last the end-of-stream marker.
/// Concatenated, the chunks are one valid Arrow IPC stream.
pub struct IpcChunker {
    writer: StreamWriter<Vec<u8>>,
}

impl IpcChunker {
    /// Starts a stream; returns the chunker and the schema chunk.
    pub fn start(schema: &SchemaRef) -> Result<(Self, Bytes), ArrowError> {
        let mut writer = StreamWriter::try_new(Vec::new(), schema)?;
        let head = Bytes::from(std::mem::take(writer.get_mut()));
        Ok((Self { writer }, head))
    }

    pub fn batch(&mut self, batch: &RecordBatch) -> Result<Bytes, ArrowError> {
        let batch = compact_views(batch)?;
        // Sized up front: growing by doubling copies the message about once
        // more and touches twice the fresh memory.
        *self.writer.get_mut() = Vec::with_capacity(encoded_size_hint(&batch));
        self.writer.write(&batch)?;
        Ok(Bytes::from(std::mem::take(self.writer.get_mut())))
    }

    pub fn finish(mut self) -> Result<Bytes, ArrowError> {
        self.writer.finish()?;
        Ok(Bytes::from(std::mem::take(self.writer.get_mut())))
    }
}

/// At least the bytes of `batch`'s IPC message: the bytes its rows use in
/// every buffer, plus padding per buffer and room for the header.
fn encoded_size_hint(batch: &RecordBatch) -> usize {
    /// Flatbuffer header, message prefix and schema-independent slack.
    const HEADER_BYTES: usize = 1 << 12;
    /// IPC pads every buffer to 64 bytes, and describes each in the header.
    const BYTES_PER_BUFFER: usize = 64 + 32;
    batch
        .columns()
        .iter()
        .map(|c| {
            let data = c.to_data();
            let buffers = count_buffers(&data);
            // The slice size leaves out the data buffers views point into.
            let view_data: usize = match data.data_type() {
                DataType::Utf8View | DataType::BinaryView => {
                    data.buffers()[1..].iter().map(|b| b.len()).sum()
                }
                _ => 0,
            };
            data.get_slice_memory_size().unwrap_or(0) + view_data + buffers * BYTES_PER_BUFFER
        })
        .sum::<usize>()
        + HEADER_BYTES
}

/// Buffers of `data` and its children, validity included.
fn count_buffers(data: &arrow::array::ArrayData) -> usize {
    1 + data.buffers().len() + data.child_data().iter().map(count_buffers).sum::<usize>()
}

/// Rewrites string and binary view columns whose data buffers hold far more
/// than the rows reference. IPC ships whole buffers, so a 5-row slice of an
/// 8192-row batch would otherwise cross the link with all 8192 rows' bytes.
pub fn compact_views(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let wasteful = |a: &ArrayRef| -> bool {
        let (buffers, used): (usize, usize) = match a.data_type() {
            DataType::Utf8View => {
                let v = a.as_string_view();
                (
                    v.data_buffers().iter().map(|b| b.len()).sum(),
                    referenced_bytes(v.views()),
                )
            }
            DataType::BinaryView => {
                let v = a.as_binary_view();
                (
                    v.data_buffers().iter().map(|b| b.len()).sum(),
                    referenced_bytes(v.views()),
                )
            }
            _ => return false,
        };
        buffers > 2 * used + 4096
    };
    if !batch.columns().iter().any(wasteful) {
        return Ok(batch.clone());
    }
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|a| match a.data_type() {
            DataType::Utf8View if wasteful(a) => Arc::new(a.as_string_view().gc()) as ArrayRef,
            DataType::BinaryView if wasteful(a) => Arc::new(a.as_binary_view().gc()) as ArrayRef,
            _ => Arc::clone(a),
        })
        .collect();
    RecordBatch::try_new(batch.schema(), columns)
}

/// Bytes of the data buffers that views point at (values over 12 bytes;
/// shorter ones are inlined in the view).
fn referenced_bytes(views: &[u128]) -> usize {
    views
        .iter()
        .map(|v| *v as u32 as usize)
        .filter(|len| *len > 12)
        .sum()
}

/// One batch as a complete Arrow IPC stream (small answers: key samples).
pub fn batch_to_ipc(batch: &RecordBatch) -> Result<Vec<u8>, ArrowError> {
    let mut writer = StreamWriter::try_new(Vec::new(), &batch.schema())?;
    writer.write(batch)?;
    writer.finish()?;
    writer.into_inner()
}

/// The batches of an Arrow IPC stream, concatenated into one.
pub fn ipc_to_batch(bytes: &[u8]) -> Result<RecordBatch, ArrowError> {
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    arrow::compute::concat_batches(&schema, &batches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringViewArray;
    use arrow::datatypes::{Field, Schema};

    #[test]
    fn slices_of_view_columns_ship_only_their_bytes() {
        let values: Vec<String> = (0..8192)
            .map(|i| format!("a fairly long comment number {i}"))
            .collect();
        let array = StringViewArray::from_iter_values(values.iter());
        let schema = Arc::new(Schema::new(vec![Field::new(
            "c",
            DataType::Utf8View,
            false,
        )]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(array)]).unwrap();
        let slice = batch.slice(10, 5);
        let (mut chunker, _) = IpcChunker::start(&schema).unwrap();
        let bytes = chunker.batch(&slice).unwrap();
        assert!(bytes.len() < 2_000, "{} bytes for 5 rows", bytes.len());
        let compacted = compact_views(&slice).unwrap();
        assert_eq!(
            compacted.column(0).as_string_view().value(0),
            "a fairly long comment number 10"
        );
        // Nothing to gain: returned as is.
        let whole = compact_views(&batch).unwrap();
        assert_eq!(
            whole.column(0).as_string_view().data_buffers().len(),
            batch.column(0).as_string_view().data_buffers().len()
        );
    }

    /// The chunk buffer is sized once: the hint covers the whole message
    /// for every column kind a stage emits, sliced or not.
    #[test]
    fn size_hint_covers_the_encoded_message() {
        use arrow::array::{
            BooleanArray, Decimal128Array, DictionaryArray, Int32Array, Int64Array, StringArray,
        };
        let n: usize = 5000;
        let views: StringViewArray = (0..n)
            .map(|i| (i % 3 != 0).then(|| format!("value {i} that is longer than twelve")))
            .collect();
        let keys = Int32Array::from_iter((0..n as i32).map(|i| (i % 5 != 0).then_some(i % 4)));
        let dict = DictionaryArray::new(
            keys,
            Arc::new(StringArray::from(vec!["a", "bb", "ccc", "dddd"])),
        );
        let columns: Vec<(&str, ArrayRef)> = vec![
            (
                "i",
                Arc::new(Int64Array::from_iter(
                    (0..n as i64).map(|i| (i % 7 != 0).then_some(i)),
                )),
            ),
            (
                "d",
                Arc::new(
                    Decimal128Array::from_iter_values((0..n).map(|i| i as i128))
                        .with_precision_and_scale(15, 2)
                        .unwrap(),
                ),
            ),
            (
                "b",
                Arc::new(BooleanArray::from_iter((0..n).map(|i| Some(i % 2 == 0)))),
            ),
            (
                "s",
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("s{i}")),
                )),
            ),
            ("v", Arc::new(views)),
            ("k", Arc::new(dict)),
        ];
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        for (at, len) in [(0, n), (0, 1), (17, 999), (n - 3, 3), (0, 0)] {
            let slice = compact_views(&batch.slice(at, len)).unwrap();
            let (mut chunker, _) = IpcChunker::start(&batch.schema()).unwrap();
            let chunk = chunker.batch(&slice).unwrap();
            let hint = encoded_size_hint(&slice);
            assert!(
                chunk.len() <= hint,
                "{} bytes encoded, {hint} hinted (rows {at}..+{len})",
                chunk.len()
            );
            assert!(
                hint < 2 * chunk.len() + (16 << 10),
                "hint {hint} far above {} (rows {at}..+{len})",
                chunk.len()
            );
        }
    }
}
