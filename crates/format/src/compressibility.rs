//! How well each column of a partition compresses as Arrow IPC, sampled
//! while the partition is written and recorded in its descriptor.
//!
//! A device that ships a stage's results compressed sends these columns
//! (or rows of them) as LZ4- or Zstandard-compressed Arrow IPC. How much
//! that saves depends on the data: TPC-H's lineitem keys and decimals
//! shrink to a third under LZ4, its comments hardly at all. The cost
//! model weighs compressing against the link with the ratios recorded
//! here instead of one guess for every table.

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow_ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow_ipc::CompressionType;
use insitu_wire::IpcCompression;

/// Rows sampled per partition: enough that IPC headers weigh nothing
/// against the values, few enough to compress in a millisecond.
pub const COMPRESSIBILITY_SAMPLE_ROWS: usize = 32_768;

/// Collects the first [`COMPRESSIBILITY_SAMPLE_ROWS`] rows written.
#[derive(Debug)]
pub(crate) struct Sampler {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    rows: usize,
}

impl Sampler {
    pub(crate) fn new(schema: SchemaRef) -> Self {
        Self {
            schema,
            batches: vec![],
            rows: 0,
        }
    }

    pub(crate) fn offer(&mut self, batch: &RecordBatch) {
        let wanted = COMPRESSIBILITY_SAMPLE_ROWS - self.rows;
        if wanted == 0 || batch.num_rows() == 0 {
            return;
        }
        let taken = batch.slice(0, batch.num_rows().min(wanted));
        self.rows += taken.num_rows();
        self.batches.push(taken);
    }

    /// Each column's ratios over the rows sampled; `None` for a column
    /// that cannot be measured (no rows, or a type IPC cannot write).
    pub(crate) fn finish(&self) -> Vec<Option<IpcCompression>> {
        let Ok(sample) = concat_batches(&self.schema, &self.batches) else {
            return vec![None; self.schema.fields().len()];
        };
        (0..sample.num_columns())
            .map(|i| column_compression(&sample, i))
            .collect()
    }
}

/// The ratios of column `i` of `batch`: compressed IPC bytes per plain
/// IPC byte.
pub fn column_compression(batch: &RecordBatch, i: usize) -> Option<IpcCompression> {
    if batch.num_rows() == 0 {
        return None;
    }
    let column = batch.project(&[i]).ok()?;
    let len = |codec| Some(ipc_stream(&column, codec).ok()?.len() as f64);
    let plain = len(None)?;
    let ratio = |codec| Some((len(Some(codec))? / plain).min(1.0));
    Some(IpcCompression {
        lz4_ratio: ratio(CompressionType::LZ4_FRAME)?,
        zstd_ratio: ratio(CompressionType::ZSTD)?,
    })
}

/// `batch` as an Arrow IPC stream with its bodies under `codec`.
pub fn ipc_stream(
    batch: &RecordBatch,
    codec: Option<CompressionType>,
) -> Result<Vec<u8>, arrow::error::ArrowError> {
    let options = IpcWriteOptions::default().try_with_compression(codec)?;
    let mut out = vec![];
    let mut writer = StreamWriter::try_new_with_options(&mut out, &batch.schema(), options)?;
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use std::sync::Arc;

    fn batch(rows: usize) -> RecordBatch {
        // Repetitive keys compress; pseudo-random strings hardly do.
        let keys = Int64Array::from_iter_values((0..rows as i64).map(|i| i / 16));
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let noise = StringArray::from_iter_values((0..rows).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}")
        }));
        RecordBatch::try_from_iter([("k", Arc::new(keys) as _), ("s", Arc::new(noise) as _)])
            .unwrap()
    }

    #[test]
    fn repetitive_columns_compress_and_random_ones_hardly() {
        let b = batch(20_000);
        let keys = column_compression(&b, 0).unwrap();
        let noise = column_compression(&b, 1).unwrap();
        assert!(keys.lz4_ratio < 0.3, "{keys:?}");
        assert!(keys.zstd_ratio < keys.lz4_ratio, "{keys:?}");
        // Hex digits: 4 bits of entropy per 8-bit byte at best.
        assert!(noise.lz4_ratio > 0.5, "{noise:?}");
        assert!(
            noise.zstd_ratio <= 1.0 && noise.zstd_ratio > 0.3,
            "{noise:?}"
        );
    }

    #[test]
    fn the_sampler_keeps_the_first_rows_of_many_batches() {
        let b = batch(COMPRESSIBILITY_SAMPLE_ROWS / 3 + 7);
        let mut sampler = Sampler::new(b.schema());
        for _ in 0..5 {
            sampler.offer(&b);
        }
        assert_eq!(sampler.rows, COMPRESSIBILITY_SAMPLE_ROWS);
        assert_eq!(sampler.finish().iter().flatten().count(), 2);
    }

    #[test]
    fn an_empty_partition_has_no_ratios() {
        let b = batch(0);
        let mut sampler = Sampler::new(b.schema());
        sampler.offer(&b);
        assert_eq!(sampler.finish(), vec![None, None]);
        assert_eq!(
            column_compression(&batch(1), 0).map(|c| c.lz4_ratio <= 1.0),
            Some(true)
        );
    }
}
