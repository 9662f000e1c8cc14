//! Decoding of a device's result stream (Arrow IPC, one message per chunk).
//!
//! arrow-ipc's `StreamDecoder` validates every record batch in full, and
//! for string views that means one `from_utf8` call per row: about a tenth
//! of the host's CPU on a sort that returns every column. This decoder
//! reads the same stream with that check replaced by
//! [`insitu_kernels::validate_full_fast`], which accepts exactly what
//! Arrow accepts. Nothing is trusted: every batch is checked for structure
//! (buffer sizes, offsets, null counts) and values before it is returned.
//!
//! ```text
//!  chunk ──► [0xFFFFFFFF][len][Message flatbuffer][body] ... ──► RecordBatch
//!                               │ Schema           → schema
//!                               │ DictionaryBatch  → dictionaries
//!                               │ RecordBatch      → decode unchecked, then
//!                               │                    validate every column
//!            [0xFFFFFFFF][0]    end of stream
//! ```

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow_data::UnsafeFlag;
use arrow_ipc::reader::{read_dictionary, RecordBatchDecoder};
use arrow_ipc::MessageHeader;
use insitu_client::IPC_CONTINUATION;

/// Reads a device's IPC result stream, chunk by chunk.
#[derive(Debug, Default)]
pub struct ResultDecoder {
    schema: Option<SchemaRef>,
    dictionaries: HashMap<i64, ArrayRef>,
    finished: bool,
}

impl ResultDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes the whole messages in `chunk`; returns the record batch
    /// among them, if any. More than one batch in a chunk is an error.
    pub fn decode(&mut self, chunk: Buffer) -> Result<Option<RecordBatch>, ArrowError> {
        let mut out = None;
        for span in message_spans(&chunk)? {
            if span.header.is_empty() {
                self.finished = true;
                continue;
            }
            let body = chunk.slice_with_length(span.body.start, span.body.len());
            if let Some(batch) = self.decode_message(&chunk[span.header], &body)? {
                if out.replace(batch).is_some() {
                    return Err(ipc_error("more than one batch in a chunk"));
                }
            }
        }
        Ok(out)
    }

    /// Decodes one message given as its flatbuffer header (without length
    /// prefix) and its body, the form Arrow Flight carries: the batch if it
    /// is a record batch.
    pub fn decode_message(
        &mut self,
        meta: &[u8],
        body: &Buffer,
    ) -> Result<Option<RecordBatch>, ArrowError> {
        if self.finished {
            return Err(ipc_error("message after the end of the stream"));
        }
        let message = arrow_ipc::root_as_message(meta)
            .map_err(|e| ipc_error(&format!("unreadable message header: {e}")))?;
        let version = message.version();
        match message.header_type() {
            MessageHeader::Schema => {
                if self.schema.is_some() {
                    return Err(ipc_error("a second schema message"));
                }
                let schema = message.header_as_schema().expect("header type is Schema");
                self.schema = Some(Arc::new(arrow_ipc::convert::fb_to_schema(schema)));
                Ok(None)
            }
            MessageHeader::DictionaryBatch => {
                let dictionary = message
                    .header_as_dictionary_batch()
                    .expect("header type is DictionaryBatch");
                let schema = self.schema()?;
                read_dictionary(body, dictionary, &schema, &mut self.dictionaries, &version)?;
                Ok(None)
            }
            MessageHeader::RecordBatch => {
                let batch = message
                    .header_as_record_batch()
                    .expect("header type is RecordBatch");
                let schema = self.schema()?;
                let mut skip = UnsafeFlag::new();
                // SAFETY: the batch is validated in full below before anyone
                // reads it; only the order of the checks changes.
                unsafe { skip.set(true) };
                let batch =
                    RecordBatchDecoder::try_new(body, batch, schema, &self.dictionaries, &version)?
                        .with_skip_validation(skip)
                        .read_record_batch()?;
                validate(batch).map(Some)
            }
            other => Err(ipc_error(&format!("unexpected message type {other:?}"))),
        }
    }

    fn schema(&self) -> Result<SchemaRef, ArrowError> {
        self.schema
            .clone()
            .ok_or_else(|| ipc_error("a batch before the schema"))
    }
}

/// Where one message of an IPC stream chunk lies in it. The end-of-stream
/// marker has an empty header and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageSpan {
    /// The message's flatbuffer header, without its length prefix.
    pub header: Range<usize>,
    /// The buffers that follow it.
    pub body: Range<usize>,
}

/// Splits a chunk of an Arrow IPC stream into its messages, checking that
/// each header parses and each body lies inside the chunk.
pub fn message_spans(chunk: &[u8]) -> Result<Vec<MessageSpan>, ArrowError> {
    let word = |at: usize| -> Result<u32, ArrowError> {
        let bytes = chunk
            .get(at..at + 4)
            .ok_or_else(|| ipc_error(&format!("message prefix cut short at byte {at}")))?;
        Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    };
    let mut spans = vec![];
    let mut at = 0;
    while at < chunk.len() {
        // Streams from before format 0.15 have no continuation marker.
        let (len, header_at) = match word(at)? {
            IPC_CONTINUATION => (word(at + 4)? as usize, at + 8),
            len => (len as usize, at + 4),
        };
        let header = header_at..header_at + len;
        let bytes = chunk
            .get(header.clone())
            .ok_or_else(|| ipc_error(&format!("message header cut short at byte {header_at}")))?;
        let body_len = if len == 0 {
            0
        } else {
            let message = arrow_ipc::root_as_message(bytes).map_err(|e| {
                ipc_error(&format!(
                    "unreadable message header at byte {header_at}: {e}"
                ))
            })?;
            usize::try_from(message.bodyLength()).map_err(|_| {
                ipc_error(&format!("negative message body length at byte {header_at}"))
            })?
        };
        let body = header.end..header.end.saturating_add(body_len);
        if body.end > chunk.len() {
            return Err(ipc_error(&format!(
                "message body cut short at byte {}",
                header.end
            )));
        }
        at = body.end;
        spans.push(MessageSpan { header, body });
    }
    Ok(spans)
}

/// Everything `ArrayData::validate_full` checks, string views by the fast
/// path, and what `RecordBatch::try_new` checks (column types and lengths
/// against the schema and row count), which the unchecked decode skipped.
fn validate(batch: RecordBatch) -> Result<RecordBatch, ArrowError> {
    for (column, field) in batch.columns().iter().zip(batch.schema().fields()) {
        insitu_kernels::validate_full_fast(&column.to_data())
            .map_err(|e| ipc_error(&format!("column {}: {e}", field.name())))?;
    }
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(batch.schema(), batch.columns().to_vec(), &options)
}

fn ipc_error(what: &str) -> ArrowError {
    ArrowError::IpcError(what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{DictionaryArray, Int32Array, StringArray, StringViewArray};
    use arrow::datatypes::Int8Type;
    use arrow::ipc::reader::StreamReader;
    use arrow::ipc::writer::StreamWriter;

    fn sample() -> RecordBatch {
        let long = |i: usize| format!("ünïcödé string number {i}");
        let views: StringViewArray = (0..100)
            .map(|i| (i % 7 != 0).then(|| if i % 2 == 0 { long(i) } else { "short".into() }))
            .collect();
        let dict: DictionaryArray<Int8Type> = (0..100).map(|i| ["x", "yy", "zzz"][i % 3]).collect();
        RecordBatch::try_from_iter([
            ("v", Arc::new(views) as ArrayRef),
            ("d", Arc::new(dict) as ArrayRef),
            ("i", Arc::new(Int32Array::from_iter(0..100)) as ArrayRef),
            (
                "s",
                Arc::new(StringArray::from_iter_values(["a", "b"].repeat(50))) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    /// The stream as the device sends it: one chunk per writer call.
    fn chunks(batches: &[RecordBatch]) -> Vec<Vec<u8>> {
        let mut writer = StreamWriter::try_new(Vec::new(), &batches[0].schema()).unwrap();
        let mut out = vec![std::mem::take(writer.get_mut())];
        for b in batches {
            writer.write(b).unwrap();
            out.push(std::mem::take(writer.get_mut()));
        }
        writer.finish().unwrap();
        out.push(std::mem::take(writer.get_mut()));
        out
    }

    fn decode_all(chunks: Vec<Vec<u8>>) -> Result<Vec<RecordBatch>, ArrowError> {
        let mut decoder = ResultDecoder::new();
        let mut out = vec![];
        for c in chunks {
            out.extend(decoder.decode(Buffer::from_vec(c))?);
        }
        Ok(out)
    }

    #[test]
    fn decodes_what_arrow_decodes() {
        let batches = [sample(), sample().slice(3, 50)];
        let chunks = chunks(&batches);
        let ours = decode_all(chunks.clone()).unwrap();
        let arrow: Vec<RecordBatch> =
            StreamReader::try_new(std::io::Cursor::new(chunks.concat()), None)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
        assert_eq!(ours, arrow);
        assert_eq!(ours.len(), 2);
        // The whole stream in one chunk holds two batches: refused.
        let err = decode_all(vec![chunks.concat()]).unwrap_err();
        assert!(err.to_string().contains("more than one batch"), "{err}");
    }

    #[test]
    fn rejects_a_string_view_that_is_not_utf8() {
        let chunks = chunks(&[sample()]);
        let needle = "ünïcödé".as_bytes();
        let mut body = chunks[1].clone();
        let at = body
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap();
        body[at + 7] = b'x'; // the second byte of ö: now a lone lead byte
        let err = decode_all(vec![chunks[0].clone(), body]).unwrap_err();
        assert!(err.to_string().contains("column v"), "{err}");
        assert!(err.to_string().contains("not UTF-8"), "{err}");
    }

    #[test]
    fn rejects_cut_and_out_of_order_streams() {
        let chunks = chunks(&[sample()]);
        let cases: [(Vec<Vec<u8>>, &str); 4] = [
            (
                vec![chunks[0].clone(), chunks[1][..chunks[1].len() - 9].to_vec()],
                "cut short",
            ),
            (vec![chunks[0][..6].to_vec()], "cut short"),
            (vec![chunks[1].clone()], "before the schema"),
            (
                vec![chunks[0].clone(), chunks[2].clone(), chunks[1].clone()],
                "after the end",
            ),
        ];
        for (stream, want) in cases {
            let err = decode_all(stream).unwrap_err();
            assert!(err.to_string().contains(want), "{err} should say {want}");
        }
        let garbage = vec![
            chunks[0].clone(),
            vec![0xff, 0xff, 0xff, 0xff, 16, 0, 0, 0, 1, 2, 3],
        ];
        assert!(decode_all(garbage).is_err());
    }

    #[test]
    fn rejects_columns_shorter_than_the_batch() {
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("i", arrow::datatypes::DataType::Int32, false),
        ]));
        let column: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
        // SAFETY: never read, only validated (what an unchecked decode returns).
        let batch = unsafe { RecordBatch::new_unchecked(schema, vec![column], 5) };
        let err = validate(batch).unwrap_err();
        assert!(err.to_string().contains("row count"), "{err}");
    }
}
