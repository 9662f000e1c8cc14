//! Arrow IPC stream encoding of stage results, one message per batch.

use arrow::datatypes::SchemaRef;
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
        self.writer.write(batch)?;
        Ok(Bytes::from(std::mem::take(self.writer.get_mut())))
    }

    pub fn finish(mut self) -> Result<Bytes, ArrowError> {
        self.writer.finish()?;
        Ok(Bytes::from(std::mem::take(self.writer.get_mut())))
    }
}
