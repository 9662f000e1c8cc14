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
        self.writer.write(&compact_views(batch)?)?;
        Ok(Bytes::from(std::mem::take(self.writer.get_mut())))
    }

    pub fn finish(mut self) -> Result<Bytes, ArrowError> {
        self.writer.finish()?;
        Ok(Bytes::from(std::mem::take(self.writer.get_mut())))
    }
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
}
