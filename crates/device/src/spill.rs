//! Spilling for [`crate::KernelSortExec`]: when a sort's input outgrows the
//! device's memory budget, sorted runs go to the device's own storage as
//! Arrow IPC files and are merged back with the external sort's loser tree
//! (`insitu_extsort::loser`), the engine `insitu extsort` uses.
//!
//! ```text
//!   input batches ─▶ buffer (reserved) ─full─▶ kernel sort ─▶ run file (IPC, batch_rows per batch)
//!   end: runs ─▶ merge passes of ≤ fan-in runs (one batch per run in memory)
//!        ─▶ loser tree on arrow-row keys ─▶ interleave ─▶ output batches
//! ```
//!
//! Keys are compared as arrow-row bytes after folding float keys onto the
//! kernels' order (every NaN equal and above every number, -0.0 = 0.0), so
//! the merge agrees with the order the kernels gave each run. Runs live in a
//! directory removed when the sort ends; a device removes leftovers of a
//! crash when it starts.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::compute::interleave_record_batch;
use arrow::datatypes::{DataType, Float32Type, Float64Type, SchemaRef};
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::FileWriter;
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::{DataFusionError, Result};
use datafusion::physical_expr::LexOrdering;
use insitu_extsort::loser::{LoserTree, MergeCursor};

/// Directory under a device's own directory where sorts spill.
pub const SPILL_DIR: &str = ".spill";

fn io<E: std::fmt::Display>(path: &Path) -> impl FnOnce(E) -> DataFusionError + '_ {
    move |e| DataFusionError::Execution(format!("spill file {}: {e}", path.display()))
}

/// The runs of one sort, removed (with their directory) on drop.
#[derive(Debug)]
pub struct SpillRuns {
    dir: PathBuf,
    next: u64,
    pub runs: Vec<Run>,
}

/// One sorted run on storage.
#[derive(Debug, Clone)]
pub struct Run {
    path: PathBuf,
    pub rows: usize,
    /// Size of the run file.
    pub bytes: u64,
    /// Rows per batch it was written in.
    pub batch_rows: usize,
    /// Memory of the largest batch in the run, to size merges by.
    pub batch_bytes_max: usize,
}

/// Removes the run directories under `device_dir/.spill` of sorts that
/// are no longer running (see [`insitu_extsort::files::tag_is_live`]: their
/// process is gone, or a later process reuses its id). Runs of live sorts
/// stay, whichever process owns them: a second device opened on the same
/// directory must not pull a running sort's runs from under it.
pub fn remove_stale_runs(device_dir: &Path) {
    insitu_extsort::files::remove_stale(&device_dir.join(SPILL_DIR), |n| n.strip_prefix("sort-"));
}

impl SpillRuns {
    /// A fresh run directory under `device_dir/.spill`.
    pub fn create(device_dir: &Path) -> Result<Self> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = device_dir
            .join(SPILL_DIR)
            .join(format!("sort-{}-{n}", insitu_extsort::files::process_tag()));
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        Ok(Self {
            dir,
            next: 0,
            runs: vec![],
        })
    }

    fn next_path(&mut self) -> PathBuf {
        self.next += 1;
        self.dir.join(format!("run-{:06}.arrow", self.next))
    }

    /// Writes `sorted` as a new run, `batch_rows` rows per batch.
    pub fn write(&mut self, sorted: &RecordBatch, batch_rows: usize) -> Result<()> {
        let path = self.next_path();
        let mut writer = RunWriter::create(&path, &sorted.schema(), batch_rows.max(1))?;
        let n = sorted.num_rows();
        for at in (0..n).step_by(batch_rows.max(1)) {
            writer.write(&sorted.slice(at, batch_rows.min(n - at)))?;
        }
        self.runs.push(writer.finish()?);
        Ok(())
    }
}

/// Rows per batch that keep a batch of `sorted` within `batch_bytes`
/// (at least 1, at most `batch_rows_max`).
pub fn rows_within(sorted: &RecordBatch, batch_bytes: usize, batch_rows_max: usize) -> usize {
    let bytes = sorted.get_array_memory_size().max(1) as u128;
    let rows = sorted.num_rows() as u128 * batch_bytes as u128 / bytes;
    (rows as usize).clamp(1, batch_rows_max.max(1))
}

impl SpillRuns {
    /// The smallest batch any run was written in: merges emit batches
    /// no larger, so their memory stays what the runs were sized for.
    pub fn merge_batch_rows(&self, batch_rows_max: usize) -> usize {
        self.runs
            .iter()
            .map(|r| r.batch_rows)
            .min()
            .unwrap_or(batch_rows_max)
            .clamp(1, batch_rows_max.max(1))
    }
}

impl Drop for SpillRuns {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct RunWriter {
    writer: FileWriter<BufWriter<File>>,
    path: PathBuf,
    batch_rows: usize,
    rows: usize,
    batch_bytes_max: usize,
}

impl RunWriter {
    fn create(path: &Path, schema: &SchemaRef, batch_rows: usize) -> Result<Self> {
        let file = File::create(path).map_err(io(path))?;
        let writer = FileWriter::try_new(BufWriter::with_capacity(1 << 20, file), schema)
            .map_err(io(path))?;
        Ok(Self {
            writer,
            path: path.to_path_buf(),
            batch_rows,
            rows: 0,
            batch_bytes_max: 0,
        })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        // Slices and merged batches of string views point into their
        // sources' whole data buffers, which IPC would write every time.
        let batch = &crate::ipc::shrink_view_columns(batch)?;
        // Slices carry their parent's buffers; count what a reader gets.
        let compact = batch_slice_bytes(batch)?;
        self.batch_bytes_max = self.batch_bytes_max.max(compact);
        self.rows += batch.num_rows();
        self.writer.write(batch).map_err(io(&self.path))
    }

    fn finish(mut self) -> Result<Run> {
        self.writer.finish().map_err(io(&self.path))?;
        let file = self.writer.into_inner().map_err(io(&self.path))?;
        let bytes = file.get_ref().metadata().map_err(io(&self.path))?.len();
        Ok(Run {
            path: self.path,
            rows: self.rows,
            bytes,
            batch_rows: self.batch_rows,
            batch_bytes_max: self.batch_bytes_max,
        })
    }
}

/// `batch` with its string and binary views copied into buffers of their
/// own: merged rows otherwise keep every source batch's data alive, and
/// send it along.
fn gc_views(batch: RecordBatch) -> Result<RecordBatch> {
    if !batch
        .columns()
        .iter()
        .any(|c| matches!(c.data_type(), DataType::Utf8View | DataType::BinaryView))
    {
        return Ok(batch);
    }
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Utf8View => Arc::new(c.as_string_view().gc()) as ArrayRef,
            DataType::BinaryView => Arc::new(c.as_binary_view().gc()) as ArrayRef,
            _ => Arc::clone(c),
        })
        .collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// Memory of the rows of `batch` alone, not of the buffers it slices.
fn batch_slice_bytes(batch: &RecordBatch) -> Result<usize> {
    let mut bytes = 0;
    for column in batch.columns() {
        bytes += column.to_data().get_slice_memory_size()?;
    }
    Ok(bytes)
}

/// Evaluates the sort keys of `batch` and encodes them as comparable rows.
pub struct KeyEncoder {
    ordering: LexOrdering,
    converter: RowConverter,
}

impl KeyEncoder {
    pub fn new(ordering: &LexOrdering, schema: &SchemaRef) -> Result<Self> {
        let fields = ordering
            .iter()
            .map(|e| {
                Ok(SortField::new_with_options(
                    e.expr.data_type(schema)?,
                    e.options,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            ordering: ordering.clone(),
            converter: RowConverter::new(fields)?,
        })
    }

    pub fn rows(&self, batch: &RecordBatch) -> Result<Rows> {
        let keys = self
            .ordering
            .iter()
            .map(|e| {
                Ok(kernel_float_order(
                    e.expr.evaluate(batch)?.into_array(batch.num_rows())?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(self.converter.convert_columns(&keys)?)
    }
}

/// Floats as the kernels order them: every NaN one positive NaN, -0.0 as
/// 0.0. (Float16 keys are left as they are: arrow-row's total order.)
fn kernel_float_order(array: ArrayRef) -> ArrayRef {
    macro_rules! fold {
        ($t:ty, $nan:expr, $zero:expr) => {
            Arc::new(array.as_primitive::<$t>().unary::<_, $t>(|v| {
                if v.is_nan() {
                    $nan
                } else if v == $zero {
                    $zero
                } else {
                    v
                }
            })) as ArrayRef
        };
    }
    match array.data_type() {
        DataType::Float64 => fold!(Float64Type, f64::NAN, 0.0f64),
        DataType::Float32 => fold!(Float32Type, f32::NAN, 0.0f32),
        _ => array,
    }
}

/// A run being merged: its reader, current batch (as a slot in the
/// merge's batch list) and row keys.
struct RunCursor {
    reader: FileReader<BufReader<File>>,
    slot: usize,
    rows: Option<Rows>,
    at: usize,
    len: usize,
}

impl MergeCursor for RunCursor {
    fn is_done(&self) -> bool {
        self.at >= self.len
    }

    fn less_than(&self, other: &Self) -> bool {
        let (a, b) = (self.rows.as_ref(), other.rows.as_ref());
        a.expect("loaded").row(self.at) < b.expect("loaded").row(other.at)
    }
}

/// Merges `runs` into output batches of `batch_rows`, handed to `emit`
/// (which returns false to stop early).
pub fn merge_runs(
    runs: &[Run],
    schema: &SchemaRef,
    keys: &KeyEncoder,
    batch_rows: usize,
    emit: &mut dyn FnMut(RecordBatch) -> Result<bool>,
) -> Result<()> {
    let mut batches: Vec<RecordBatch> = vec![];
    let mut cursors = vec![];
    for run in runs {
        let file = File::open(&run.path).map_err(io(&run.path))?;
        let reader = FileReader::try_new(BufReader::with_capacity(1 << 20, file), None)?;
        let mut c = RunCursor {
            reader,
            slot: 0,
            rows: None,
            at: 0,
            len: 0,
        };
        load_next(&mut c, &mut batches, keys)?;
        cursors.push(c);
    }
    let mut tree = LoserTree::new(cursors);
    let mut picks: Vec<(usize, usize)> = Vec::with_capacity(batch_rows);
    while let Some(w) = tree.winner() {
        let c = tree.cursor_mut(w);
        picks.push((c.slot, c.at));
        c.at += 1;
        if c.at >= c.len {
            load_next(c, &mut batches, keys)?;
        }
        tree.replay();
        if picks.len() >= batch_rows && !flush(&mut picks, &mut batches, &mut tree, schema, emit)? {
            return Ok(());
        }
    }
    if !picks.is_empty() {
        flush(&mut picks, &mut batches, &mut tree, schema, emit)?;
    }
    Ok(())
}

/// Moves cursor `c` to its run's next non-empty batch (or to done).
fn load_next(c: &mut RunCursor, batches: &mut Vec<RecordBatch>, keys: &KeyEncoder) -> Result<()> {
    for next in c.reader.by_ref() {
        let batch = next?;
        if batch.num_rows() == 0 {
            continue;
        }
        c.rows = Some(keys.rows(&batch)?);
        c.len = batch.num_rows();
        c.at = 0;
        c.slot = batches.len();
        batches.push(batch);
        return Ok(());
    }
    c.at = 0;
    c.len = 0;
    Ok(())
}

/// Emits the picked rows as one batch and keeps only the batches cursors
/// still read from.
fn flush(
    picks: &mut Vec<(usize, usize)>,
    batches: &mut Vec<RecordBatch>,
    tree: &mut LoserTree<RunCursor>,
    schema: &SchemaRef,
    emit: &mut dyn FnMut(RecordBatch) -> Result<bool>,
) -> Result<bool> {
    let refs: Vec<&RecordBatch> = batches.iter().collect();
    let out = if refs.is_empty() {
        RecordBatch::new_empty(Arc::clone(schema))
    } else {
        gc_views(interleave_record_batch(&refs, picks)?)?
    };
    picks.clear();
    let mut kept = vec![];
    let mut remap = vec![usize::MAX; batches.len()];
    for i in 0..tree.len() {
        let c = tree.cursor_mut(i);
        if !c.is_done() {
            if remap[c.slot] == usize::MAX {
                remap[c.slot] = kept.len();
                kept.push(batches[c.slot].clone());
            }
            c.slot = remap[c.slot];
        }
    }
    *batches = kept;
    emit(out)
}

/// Merges runs in passes of at most `fan_in` until one merge remains;
/// intermediate results become new runs, in batches of `batch_rows`.
pub fn reduce_runs(
    spill: &mut SpillRuns,
    schema: &SchemaRef,
    keys: &KeyEncoder,
    batch_rows: usize,
    fan_in: usize,
) -> Result<Vec<Run>> {
    let fan_in = fan_in.max(2);
    let mut runs = std::mem::take(&mut spill.runs);
    while runs.len() > fan_in {
        let mut next = vec![];
        for group in runs.chunks(fan_in) {
            let path = spill.next_path();
            let mut writer = RunWriter::create(&path, schema, batch_rows)?;
            merge_runs(group, schema, keys, batch_rows, &mut |b| {
                writer.write(&b)?;
                Ok(true)
            })?;
            next.push(writer.finish()?);
            for done in group {
                let _ = std::fs::remove_file(&done.path);
            }
        }
        runs = next;
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_runs_of_sorts_that_may_still_run_stay() {
        let device = tempfile::tempdir().unwrap();
        let live = SpillRuns::create(device.path()).unwrap();
        let spill = device.path().join(SPILL_DIR);
        let me = std::process::id();
        // No process has id 999999999: pids stay below 2^22 on Linux.
        let stale = [
            "sort-999999999-5-0".to_string(), // its process is gone
            format!("sort-{me}-1-0"),         // this pid, an earlier process
            format!("sort-{me}-0"),           // an older version's name
        ];
        // pid 1 runs as long as the system does.
        let kept = ["sort-1-5-0", "not-a-run-dir"];
        for name in stale.iter().map(String::as_str).chain(kept) {
            std::fs::create_dir_all(spill.join(name)).unwrap();
            std::fs::write(spill.join(name).join("run-000001.arrow"), b"x").unwrap();
        }
        remove_stale_runs(device.path());
        for name in &stale {
            assert!(!spill.join(name).exists(), "{name} is stale");
        }
        for name in kept {
            assert!(spill.join(name).exists(), "{name} stays");
        }
        assert!(live.dir.exists(), "a live sort's runs stay");
        let dir = live.dir.clone();
        drop(live);
        assert!(!dir.exists(), "a sort removes its own runs");
    }
}
