//! The merge phase: passes of loser-tree merges of up to l runs each, a
//! reader thread one block ahead per run and a writer thread one block
//! behind; the last pass writes OUT.
//!
//! The last pass of plain runs can run on every thread: splitter keys cut every run into
//! key ranges, and each thread merges one range into its own stretch of
//! OUT. Equal keys stay in one range, so the sort stays stable.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use insitu_kernels::prefetch;

use crate::blocks::{Block, BlockReader, BlockWriter, Written};
use crate::codec::RunCodec;
use crate::direct::{AlignedBuf, DIRECT_ALIGN};
use crate::files::io_err;
use crate::loser::{LoserTree, MergeCursor};
use crate::model::Plan;
use crate::options::ExtsortOptions;
use crate::report::{timed, Phase, PhaseTimes};
use crate::run_phase::{stream_writer, Outputs, Run};
use crate::{ExtsortError, Result};

/// Merges the sorted `runs` into `out` through the loser tree the merge
/// phase uses, with the same key comparison; returns the bytes merged.
pub(crate) fn merge_in_memory(runs: &[Vec<u8>], r: usize, k: usize, out: &mut AlignedBuf) -> usize {
    out.clear();
    let cursors = runs.iter().map(|run| SliceCursor::new(run, r, k)).collect();
    let mut tree = merge_tree(cursors, k);
    while let Some(w) = tree.winner() {
        out.extend_from_slice(tree.cursor(w).current());
        tree.cursor_mut(w).advance();
        tree.replay();
    }
    std::hint::black_box(&out);
    out.len()
}

/// A sorted run in memory, merged as a [`RunCursor`] is.
pub(crate) struct SliceCursor<'a> {
    pub(crate) records: &'a [u8],
    pub(crate) at: usize,
    pub(crate) record: usize,
    pub(crate) key: usize,
    pub(crate) prefix: u128,
}

impl<'a> SliceCursor<'a> {
    fn new(records: &'a [u8], record: usize, key: usize) -> Self {
        let mut cursor = Self {
            records,
            at: 0,
            record,
            key,
            prefix: 0,
        };
        cursor.prefix = key_prefix(records, 0, key);
        cursor
    }

    fn current(&self) -> &[u8] {
        &self.records[self.at..self.at + self.record]
    }

    fn advance(&mut self) {
        self.at += self.record;
        self.prefix = key_prefix(self.records, self.at, self.key);
    }
}

impl MergeCursor for SliceCursor<'_> {
    fn is_done(&self) -> bool {
        self.at >= self.records.len()
    }

    #[inline]
    fn prefix(&self) -> u128 {
        self.prefix
    }

    #[inline]
    fn less_than(&self, other: &Self) -> bool {
        key_less(self.prefix, other.prefix, self.key, || {
            (&self.records[self.at..], &other.records[other.at..])
        })
    }
}

/// The first [`PREFIX_BYTES`] bytes of the key of the record at `at` of
/// `records`, big-endian and zero-padded (0 past the end).
#[inline]
pub(crate) fn key_prefix(records: &[u8], at: usize, key: usize) -> u128 {
    let take = key.min(PREFIX_BYTES);
    // One 16-byte load, the bytes past the key masked off: a copy of
    // `take` bytes would be a call to `memcpy` per record.
    if let Some(bytes) = records.get(at..at + PREFIX_BYTES) {
        let whole = u128::from_be_bytes(bytes.try_into().expect("16 bytes"));
        return match take {
            PREFIX_BYTES => whole,
            _ => whole & !(u128::MAX >> (8 * take)),
        };
    }
    let Some(key) = records.get(at..at + take) else {
        return 0;
    };
    let mut bytes = [0u8; PREFIX_BYTES];
    bytes[..key.len()].copy_from_slice(key);
    u128::from_be_bytes(bytes)
}

/// Whether record `a` sorts before record `b` by their `key`-byte keys,
/// given each key's prefix ([`key_prefix`]); `records` gives both records'
/// bytes on, and is called only when the prefixes tie on a longer key, so
/// the merge's usual compare slices nothing.
#[inline]
pub(crate) fn key_less<'r>(
    a: u128,
    b: u128,
    key: usize,
    records: impl FnOnce() -> (&'r [u8], &'r [u8]),
) -> bool {
    if a != b || key <= PREFIX_BYTES {
        return a < b;
    }
    let (a, b) = records();
    a[..key] < b[..key]
}

/// One sorted run being merged: its current block and position.
pub(crate) struct RunCursor {
    pub(crate) reader: BlockReader,
    pub(crate) block: Block,
    pub(crate) at: usize,
    pub(crate) record: usize,
    pub(crate) key: usize,
    /// The current key's first 16 bytes, big-endian and zero-padded: one
    /// integer compare decides most (all, for keys up to 16 bytes).
    pub(crate) prefix: u128,
    /// Seconds spent waiting for this run's blocks.
    pub(crate) read_wait_secs: f64,
}

/// How far ahead in its block a run's bytes are prefetched as the merge
/// takes its records: a run's next record is wanted only after the other
/// runs' turns, but its key, read at once for the tree, missed the cache.
/// At 512 bytes the 2 GB sort (512 MiB budget, fan-in 10) merged in a
/// median 0.875 of the time without, over 10 alternating pairs (9 of them
/// faster); 1024 bytes gained less.
pub(crate) const MERGE_PREFETCH_BYTES: usize = 512;

/// Key bytes the cursor's integer prefix covers.
pub(crate) const PREFIX_BYTES: usize = 16;

/// The loser tree over `cursors` of `key`-byte keys: keyed by their
/// prefixes alone when those hold whole keys.
pub(crate) fn merge_tree<C: MergeCursor>(cursors: Vec<C>, key: usize) -> LoserTree<C> {
    match key <= PREFIX_BYTES {
        true => LoserTree::new_keyed_by_prefix(cursors),
        false => LoserTree::new(cursors),
    }
}

impl RunCursor {
    /// Starts reading `run`, or its records `range` (plain and in-memory
    /// runs only): its reader fetches the first block at once.
    fn spawn_reader(run: &Run, range: Option<Range<u64>>, plan: &Plan) -> Result<BlockReader> {
        let record = plan.record_size as usize;
        Ok(match run {
            Run::File {
                path,
                frames: Some(frames),
            } => {
                assert!(range.is_none(), "compressed runs are read whole");
                let frame = plan.frame_bytes as usize;
                BlockReader::spawn_frames(path, plan.run_codec, frames.clone(), frame)?
            }
            Run::File { path, frames: None } => {
                let len = std::fs::metadata(path).map_err(io_err(path))?.len();
                let r = record as u64;
                let range = range.unwrap_or(0..len / r);
                let (at, len) = (range.start * r, (range.end - range.start) * r);
                BlockReader::spawn(path, at, len, plan.merge_block_bytes as usize)?
            }
            // Blocks the size a run on disk would hand out: what the
            // plan holds for each run.
            Run::Memory { chunk, order } => {
                let block = match plan.run_codec {
                    RunCodec::None => plan.merge_block_bytes,
                    _ => plan.frame_bytes,
                };
                let range = range.map_or(0..order.len(), |r| r.start as usize..r.end as usize);
                let (chunk, order) = (chunk.clone(), order.clone());
                BlockReader::spawn_gather(chunk, order, range, record, block as usize)?
            }
        })
    }

    /// A cursor at the first record of `reader`'s run (waits for its
    /// first block).
    fn start(mut reader: BlockReader, plan: &Plan, key: usize) -> Result<Self> {
        let record = plan.record_size as usize;
        let mut read_wait_secs = 0.0;
        let block = timed(&mut read_wait_secs, || reader.next_block())?.unwrap_or_default();
        let mut cursor = Self {
            reader,
            block,
            at: 0,
            record,
            key,
            prefix: 0,
            read_wait_secs,
        };
        cursor.load_prefix();
        Ok(cursor)
    }

    fn load_prefix(&mut self) {
        if self.at < self.block.len() {
            self.prefix = key_prefix(&self.block, self.at, self.key);
        }
    }

    fn current(&self) -> &[u8] {
        &self.block[self.at..self.at + self.record]
    }

    fn advance(&mut self) -> Result<()> {
        self.at += self.record;
        prefetch(
            self.block
                .as_ptr()
                .wrapping_add(self.at + MERGE_PREFETCH_BYTES),
        );
        if self.at >= self.block.len() {
            let reader = &mut self.reader;
            let next = timed(&mut self.read_wait_secs, || reader.next_block())?;
            let next = next.unwrap_or_default();
            let done = std::mem::replace(&mut self.block, next);
            self.reader.recycle(done);
            self.at = 0;
        }
        self.load_prefix();
        Ok(())
    }
}

impl MergeCursor for RunCursor {
    fn is_done(&self) -> bool {
        self.at >= self.block.len()
    }

    #[inline]
    fn prefix(&self) -> u128 {
        self.prefix
    }

    #[inline]
    fn less_than(&self, other: &Self) -> bool {
        key_less(self.prefix, other.prefix, self.key, || {
            (&self.block[self.at..], &other.block[other.at..])
        })
    }
}

/// Merges runs in passes of fan-in `plan.fan_in`; the last pass writes OUT,
/// on [`Plan::merge_parts`] threads when the plan says so.
pub(crate) fn merge_phase(
    mut runs: Vec<Run>,
    options: &ExtsortOptions,
    plan: &Plan,
    outputs: &mut Outputs,
    progress: &(dyn Fn(Phase, u64) + Sync),
    times: &mut PhaseTimes,
) -> Result<()> {
    let fan_in = plan.fan_in.max(2) as usize;
    let mut pass = 0;
    loop {
        pass += 1;
        let last = runs.len() <= fan_in;
        let progress = |n| progress(Phase::Merge(pass), n);
        if last && plan.merge_parts > 1 && runs.len() > 1 {
            let merged: Vec<PathBuf> = runs.iter().filter_map(Run::path).map(Into::into).collect();
            outputs.bytes_written +=
                merge_in_parts(&runs, outputs, options, plan, &progress, times)?;
            drop(runs);
            for merged in merged {
                let _ = std::fs::remove_file(merged);
            }
            return Ok(());
        }
        let mut next = vec![];
        let mut left = runs.into_iter();
        loop {
            let group: Vec<Run> = left.by_ref().take(fan_in).collect();
            if group.is_empty() {
                break;
            }
            let merged: Vec<PathBuf> = group.iter().filter_map(Run::path).map(Into::into).collect();
            let (file, path) = outputs.target(last)?;
            let block = plan.merge_block_bytes as usize;
            let writer = stream_writer(file, &path, block, plan, !last, options.threads)?;
            let readers = group
                .iter()
                .map(|run| RunCursor::spawn_reader(run, None, plan))
                .collect::<Result<Vec<_>>>()?;
            drop(group);
            let out = MergeOut::new(writer, block, None, &progress)?;
            let done = merge_group(readers, out, options.key_size, plan, times)?;
            outputs.bytes_written += done.bytes;
            let frames = done.frames;
            for merged in merged {
                let _ = std::fs::remove_file(merged);
            }
            next.push(Run::File { path, frames });
        }
        if last {
            return Ok(());
        }
        runs = next;
    }
}

/// Merges the runs `readers` read into `out` through a loser tree. Every
/// run's first read is in flight before this waits for any: one after
/// another, the first blocks of 10 runs took 0.35 s here, all at once
/// 0.20 s.
pub(crate) fn merge_group(
    readers: Vec<BlockReader>,
    mut out: MergeOut,
    key: usize,
    plan: &Plan,
    times: &mut PhaseTimes,
) -> Result<Written> {
    let cursors = readers
        .into_iter()
        .map(|reader| RunCursor::start(reader, plan, key))
        .collect::<Result<Vec<_>>>()?;
    let mut tree = merge_tree(cursors, key);
    while let Some(w) = tree.winner() {
        out.push(tree.cursor(w).current())?;
        tree.cursor_mut(w).advance()?;
        tree.replay();
    }
    times.read_wait_secs += (tree.into_cursors().iter())
        .map(|c| c.read_wait_secs)
        .sum::<f64>();
    let (written, write_wait_secs) = out.finish()?;
    times.write_wait_secs += write_wait_secs;
    Ok(written)
}

/// Where a part of OUT that starts mid-page writes its first bytes, up to
/// the next page boundary: apart from its writer, with plain (buffered)
/// writes, so that the writer's own requests start aligned and go direct.
pub(crate) struct Head {
    pub(crate) file: File,
    pub(crate) path: PathBuf,
    pub(crate) at: u64,
    pub(crate) len: usize,
}

/// A merge's output: records into blocks of exactly `block` bytes for a
/// [`BlockWriter`] (a record may straddle two blocks), after the [`Head`]
/// if there is one. Blocks of whole records and pages stay so when there
/// is no head.
pub(crate) struct MergeOut<'p> {
    pub(crate) writer: BlockWriter,
    pub(crate) buf: AlignedBuf,
    /// Bytes `buf` takes before it is handed on: the block, or the head's
    /// length while the head fills.
    pub(crate) limit: usize,
    pub(crate) block: usize,
    pub(crate) head: Option<Head>,
    pub(crate) progress: &'p dyn Fn(u64),
    pub(crate) write_wait_secs: f64,
}

impl<'p> MergeOut<'p> {
    fn new(
        mut writer: BlockWriter,
        block: usize,
        head: Option<Head>,
        progress: &'p dyn Fn(u64),
    ) -> Result<Self> {
        let mut write_wait_secs = 0.0;
        let buf = timed(&mut write_wait_secs, || writer.buffer())?;
        let head = head.filter(|h| h.len > 0);
        Ok(Self {
            writer,
            buf,
            limit: head.as_ref().map_or(block, |h| h.len),
            block,
            head,
            progress,
            write_wait_secs,
        })
    }

    #[inline]
    fn push(&mut self, record: &[u8]) -> Result<()> {
        if self.buf.len() + record.len() < self.limit {
            self.buf.extend_from_slice(record);
            return Ok(());
        }
        self.push_across(record)
    }

    /// `bytes` up to the end of the current block (or head), which goes
    /// out, and the rest into the next.
    #[cold]
    fn push_across(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let take = (self.limit - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.buf.len() == self.limit {
                self.hand_on()?;
            }
        }
        Ok(())
    }

    /// Writes the head, or queues the block for the writer and takes an
    /// empty one.
    fn hand_on(&mut self) -> Result<()> {
        (self.progress)(self.buf.len() as u64);
        if let Some(head) = self.head.take() {
            let file = &head.file;
            file.write_all_at(&self.buf, head.at)
                .map_err(io_err(&head.path))?;
            self.buf.clear();
            self.limit = self.block;
            return Ok(());
        }
        let writer = &mut self.writer;
        let next = timed(&mut self.write_wait_secs, || writer.buffer())?;
        let full = std::mem::replace(&mut self.buf, next);
        timed(&mut self.write_wait_secs, || writer.write(full))
    }

    /// Hands on what is left and waits for the writer; returns what it
    /// wrote (the head not counted) and the seconds spent waiting for it.
    fn finish(mut self) -> Result<(Written, f64)> {
        if !self.buf.is_empty() {
            match self.head.is_some() {
                true => self.hand_on()?,
                false => {
                    (self.progress)(self.buf.len() as u64);
                    let writer = &mut self.writer;
                    timed(&mut self.write_wait_secs, || writer.write(self.buf))?;
                }
            }
        }
        let written = timed(&mut self.write_wait_secs, || self.writer.finish())?;
        Ok((written, self.write_wait_secs))
    }
}

/// The last pass on [`Plan::merge_parts`] threads. Splitter keys cut every
/// run into key ranges; part j merges the j-th range of every run into its
/// own stretch of OUT, which starts where the ranges before it end:
///
/// ```text
///   run 0  [ part 0 records     | part 1 records  ]
///   run 1  [ part 0 | part 1 records              ]
///   OUT    [ part 0: both runs' | part 1: both runs' ]
///                               ^ part 1 writes up to the next page apart
///                                 ([`Head`]), then direct
/// ```
///
/// Equal keys fall in one part, which merges them in run order: the merge
/// stays stable. Returns the bytes written.
pub(crate) fn merge_in_parts(
    runs: &[Run],
    outputs: &mut Outputs,
    options: &ExtsortOptions,
    plan: &Plan,
    progress: &(dyn Fn(u64) + Sync),
    times: &mut PhaseTimes,
) -> Result<u64> {
    let (r, k) = (options.record_size, options.key_size);
    let parts = plan.merge_parts as usize;
    let keys = runs
        .iter()
        .map(|run| RunKeys::open(run, r, k))
        .collect::<Result<Vec<_>>>()?;
    let splitters = splitter_keys(&keys, parts)?;
    // bounds[i][j]: run i's first record of part j (j = parts: its end).
    let bounds = keys
        .iter()
        .map(|run| run_bounds(run, &splitters))
        .collect::<Result<Vec<_>>>()?;
    drop(keys);
    let starts: Vec<u64> = (0..=parts)
        .map(|j| bounds.iter().map(|b| b[j]).sum::<u64>() * r as u64)
        .collect();
    let (first, path) = outputs.target(true)?;
    let block = plan.merge_block_bytes as usize;
    let mut first = Some(first);
    let mut jobs = vec![];
    for j in 0..parts {
        let (at, end) = (starts[j], starts[j + 1]);
        let (file, head) = match first.take() {
            Some(file) => (file, None),
            None => part_files(&path, at, end)?,
        };
        let writer = stream_writer(file, &path, block, plan, false, 1)?;
        let readers = runs
            .iter()
            .zip(&bounds)
            .map(|(run, b)| RunCursor::spawn_reader(run, Some(b[j]..b[j + 1]), plan))
            .collect::<Result<Vec<_>>>()?;
        jobs.push((readers, writer, head));
    }
    let results: Vec<Result<(Written, PhaseTimes, f64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|(readers, writer, head)| {
                s.spawn(move || {
                    let start = Instant::now();
                    let mut times = PhaseTimes::default();
                    let out = MergeOut::new(writer, block, head, progress)?;
                    let written = merge_group(readers, out, k, plan, &mut times)?;
                    Ok((written, times, start.elapsed().as_secs_f64()))
                })
            })
            .collect();
        let panicked = || Err(ExtsortError::Invalid("a merge thread panicked".into()));
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panicked()))
            .collect()
    });
    let mut bytes = 0;
    let mut slowest = (f64::MIN, PhaseTimes::default());
    for result in results {
        let (written, part_times, secs) = result?;
        bytes += written.bytes;
        if secs > slowest.0 {
            slowest = (secs, part_times);
        }
    }
    // The phase waits for its slowest part: its waits are the phase's.
    times.read_wait_secs += slowest.1.read_wait_secs;
    times.write_wait_secs += slowest.1.write_wait_secs;
    let bytes = bytes + bytes_in_heads(&starts);
    debug_assert_eq!(bytes, starts[parts], "every part wrote its stretch");
    Ok(bytes)
}

/// Bytes the parts after the first write through their [`Head`]s.
pub(crate) fn bytes_in_heads(starts: &[u64]) -> u64 {
    let heads = starts[1..starts.len() - 1].iter().zip(&starts[2..]);
    heads.map(|(&at, &end)| head_bytes(at, end)).sum()
}

/// Bytes of a part covering `at..end` of OUT up to the first page
/// boundary from `at` (its [`Head`]).
pub(crate) fn head_bytes(at: u64, end: u64) -> u64 {
    let page = DIRECT_ALIGN as u64;
    ((page - at % page) % page).min(end - at)
}

/// OUT opened twice for a part that covers `at..end` of it: for its writer
/// at the first page boundary from `at`, and for its [`Head`] before that.
pub(crate) fn part_files(path: &Path, at: u64, end: u64) -> Result<(File, Option<Head>)> {
    use std::io::{Seek, SeekFrom};
    let len = head_bytes(at, end);
    let open = || File::options().write(true).open(path).map_err(io_err(path));
    let mut file = open()?;
    file.seek(SeekFrom::Start(at + len)).map_err(io_err(path))?;
    let head = Head {
        file: open()?,
        path: path.to_path_buf(),
        at,
        len: len as usize,
    };
    Ok((file, Some(head)))
}

/// The keys of a sorted run, by record number, for splitting it: read
/// from its file (plain runs) or its chunk in memory.
pub(crate) struct RunKeys<'a> {
    pub(crate) records: u64,
    pub(crate) source: KeySource<'a>,
    pub(crate) record: usize,
    pub(crate) key: usize,
}

pub(crate) enum KeySource<'a> {
    File(File, &'a Path),
    Memory(&'a Block, &'a [u32]),
}

impl<'a> RunKeys<'a> {
    fn open(run: &'a Run, record: usize, key: usize) -> Result<Self> {
        let (records, source) = match run {
            Run::File { path, frames: None } => {
                let file = File::open(path).map_err(io_err(path))?;
                let len = file.metadata().map_err(io_err(path))?.len();
                (len / record as u64, KeySource::File(file, path))
            }
            Run::File { .. } => unreachable!("compressed runs merge on one thread"),
            Run::Memory { chunk, order } => (order.len() as u64, KeySource::Memory(chunk, order)),
        };
        Ok(Self {
            records,
            source,
            record,
            key,
        })
    }

    /// Record `i`'s key into `out` (`key` bytes).
    fn key_at(&self, i: u64, out: &mut [u8]) -> Result<()> {
        debug_assert!(i < self.records);
        match &self.source {
            KeySource::File(file, path) => file
                .read_exact_at(out, i * self.record as u64)
                .map_err(io_err(path)),
            KeySource::Memory(chunk, order) => {
                let at = order[i as usize] as usize * self.record;
                out.copy_from_slice(&chunk[at..at + self.key]);
                Ok(())
            }
        }
    }

    /// Records whose keys sort before `key`.
    fn lower_bound(&self, key: &[u8]) -> Result<u64> {
        let (mut lo, mut hi) = (0, self.records);
        let mut probe = vec![0; self.key];
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            self.key_at(mid, &mut probe)?;
            match probe.as_slice() < key {
                true => lo = mid + 1,
                false => hi = mid,
            }
        }
        Ok(lo)
    }
}

/// `parts - 1` keys that cut the runs into `parts` ranges of about equal
/// size: the j-th is the median over the runs of each run's key at the
/// j-th `parts`-quantile (non-decreasing in j, as each run's are).
pub(crate) fn splitter_keys(runs: &[RunKeys], parts: usize) -> Result<Vec<Vec<u8>>> {
    let key = runs.first().map_or(0, |r| r.key);
    (1..parts)
        .map(|j| {
            let mut keys = vec![];
            for run in runs.iter().filter(|r| r.records > 0) {
                let mut k = vec![0; key];
                run.key_at(run.records * j as u64 / parts as u64, &mut k)?;
                keys.push(k);
            }
            keys.sort_unstable();
            Ok(keys.get(keys.len() / 2).cloned().unwrap_or_default())
        })
        .collect()
}

/// A run's part boundaries: 0, its records before each splitter, and its
/// record count.
pub(crate) fn run_bounds(run: &RunKeys, splitters: &[Vec<u8>]) -> Result<Vec<u64>> {
    let mut bounds = vec![0];
    for s in splitters {
        bounds.push(run.lower_bound(s)?);
    }
    bounds.push(run.records);
    debug_assert!(
        bounds.windows(2).all(|w| w[0] <= w[1]),
        "splitters in order"
    );
    Ok(bounds)
}
