//! Arrow IPC stream encoding of stage results, one message per batch.

use std::sync::Arc;

use arrow::array::{Array, ArrayData, ArrayRef, AsArray};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc::writer::{StreamEncoder, StreamWriter};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use insitu_kernels::mem::{pooled_buffer, take_vec};
use insitu_kernels::shrink_views;

/// Encodes a result stream chunk by chunk: each chunk carries one batch
/// (the first also the schema, and any dictionaries the batch needs), the
/// last the end-of-stream marker (and the schema, if no batch came).
/// Concatenated, the chunks are one valid Arrow IPC stream.
pub struct IpcChunker {
    encoder: StreamEncoder,
}

impl IpcChunker {
    pub fn start(schema: &SchemaRef) -> Result<Self, ArrowError> {
        Ok(Self {
            encoder: StreamEncoder::try_new(schema)?,
        })
    }

    /// The chunks of `batch`: one, or as many as keep each within
    /// [`RESULT_CHUNK_BYTES_MAX`] (halving the rows until they fit, down
    /// to one row).
    pub fn batch(&mut self, batch: &RecordBatch) -> Result<Vec<Bytes>, ArrowError> {
        let mut chunks = vec![];
        self.push_chunks(batch, &mut chunks)?;
        Ok(chunks)
    }

    fn push_chunks(&mut self, batch: &RecordBatch, out: &mut Vec<Bytes>) -> Result<(), ArrowError> {
        let batch = shrink_view_columns(batch)?;
        let rows = batch.num_rows();
        if rows > 1 && shipped_bytes(&batch) > RESULT_CHUNK_BYTES_MAX {
            self.push_chunks(&batch.slice(0, rows / 2), out)?;
            return self.push_chunks(&batch.slice(rows / 2, rows - rows / 2), out);
        }
        out.push(contiguous(self.encoder.encode(&batch)?));
        Ok(())
    }

    pub fn finish(self) -> Result<Bytes, ArrowError> {
        Ok(contiguous(self.encoder.finish()?))
    }
}

/// Most bytes of batch data one result chunk carries
/// (`result_chunk_bytes_max`): a quarter of the largest gRPC message
/// (`grpc_message_bytes_max`, 64 MiB), so that a batch of wide rows still
/// crosses a network link.
pub const RESULT_CHUNK_BYTES_MAX: usize = 16 << 20;

/// The bytes IPC ships for `batch`'s rows: for view columns their views
/// and every data buffer (IPC ships those whole), for the rest the
/// bytes of their rows ([`ArrayData::get_slice_memory_size`]), so that
/// a slice counts less than its batch.
fn shipped_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| array_bytes(&c.to_data()))
        .sum()
}

fn array_bytes(data: &ArrayData) -> usize {
    match data.data_type() {
        DataType::Utf8View | DataType::BinaryView => {
            let buffers: usize = data.buffers()[1..].iter().map(|b| b.len()).sum();
            data.len() * 16 + data.len().div_ceil(8) + buffers
        }
        _ => data
            .get_slice_memory_size()
            .unwrap_or_else(|_| data.get_buffer_memory_size()),
    }
}

/// The encoder's pieces (headers, padding, and the batch's own buffers,
/// shared rather than copied) as one chunk: a single copy of the body
/// into memory allocated once at its final size. `StreamWriter` copies
/// the body twice, into an encode buffer and then into its writer.
///
/// The chunk's memory comes from the kernels' scratch pool and returns to
/// it when the host drops the last array decoded from it (the host
/// decodes without copying), so a long result reuses the same few
/// already-faulted chunks instead of zeroing fresh pages for each one.
fn contiguous(pieces: Vec<Buffer>) -> Bytes {
    let mut out: Vec<u8> = take_vec(pieces.iter().map(|p| p.len()).sum());
    for piece in &pieces {
        out.extend_from_slice(piece);
    }
    Bytes::from_owner(BufferBytes(pooled_buffer(out)))
}

/// An Arrow buffer as the owner of a `Bytes`.
pub(crate) struct BufferBytes(pub(crate) Buffer);

impl AsRef<[u8]> for BufferBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Rewrites string and binary view columns so that their data buffers hold
/// little more than the rows reference (the kernels' `shrink_views`). IPC
/// ships whole buffers, so a 5-row slice of an 8192-row batch would
/// otherwise cross the link with all 8192 rows' bytes, and a gathered
/// batch with every source batch's buffers. Buffers listed more than once
/// (a dictionary page's, once per source batch) are listed once; only if
/// what is left still holds far more than the rows use are the strings
/// copied.
pub fn shrink_view_columns(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let is_view = |a: &ArrayRef| matches!(a.data_type(), DataType::Utf8View | DataType::BinaryView);
    if !batch.columns().iter().any(is_view) {
        return Ok(batch.clone());
    }
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|a| match a.data_type() {
            DataType::Utf8View => Arc::new(shrink_views(a.as_string_view())) as _,
            DataType::BinaryView => Arc::new(shrink_views(a.as_binary_view())) as _,
            _ => Arc::clone(a),
        })
        .collect();
    RecordBatch::try_new(batch.schema(), columns)
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

    fn one_chunk(chunks: Vec<Bytes>) -> Bytes {
        assert_eq!(chunks.len(), 1, "one chunk");
        chunks.into_iter().next().unwrap()
    }

    /// A batch of wide rows goes out in chunks within the limit, which
    /// read back as the batch's rows; a batch within it stays whole.
    #[test]
    fn wide_batches_ship_in_chunks_within_the_limit() {
        let row = "x".repeat(1 << 20);
        let rows = 40;
        let array = StringViewArray::from_iter_values(std::iter::repeat_n(row.as_str(), rows));
        let schema = Arc::new(Schema::new(vec![Field::new(
            "c",
            DataType::Utf8View,
            false,
        )]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(array)]).unwrap();
        let mut chunker = IpcChunker::start(&schema).unwrap();
        let chunks = chunker.batch(&batch).unwrap();
        assert!(chunks.len() >= 3, "{} chunks", chunks.len());
        let mut stream = vec![];
        for chunk in &chunks {
            assert!(
                chunk.len() <= RESULT_CHUNK_BYTES_MAX + 4096,
                "{}",
                chunk.len()
            );
            stream.extend_from_slice(chunk);
        }
        let small = batch.slice(3, 10);
        stream.extend_from_slice(&one_chunk(chunker.batch(&small).unwrap()));
        stream.extend_from_slice(&chunker.finish().unwrap());
        let read = ipc_to_batch(&stream).unwrap();
        assert_eq!(read.num_rows(), rows + 10);
        assert_eq!(read.slice(0, rows), batch);
        assert_eq!(read.slice(rows, 10), small);
    }

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
        let mut chunker = IpcChunker::start(&schema).unwrap();
        let bytes = one_chunk(chunker.batch(&slice).unwrap());
        assert!(bytes.len() < 2_000, "{} bytes for 5 rows", bytes.len());
        let compacted = shrink_view_columns(&slice).unwrap();
        assert_eq!(
            compacted.column(0).as_string_view().value(0),
            "a fairly long comment number 10"
        );
        // Nothing to gain: returned as is.
        let whole = shrink_view_columns(&batch).unwrap();
        assert_eq!(
            whole.column(0).as_string_view().data_buffers().len(),
            batch.column(0).as_string_view().data_buffers().len()
        );
    }

    /// A gather over batches of one dictionary page lists the page's
    /// buffer once per source batch: shipped once, its strings not copied.
    #[test]
    fn a_buffer_listed_many_times_ships_once() {
        let page = StringViewArray::from(vec!["DELIVER IN PERSON", "TAKE BACK RETURN", "NONE"]);
        let sources = 300;
        let views: Vec<u128> = (0..8192u32)
            .map(|i| {
                let v = page.views()[(i % 3) as usize];
                let source = (i as u128 * 7919) % sources;
                match v as u32 > 12 {
                    true => v | (source << 64),
                    false => v,
                }
            })
            .collect();
        let buffers = vec![page.data_buffers()[0].clone(); sources as usize];
        let gathered = StringViewArray::try_new(views.into(), buffers, None).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "s",
            DataType::Utf8View,
            false,
        )]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(gathered)]).unwrap();
        let shrunk = shrink_view_columns(&batch).unwrap();
        assert_eq!(shrunk, batch);
        let shipped = shrunk.column(0).as_string_view().data_buffers().to_vec();
        assert_eq!(shipped.len(), 1, "one buffer");
        assert!(shipped[0].ptr_eq(&page.data_buffers()[0]), "not copied");
        let bytes = one_chunk(IpcChunker::start(&schema).unwrap().batch(&batch).unwrap());
        assert!(bytes.len() < 8192 * 16 + 1024, "{} bytes", bytes.len());
    }

    /// Chunks of batches of every column kind a stage emits, sliced or
    /// not, read back as one IPC stream into the same batches.
    #[test]
    fn chunks_concatenate_into_a_stream_of_the_batches() {
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
        let slices: Vec<RecordBatch> = [(0, n), (0, 1), (17, 999), (n - 3, 3), (0, 0)]
            .iter()
            .map(|&(at, len)| batch.slice(at, len))
            .collect();
        for count in [0, 1, slices.len()] {
            let mut chunker = IpcChunker::start(&batch.schema()).unwrap();
            let mut stream = vec![];
            for chunk in slices[..count]
                .iter()
                .flat_map(|s| chunker.batch(s).unwrap())
            {
                stream.extend_from_slice(&chunk);
            }
            stream.extend_from_slice(&chunker.finish().unwrap());
            let reader = arrow::ipc::reader::StreamReader::try_new(&stream[..], None).unwrap();
            assert_eq!(reader.schema(), batch.schema());
            let read: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
            assert_eq!(read, slices[..count], "{count} batches");
        }
    }
}
