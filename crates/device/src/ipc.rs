//! Arrow IPC stream encoding of stage results, one message per batch.

use std::sync::Arc;

use arrow::array::{Array, ArrayData, ArrayRef, AsArray};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow::ipc::CompressionType;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use insitu_client::IPC_CONTINUATION;
use insitu_kernels::arena::ChunkArena;
use insitu_kernels::mem::{pooled_buffer, take_vec};
use insitu_kernels::shrink_views;
use insitu_wire::ResultCodec;

/// Encodes a result stream chunk by chunk: each chunk carries one batch
/// (the first also the schema, and any dictionaries the batch needs), the
/// last the end-of-stream marker (and the schema, if no batch came).
/// Concatenated, the chunks are one valid Arrow IPC stream.
///
/// A batch whose buffers lie in a [`ChunkArena`] (what the kernels'
/// `GatherSource` gathers into) is encoded where it lies: its record batch
/// header goes into the arena's reserve in front of the buffers, and the
/// chunk is the arena's `[header | body]`, with no copy of the body. Any
/// buffer outside the arena (a small dictionary page, a validity bitmap)
/// is copied into it first; a batch that does not fit, or with a type
/// this does not lay out (dictionaries, nested types), goes through
/// arrow-ipc's encoder and one copy as before.
pub struct IpcChunker {
    encoder: StreamEncoder,
    /// Bodies compressed: every batch goes through arrow-ipc's encoder.
    compressed: bool,
    /// The schema message went out (with the first batch, or at the end).
    schema_sent: bool,
}

impl IpcChunker {
    pub fn start(schema: &SchemaRef) -> Result<Self, ArrowError> {
        Self::start_with(schema, ResultCodec::None)
    }

    /// A chunker whose batch bodies `codec` compresses (arrow-ipc's body
    /// compression; a buffer that would not shrink is left as it was).
    pub fn start_with(schema: &SchemaRef, codec: ResultCodec) -> Result<Self, ArrowError> {
        let compression = match codec {
            ResultCodec::None => None,
            ResultCodec::Lz4Frame => Some(CompressionType::LZ4_FRAME),
            ResultCodec::Zstd => Some(CompressionType::ZSTD),
        };
        let options = IpcWriteOptions::default().try_with_compression(compression)?;
        Ok(Self {
            encoder: StreamEncoder::try_new_with_options(schema, options)?,
            compressed: compression.is_some(),
            schema_sent: false,
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
        if self.schema_sent && !self.compressed {
            if let Some(chunk) = encode_in_place(&batch) {
                out.push(chunk);
                return Ok(());
            }
        }
        out.push(contiguous(self.encoder.encode(&batch)?));
        self.schema_sent = true;
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

/// `batch` as one record batch message written in the chunk arena its
/// buffers lie in; `None` if they lie in none, a column's type is not laid
/// out here, or the arena has no room for what must be copied in or for
/// the header (the caller then encodes as usual). The message is what
/// arrow-ipc writes but for where the buffers sit in the body (the header
/// records each one's offset) and the zeros between them.
///
/// Saves the copy of every body byte, which was 8.5-10% of the CPU of an
/// ORDER BY of all of lineitem's columns (perf, in `contiguous`): with the
/// gather's compaction into the arena, `insitu bench sql "SELECT * FROM
/// lineitem ORDER BY l_partkey" --threads 1` (SF1, 2 devices) went from
/// 1.19-1.20 s to 1.06-1.09 s (medians of 5, two rounds).
fn encode_in_place(batch: &RecordBatch) -> Option<Bytes> {
    let arena = batch.columns().iter().find_map(|c| {
        let data = c.to_data();
        let first = data.buffers().first().filter(|b| !b.is_empty())?;
        ChunkArena::containing(first.as_ptr())
    })?;
    let mut body = BodyLayout::default();
    for column in batch.columns() {
        body.add(&column.to_data(), &arena)?;
    }
    let body_len = arena.body_len();
    let header = body.header(batch.num_rows(), body_len);
    let chunk = arena.seal(&header, body_len)?;
    Some(Bytes::from_owner(BufferBytes(chunk)))
}

/// A record batch message's field nodes, buffer entries and variadic
/// buffer counts, for a body in a chunk arena.
#[derive(Default)]
struct BodyLayout {
    nodes: Vec<arrow_ipc::FieldNode>,
    buffers: Vec<arrow_ipc::Buffer>,
    variadic_counts: Vec<i64>,
}

impl BodyLayout {
    /// Lays out one column (flat types only), in the order of the IPC
    /// format: validity, values, then a view column's data buffers.
    fn add(&mut self, data: &ArrayData, arena: &ChunkArena) -> Option<()> {
        let (len, offset) = (data.len(), data.offset());
        let is_view = matches!(data.data_type(), DataType::Utf8View | DataType::BinaryView);
        let width = match data.data_type() {
            _ if is_view => 16,
            DataType::Boolean => 0,
            dt if dt.is_primitive() => dt.primitive_width()?,
            _ => return None,
        };
        self.nodes.push(arrow_ipc::FieldNode::new(
            len as i64,
            data.null_count() as i64,
        ));
        match data.nulls().filter(|n| n.null_count() > 0) {
            Some(nulls) => self.place(&nulls.inner().sliced(), arena)?,
            None => self.buffers.push(arrow_ipc::Buffer::new(0, 0)),
        }
        let values = &data.buffers()[0];
        match width {
            0 => self.place(&values.bit_slice(offset, len), arena)?,
            w => self.place(&values[offset * w..(offset + len) * w], arena)?,
        }
        if is_view {
            for buffer in &data.buffers()[1..] {
                self.place(buffer, arena)?;
            }
            self.variadic_counts.push(data.buffers().len() as i64 - 1);
        }
        Some(())
    }

    /// Records where `bytes` lies in the body, copying it into the arena
    /// first if it lies elsewhere.
    fn place(&mut self, bytes: &[u8], arena: &ChunkArena) -> Option<()> {
        let at = match arena.body_offset(bytes) {
            _ if bytes.is_empty() => 0,
            Some(at) => at,
            None => {
                let mut copy = arena.alloc(bytes.len())?;
                copy.bytes_mut().copy_from_slice(bytes);
                arena.body_offset(&copy.into_buffer())?
            }
        };
        self.buffers
            .push(arrow_ipc::Buffer::new(at as i64, bytes.len() as i64));
        Some(())
    }

    /// The encapsulated message header (continuation marker, length,
    /// flatbuffer padded to 8 bytes) for `rows` rows and a body of
    /// `body_len` bytes.
    fn header(&self, rows: usize, body_len: usize) -> Vec<u8> {
        let mut fbb = flatbuffers::FlatBufferBuilder::new();
        let nodes = fbb.create_vector(&self.nodes);
        let buffers = fbb.create_vector(&self.buffers);
        let variadic =
            (!self.variadic_counts.is_empty()).then(|| fbb.create_vector(&self.variadic_counts));
        let mut batch = arrow_ipc::RecordBatchBuilder::new(&mut fbb);
        batch.add_length(rows as i64);
        batch.add_nodes(nodes);
        batch.add_buffers(buffers);
        if let Some(counts) = variadic {
            batch.add_variadicBufferCounts(counts);
        }
        let batch = batch.finish().as_union_value();
        let mut message = arrow_ipc::MessageBuilder::new(&mut fbb);
        message.add_version(arrow_ipc::MetadataVersion::V5);
        message.add_header_type(arrow_ipc::MessageHeader::RecordBatch);
        message.add_bodyLength(body_len as i64);
        message.add_header(batch);
        let message = message.finish();
        fbb.finish(message, None);
        let meta = fbb.finished_data();
        let padded = meta.len().next_multiple_of(8);
        let mut header = Vec::with_capacity(8 + padded);
        header.extend_from_slice(&IPC_CONTINUATION.to_le_bytes());
        header.extend_from_slice(&(padded as u32).to_le_bytes());
        header.extend_from_slice(meta);
        header.resize(8 + padded, 0);
        header
    }
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
            // The gather that wrote it into an arena shrank it already.
            DataType::Utf8View | DataType::BinaryView if whole_in_arena(a) => Arc::clone(a),
            DataType::Utf8View => Arc::new(shrink_views(a.as_string_view())) as _,
            DataType::BinaryView => Arc::new(shrink_views(a.as_binary_view())) as _,
            _ => Arc::clone(a),
        })
        .collect();
    RecordBatch::try_new(batch.schema(), columns)
}

/// Whether view array `array` is all of what a gather wrote into a chunk
/// arena: its views are one whole region of an arena (a slice's are not).
fn whole_in_arena(array: &ArrayRef) -> bool {
    let data = array.to_data();
    let views = &data.buffers()[0].as_slice()[data.offset() * 16..][..data.len() * 16];
    !views.is_empty() && ChunkArena::containing(views.as_ptr()).is_some_and(|a| a.is_region(views))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringViewArray;
    use arrow::datatypes::{Field, Schema};
    use insitu_client::ipc_to_batch;

    fn one_chunk(chunks: Vec<Bytes>) -> Bytes {
        assert_eq!(chunks.len(), 1, "one chunk");
        chunks.into_iter().next().unwrap()
    }

    /// Compressed, a repetitive result reads back the same in far fewer
    /// bytes, with each codec; empty and one-row batches too.
    #[test]
    fn compressed_results_read_back_the_same_and_smaller() {
        use arrow::array::Int64Array;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8View, true),
        ]));
        for rows in [0usize, 1, 2, 7, 50, 20_000] {
            let keys =
                Int64Array::from_iter((0..rows).map(|i| (i % 5 != 3).then_some(i as i64 % 9)));
            let text = StringViewArray::from_iter(
                (0..rows).map(|i| (i % 7 != 0).then(|| format!("status-{}-and-padding", i % 3))),
            );
            let batch =
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys), Arc::new(text)])
                    .unwrap();
            let encode = |codec| {
                let mut chunker = IpcChunker::start_with(&schema, codec).unwrap();
                let mut bytes = vec![];
                for chunk in chunker.batch(&batch).unwrap() {
                    bytes.extend_from_slice(&chunk);
                }
                bytes.extend_from_slice(&chunker.finish().unwrap());
                bytes
            };
            let plain = encode(ResultCodec::None);
            for codec in [ResultCodec::Lz4Frame, ResultCodec::Zstd] {
                let packed = encode(codec);
                let back = ipc_to_batch(&packed).unwrap();
                let expected = ipc_to_batch(&plain).unwrap();
                assert_eq!(back, expected, "{codec:?}, {rows} rows");
                if rows == 20_000 {
                    assert!(
                        packed.len() * 4 < plain.len(),
                        "{codec:?}: {} of {}",
                        packed.len(),
                        plain.len()
                    );
                }
            }
        }
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

    /// Gathered batches (every kind of column a gather lays out or copies
    /// in: nullable integers, narrowed decimals, compacted long strings,
    /// a small shared dictionary page, booleans, sliced or whole) after
    /// the first go out where they lie in their arena, and read back
    /// through arrow-ipc's reader as the batches; a chunk holds little
    /// beyond the batch's own bytes.
    #[test]
    fn gathered_batches_are_encoded_in_their_arena() {
        use arrow::array::{BooleanArray, Decimal128Array, Int64Array};
        use insitu_kernels::GatherSource;
        let page = StringViewArray::from(vec!["DELIVER IN PERSON", "NONE", "TAKE BACK RETURN"]);
        let batch_of = |at: usize, n: usize| {
            let long: StringViewArray = (at..at + n)
                .map(|i| (i % 11 != 0).then(|| format!("comment {i} past twelve bytes")))
                .collect();
            let keys: Vec<u32> = (at..at + n).map(|i| (i * 7 % 3) as u32).collect();
            let short =
                arrow::compute::take(&page, &arrow::array::UInt32Array::from(keys), None).unwrap();
            let columns: Vec<(&str, ArrayRef)> = vec![
                (
                    "i",
                    Arc::new(Int64Array::from_iter(
                        (at..at + n).map(|i| (i % 7 != 0).then_some(i as i64)),
                    )),
                ),
                (
                    "d",
                    Arc::new(
                        Decimal128Array::from_iter_values((at..at + n).map(|i| i as i128 * 3))
                            .with_precision_and_scale(15, 2)
                            .unwrap(),
                    ),
                ),
                ("long", Arc::new(long)),
                ("short", short),
                (
                    "b",
                    Arc::new(BooleanArray::from_iter(
                        (at..at + n).map(|i| (i % 5 != 0).then_some(i % 2 == 0)),
                    )),
                ),
            ];
            RecordBatch::try_from_iter(columns).unwrap()
        };
        let batches: Vec<RecordBatch> = (0..4).map(|b| batch_of(b * 1000, 1000)).collect();
        let schema = batches[0].schema();
        let source = GatherSource::new(Arc::clone(&schema), &batches).unwrap();
        let order: Vec<u32> = (0..4000u32).map(|i| i * 1237 % 4000).collect();
        let whole = arrow::compute::concat_batches(&schema, &batches).unwrap();
        let mut chunker = IpcChunker::start(&schema).unwrap();
        let (mut stream, mut want) = (vec![], vec![]);
        for (k, part) in order.chunks(1500).enumerate() {
            let gathered = source.gather(part).unwrap();
            let indices = arrow::array::UInt32Array::from(part.to_vec());
            want.push(arrow::compute::take_record_batch(&whole, &indices).unwrap());
            let chunk = one_chunk(chunker.batch(&gathered).unwrap());
            if k > 0 {
                let arena = ChunkArena::containing(chunk.as_ptr()).expect("chunk in the arena");
                let values = gathered.column(0).to_data().buffers()[0].clone();
                assert!(
                    arena.body_offset(&values).is_some(),
                    "same arena as the batch"
                );
                let own: usize = gathered
                    .columns()
                    .iter()
                    .map(|c| array_bytes(&c.to_data()))
                    .sum();
                assert!(chunk.len() < own + 4096, "{} bytes for {own}", chunk.len());
            }
            stream.extend_from_slice(&chunk);
        }
        stream.extend_from_slice(&chunker.finish().unwrap());
        let reader = arrow::ipc::reader::StreamReader::try_new(&stream[..], None).unwrap();
        let read: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
        assert_eq!(read, want);
        // A gathered column ships as the gather shrank it; a slice of it
        // is shrunk again to its own strings.
        let gathered = source.gather(&order[..1500]).unwrap();
        let data_of = |b: &RecordBatch| b.column(2).as_string_view().data_buffers().to_vec();
        let kept = data_of(&shrink_view_columns(&gathered).unwrap());
        assert!(kept[0].ptr_eq(&data_of(&gathered)[0]), "not copied again");
        for slice in [gathered.slice(0, 10), gathered.slice(5, 10)] {
            let used: usize = (slice.column(2).as_string_view().iter())
                .flatten()
                .map(|s| s.len())
                .sum();
            let shrunk = data_of(&shrink_view_columns(&slice).unwrap());
            assert_eq!(shrunk.iter().map(|b| b.len()).sum::<usize>(), used);
        }
    }

    /// A batch in an arena whose reserve cannot hold the header, or with a
    /// dictionary column, or in an arena already sealed, goes through
    /// arrow-ipc's encoder and reads back the same.
    #[test]
    fn batches_that_do_not_fit_their_arena_are_copied() {
        use arrow::array::{DictionaryArray, Int32Array, StringArray};
        let in_arena = |arena: &ChunkArena, values: &[i32]| {
            let mut out = arena.alloc(values.len() * 4).unwrap();
            for (o, v) in out.bytes_mut().chunks_exact_mut(4).zip(values) {
                o.copy_from_slice(&v.to_le_bytes());
            }
            Int32Array::new(out.into_buffer().into(), None)
        };
        let values: Vec<i32> = (0..100).collect();
        let tiny_reserve = ChunkArena::new(8, 4096);
        let roomy = ChunkArena::new(1024, 4096);
        let dict = DictionaryArray::new(
            in_arena(&roomy, &[0, 1, 0]),
            Arc::new(StringArray::from(vec!["x", "y"])),
        );
        let sealed = ChunkArena::new(1024, 4096);
        let first = in_arena(&sealed, &values);
        assert!(sealed.seal(&[0; 8], sealed.body_len()).is_some());
        let batches = [
            RecordBatch::try_from_iter([("a", Arc::new(in_arena(&tiny_reserve, &values)) as _)])
                .unwrap(),
            RecordBatch::try_from_iter([("a", Arc::new(first) as ArrayRef)]).unwrap(),
        ];
        let schema = batches[0].schema();
        let mut chunker = IpcChunker::start(&schema).unwrap();
        let mut stream = vec![];
        for b in [&batches[0], &batches[0], &batches[1]] {
            let chunk = one_chunk(chunker.batch(b).unwrap());
            assert!(ChunkArena::containing(chunk.as_ptr()).is_none(), "copied");
            stream.extend_from_slice(&chunk);
        }
        stream.extend_from_slice(&chunker.finish().unwrap());
        let read = ipc_to_batch(&stream).unwrap();
        assert_eq!(
            read.column(0)
                .as_primitive::<arrow::datatypes::Int32Type>()
                .values()
                .len(),
            300
        );
        let dict_batch = RecordBatch::try_from_iter([("k", Arc::new(dict) as ArrayRef)]).unwrap();
        let mut chunker = IpcChunker::start(&dict_batch.schema()).unwrap();
        let mut stream = vec![];
        for _ in 0..2 {
            stream.extend_from_slice(&one_chunk(chunker.batch(&dict_batch).unwrap()));
        }
        stream.extend_from_slice(&chunker.finish().unwrap());
        let read = ipc_to_batch(&stream).unwrap();
        assert_eq!(read.num_rows(), 6);
    }
}
