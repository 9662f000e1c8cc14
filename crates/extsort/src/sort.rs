//! The two-phase external merge sort of fixed-size records (paper 001).
//!
//! ```text
//!  sort phase   reader thread ──M bytes──▶ key sort (radix) ──▶ run writer: gather ──blocks of ≤ 32 MiB──▶ writer thread ─▶ run file
//!               (two chunk buffers: chunk k is gathered and written while chunk k+1's keys sort)
//!  merge phase  ⌈log_l(runs)⌉ passes; each merges groups of ≤ l runs through a
//!               loser tree: per run a reader thread one block ahead, one writer
//!               thread one block behind; the last pass writes OUT, split by
//!               key range into one loser tree per thread when memory allows
//! ```
//!
//! When the plan merges in one pass and memory allows, the last chunk is
//! not written: it stays in memory with its order, and a thread gathers
//! its records in order for the merge as a reader would read them.
//!
//! Runs may be stored compressed ([`crate::codec`]; the plan says): in
//! the sort phase every thread gathers a frame of records and compresses
//! it while it is in cache; a merge pass that writes a run hands its
//! blocks to a writer that compresses them while the next is merged; a
//! merge's reader threads decompress one frame ahead.
//!
//! OUT is written under a temporary name and renamed when complete; runs
//! live in a directory of their own that is removed on any exit and, if the
//! process dies, by the next run. Memory: the plan's buffers, all within
//! `mem` ([`crate::model`] says how they are sized).

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::time::Instant;

use insitu_kernels::mem::{huge_vec_with_capacity, take_vec_filled};
use insitu_kernels::radix::sort_pairs_with_ties;
use insitu_kernels::{gather_rows_into, prefetch};

use crate::blocks::{Block, BlockReader, BlockWriter, Recycler, Written};
use crate::codec::{
    compress_frames_from, measure_codec, stored_bytes_max, CodecChoice, FrameShape, FrameSource,
    RunCodec,
};
use crate::direct::{aligned_block_records, AlignedBuf, DIRECT_ALIGN};
use crate::files::{io_err, AtomicFile, RunDir};
use crate::loser::{LoserTree, MergeCursor};
use crate::model::{plan_with_run_bytes, Plan, Rates, FRAME_BYTES_MAX};
use crate::probe::storage_rates;
use crate::record::{check_shape, check_whole_records};
use crate::{ExtsortError, Result};

/// Bytes written and read to measure the storage at start (`probe_bytes`).
/// Planning a 4.3 GB sort took 0.20-0.27 s with 128 MiB against 0.34-0.47
/// s with 256 MiB (`--explain`, 4 runs each, alternating), and the rates
/// read the same: 1237-2636 MB/s read, 2173-2728 MB/s write, against
/// 1314-3043 and 2214-2466 (the disk's state moves them, not the size).
pub const PROBE_BYTES_MAX: u64 = 128 << 20;

/// What to sort and with what.
#[derive(Debug, Clone)]
pub struct ExtsortOptions {
    pub record_size: usize,
    pub key_size: usize,
    /// Memory budget for buffers (`mem_bytes_max`).
    pub mem_bytes: u64,
    /// Where runs go (default: OUT's directory).
    pub tmp_dir: Option<PathBuf>,
    pub threads: usize,
    /// How runs may be stored (`--run-codec`).
    pub run_codec: CodecChoice,
    /// Where storage rates are cached ([`crate::probe`]); `None`: always
    /// measure.
    pub storage_rates_cache: Option<PathBuf>,
    /// Measure the storage even if its rates are cached (`--reprobe`).
    pub reprobe: bool,
    /// Run size M in place of the model's choice (`--run-size`).
    pub run_bytes: Option<u64>,
}

/// Which phase a progress report is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Sort,
    /// Merge pass `n` (1-based); the last one writes OUT.
    Merge(u32),
}

/// Seconds each phase took, and where they went.
#[derive(Debug, Clone, Copy, Default)]
pub struct Measured {
    pub sort_secs: f64,
    pub merge_secs: f64,
    /// The sort phase's time as its two threads spent it.
    pub sort_times: SortTimes,
    /// The merge phase's, all passes together.
    pub merge_times: PhaseTimes,
    /// Runs written to storage.
    pub runs_written: u64,
    /// Runs merged from memory without being written (0 or 1).
    pub runs_in_memory: u64,
    /// Bytes written to runs (after compression) and to OUT.
    pub bytes_written: u64,
}

/// Where a phase's time went, on the thread that drives it: waiting for
/// storage (or for the threads that read and write it), and its own work.
/// What the fields leave of the phase's time is its own work too: in the
/// merge phase, the merge itself.
///
/// A phase that waits little for storage is bound by its own work; one
/// that waits most of its time is bound by storage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    /// Waiting for the next block of input or of a run.
    pub read_wait_secs: f64,
    /// Waiting for a writer to take a block, or to finish a file (the
    /// sort phase's key sort: for the run writer to take a chunk).
    pub write_wait_secs: f64,
    /// Sorting keys (the sort phase's main thread).
    pub sort_keys_secs: f64,
    /// Gathering records in key order, and compressing them if runs are
    /// compressed (the sort phase's run writer).
    pub gather_secs: f64,
}

/// The sort phase's time on its two threads, which overlap: the one
/// that sorts keys (`main`: reads, key sorts, waits for the run writer to
/// take a chunk or to finish the last) and the run writer (gathers
/// records and waits for the block writer).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SortTimes {
    pub main: PhaseTimes,
    pub run_writer: PhaseTimes,
}

/// Runs `f`, adding the time it took to `secs`.
fn timed<T>(secs: &mut f64, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    *secs += start.elapsed().as_secs_f64();
    out
}

/// Measures the storage and this machine's sort and merge rates, and plans.
pub fn plan_sort(input: &Path, output: &Path, options: &ExtsortOptions) -> Result<Plan> {
    check_shape(options.record_size, options.key_size)?;
    let len = std::fs::metadata(input).map_err(io_err(input))?.len();
    check_whole_records(input, len, options.record_size)?;
    let tmp = tmp_dir(output, options);
    std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
    let probe = len.clamp(16 << 20, PROBE_BYTES_MAX);
    let cache = options.storage_rates_cache.as_deref();
    // The probe runs before the sort holds anything: half the budget.
    let probe_buffers = (options.mem_bytes / 2).try_into().unwrap_or(usize::MAX);
    let storage = storage_rates(&tmp, probe, probe_buffers, cache, options.reprobe)?;
    let sample = (options.mem_bytes / 4).min(8 << 20);
    let cpu = measure_cpu(options, sample);
    let (lz4, snappy) = measure_codecs(input, len, options)?;
    let mut plan = plan_with_run_bytes(
        len,
        options.record_size as u64,
        options.mem_bytes,
        Rates {
            read: storage.read,
            write: storage.write,
            mixed: storage.mixed,
            sort: cpu.sort,
            sort_sample_bytes: sample,
            merge2: cpu.merge2,
            merge16: cpu.merge16,
            threads: options.threads.max(1) as u32,
            lz4,
            snappy,
        },
        options.run_codec,
        options.run_bytes,
    )?;
    plan.storage_rates_age = storage.cached_age;
    Ok(plan)
}

/// Bytes of the input the codecs are measured on (`codec_sample_bytes`).
pub const CODEC_SAMPLE_BYTES_MAX: u64 = 4 << 20;

/// Each codec's rates on the first [`CODEC_SAMPLE_BYTES_MAX`] bytes of
/// the input (whole records), where `--run-codec` allows it.
fn measure_codecs(
    input: &Path,
    len: u64,
    options: &ExtsortOptions,
) -> Result<(crate::codec::CodecRate, crate::codec::CodecRate)> {
    use std::io::Read;
    let r = options.record_size as u64;
    let take = len.min(CODEC_SAMPLE_BYTES_MAX) / r * r;
    let mut sample = vec![0u8; take as usize];
    File::open(input)
        .and_then(|mut f| f.read_exact(&mut sample))
        .map_err(io_err(input))?;
    let frame = (FRAME_BYTES_MAX / r).max(1) as usize * r as usize;
    let rate = |codec: RunCodec| {
        if options.run_codec.allows(codec) {
            measure_codec(codec, &sample, frame)
        } else {
            crate::codec::CodecRate::NONE
        }
    };
    Ok((rate(RunCodec::Lz4), rate(RunCodec::Snappy)))
}

fn tmp_dir(output: &Path, options: &ExtsortOptions) -> PathBuf {
    options
        .tmp_dir
        .clone()
        .unwrap_or_else(|| match output.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        })
}

/// Times each CPU rate is sampled; the fastest counts. One sample of a
/// few milliseconds varied 3x between runs here (other tenants, first
/// touches of fresh pages), and a slow one shrinks the planned runs.
const CPU_SAMPLES: usize = 3;

/// Sort and merge rates of this machine on `bytes` of synthetic records:
/// the best of [`CPU_SAMPLES`] samples each. The merge rates are the
/// loser tree's at fan-in 2 and 16 ([`Rates::merge`]).
fn measure_cpu(options: &ExtsortOptions, bytes: u64) -> CpuRates {
    let r = options.record_size;
    let k = options.key_size;
    let n = (bytes as usize / r).max(64);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut data = vec![0u8; n * r];
    for rec in data.chunks_exact_mut(r) {
        for b in rec[..k].iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    let mut out = AlignedBuf::with_capacity(data.len());
    let mut rates = CpuRates::default();
    // Half the sample, so the sample, its sorted copy and the runs to
    // merge (twice half) stay within `mem`: the sample is a quarter of it.
    let merge_sample = &data[..n / 2 * r];
    let sorted_parts = |parts: usize| -> Vec<Vec<u8>> {
        merge_sample
            .chunks((n / 2 / parts).max(1) * r)
            .map(|part| {
                let mut sorted = vec![0; part.len()];
                gather_records(part, r, &sort_chunk(part, r, k, 1), &mut sorted, 1);
                sorted
            })
            .collect()
    };
    let (two, sixteen) = (sorted_parts(2), sorted_parts(16));
    let best = |rate: &mut f64, bytes: usize, start: Instant| {
        *rate = rate.max(bytes as f64 / start.elapsed().as_secs_f64());
    };
    for _ in 0..CPU_SAMPLES {
        let start = Instant::now();
        let sorted = sort_chunk(&data, r, k, options.threads);
        let gathered = out.resize_for_overwrite(data.len());
        gather_records(&data, r, &sorted, gathered, options.threads);
        best(&mut rates.sort, data.len(), start);
        let start = Instant::now();
        let merged = merge_in_memory(&two, r, k, &mut out);
        best(&mut rates.merge2, merged, start);
        let start = Instant::now();
        let merged = merge_in_memory(&sixteen, r, k, &mut out);
        best(&mut rates.merge16, merged, start);
    }
    rates
}

/// This machine's rates for the model, bytes per second.
#[derive(Debug, Clone, Copy, Default)]
struct CpuRates {
    sort: f64,
    merge2: f64,
    merge16: f64,
}

/// Merges the sorted `runs` into `out` through the loser tree the merge
/// phase uses, with the same key comparison; returns the bytes merged.
fn merge_in_memory(runs: &[Vec<u8>], r: usize, k: usize, out: &mut AlignedBuf) -> usize {
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
struct SliceCursor<'a> {
    records: &'a [u8],
    at: usize,
    record: usize,
    key: usize,
    prefix: u128,
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
fn key_prefix(records: &[u8], at: usize, key: usize) -> u128 {
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
fn key_less<'r>(
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

/// The record order of `chunk` by key, stable: a radix sort on the key's
/// first 8 bytes, then, within each range of records those bytes tie, on
/// the next 8, and so on to the key's end.
///
/// Sorting 8-byte slices rather than 16-byte prefixes moves 12 bytes per
/// record per radix pass instead of 20: for 8M random 10-byte keys (an
/// 800 MB chunk, 2 threads, the heap on huge pages as `insitu extsort`
/// has it) keys were read and sorted in a median 0.295 s against 0.437 s
/// as 16-byte prefixes (16 alternating pairs, all faster).
/// Random keys rarely tie on 8 bytes; equal keys tie on every slice and
/// cost one more radix sort per slice.
pub fn sort_chunk(chunk: &[u8], r: usize, k: usize, threads: usize) -> Vec<u32> {
    assert!(chunk.len().is_multiple_of(r), "whole records");
    assert!(k > 0 && k <= r, "a key within the record");
    let n = chunk.len() / r;
    // Fresh zeroed pages (not a memset: 2.8% of a profiled sort).
    let mut keys = take_vec_filled::<u64>(n);
    extract_keys(chunk, r, k, &mut keys, threads);
    let mut idx = huge_vec_with_capacity(n);
    idx.extend(0..n as u32);
    let threads = threads.max(1);
    let ties = sort_pairs_with_ties(keys, &mut idx, threads);
    finish_ties(chunk, (r, k), SLICE_BYTES, &mut idx, ties, threads);
    debug_assert!(idx
        .windows(2)
        .all(|w| chunk[w[0] as usize * r..][..k] <= chunk[w[1] as usize * r..][..k]));
    idx
}

/// Key bytes one radix sort of [`sort_chunk`] orders.
const SLICE_BYTES: usize = 8;

/// Below this many records, a range whose keys tie so far is finished by
/// comparing the rest of the keys instead of another radix sort.
const TIES_RADIX_MIN: usize = 64;

/// Sorts `idx`, records whose keys tie on their first `from` bytes (in
/// stable order so far), by key bytes `from..k`, stably.
fn sort_ties(chunk: &[u8], (r, k): (usize, usize), from: usize, idx: &mut [u32], threads: usize) {
    let rest = |i: u32| &chunk[i as usize * r..][from..k];
    if idx.len() < TIES_RADIX_MIN {
        return idx.sort_by(|&a, &b| rest(a).cmp(rest(b)));
    }
    let keys = idx.iter().map(|&i| key_slice(rest(i))).collect();
    let ties = sort_pairs_with_ties(keys, idx, threads);
    finish_ties(chunk, (r, k), from + SLICE_BYTES, idx, ties, threads);
}

/// Sorts each of the `ties`, ranges of `idx` whose keys tie on their first
/// `from` bytes, by the bytes after (if the key has any). The radix kernel
/// keeps short ranges on one thread itself.
fn finish_ties(
    chunk: &[u8],
    (r, k): (usize, usize),
    from: usize,
    idx: &mut [u32],
    ties: Vec<Range<usize>>,
    threads: usize,
) {
    if k > from {
        for tie in ties {
            sort_ties(chunk, (r, k), from, &mut idx[tie], threads);
        }
    }
}

/// The first 8 of `bytes` (zero-padded) as a big-endian integer.
fn key_slice(bytes: &[u8]) -> u64 {
    match bytes.get(..SLICE_BYTES) {
        Some(whole) => u64::from_be_bytes(whole.try_into().expect("8 bytes")),
        None => {
            let mut padded = [0u8; SLICE_BYTES];
            padded[..bytes.len()].copy_from_slice(bytes);
            u64::from_be_bytes(padded)
        }
    }
}

/// `keys[i]` = the first 8 bytes of record `i`'s key ([`key_slice`]), on
/// `threads` threads.
fn extract_keys(chunk: &[u8], r: usize, k: usize, keys: &mut [u64], threads: usize) {
    let fill = |records: &[u8], keys: &mut [u64]| {
        for (rec, key) in records.chunks_exact(r).zip(keys.iter_mut()) {
            *key = key_slice(&rec[..k]);
        }
    };
    on_threads((chunk, r), (keys, 1), threads, fill);
}

/// A sorted run: on disk (its file, and for a compressed run the stored
/// length of each frame), or the sort phase's last chunk kept in memory
/// with its record order.
enum Run {
    File {
        path: PathBuf,
        frames: Option<Vec<u32>>,
    },
    Memory {
        chunk: Arc<Block>,
        order: Arc<Vec<u32>>,
    },
}

impl Run {
    fn path(&self) -> Option<&Path> {
        match self {
            Run::File { path, .. } => Some(path),
            Run::Memory { .. } => None,
        }
    }
}

/// A writer of a sorted stream: plain records to OUT (`to_run` false) or
/// a run file stored as the plan says.
fn stream_writer(
    file: File,
    path: &Path,
    block: usize,
    plan: &Plan,
    to_run: bool,
    threads: usize,
) -> Result<BlockWriter> {
    let compression =
        (to_run && plan.run_codec != RunCodec::None).then(|| frame_shape(plan, threads));
    BlockWriter::spawn_with(file, path, block, compression)
}

/// How `plan` cuts and compresses run frames, on `threads` threads.
fn frame_shape(plan: &Plan, threads: usize) -> FrameShape {
    FrameShape {
        codec: plan.run_codec,
        frame: plan.frame_bytes as usize,
        record: plan.record_size as usize,
        threads,
    }
}

/// Where sorted streams go, and how many bytes they took there.
struct Outputs {
    out: AtomicFile,
    runs_dir: RunDir,
    bytes_written: u64,
}

impl Outputs {
    /// Where the next sorted stream goes: OUT itself (its temp name; a
    /// clone of its descriptor) when this is the last step, else a new run
    /// file.
    fn target(&mut self, to_out: bool) -> Result<(File, PathBuf)> {
        if to_out {
            let out = &mut self.out;
            let file = out.file().try_clone().map_err(io_err(out.tmp_path()))?;
            return Ok((file, out.tmp_path().to_path_buf()));
        }
        let path = self.runs_dir.next_run();
        Ok((File::create(&path).map_err(io_err(&path))?, path))
    }
}

/// Records below this count are gathered, or their keys read, on one
/// thread.
const PARALLEL_RECORDS_MIN: usize = 4096;

/// `out` = the records of `chunk` that `order` names, in that order, on
/// `threads` threads: random reads of 100-byte records are the sort
/// phase's largest cost after the key sort.
fn gather_records(chunk: &[u8], r: usize, order: &[u32], out: &mut [u8], threads: usize) {
    assert_eq!(out.len(), order.len() * r, "room for the records named");
    let gather = |part: &[u32], dst: &mut [u8]| gather_rows_into(chunk, r, part, dst);
    on_threads((order, 1), (out, r), threads, gather);
}

/// `work` on parts of `input` and `output` that hold the same records,
/// one part per thread: each is given as a slice and the items it holds
/// per record. Below [`PARALLEL_RECORDS_MIN`] records, or on one thread,
/// `work` takes both whole on the calling thread.
fn on_threads<A: Sync, B: Send>(
    (input, input_per_record): (&[A], usize),
    (output, output_per_record): (&mut [B], usize),
    threads: usize,
    work: impl Fn(&[A], &mut [B]) + Sync,
) {
    let records = output.len() / output_per_record;
    debug_assert_eq!(input.len(), records * input_per_record, "the same records");
    if threads < 2 || records < PARALLEL_RECORDS_MIN {
        return work(input, output);
    }
    let per_thread = records.div_ceil(threads);
    let work = &work;
    std::thread::scope(|s| {
        let inputs = input.chunks(per_thread * input_per_record);
        for (part, dst) in inputs.zip(output.chunks_mut(per_thread * output_per_record)) {
            s.spawn(move || work(part, dst));
        }
    });
}

/// Sorts `input` into `output` as `plan` says; `progress` gets bytes
/// processed per phase.
pub fn extsort(
    input: &Path,
    output: &Path,
    options: &ExtsortOptions,
    plan: &Plan,
    progress: &(dyn Fn(Phase, u64) + Sync),
) -> Result<Measured> {
    let mut outputs = Outputs {
        out: AtomicFile::create(output)?,
        runs_dir: RunDir::create(&tmp_dir(output, options))?,
        bytes_written: 0,
    };
    let mut measured = Measured::default();
    let start = Instant::now();
    let runs = sort_phase(
        input,
        options,
        plan,
        &mut outputs,
        progress,
        &mut measured.sort_times,
    )?;
    measured.sort_secs = start.elapsed().as_secs_f64();
    measured.runs_in_memory = runs
        .iter()
        .filter(|r| matches!(r, Run::Memory { .. }))
        .count() as u64;
    measured.runs_written = runs.len() as u64 - measured.runs_in_memory;
    let start = Instant::now();
    if !runs.is_empty() {
        merge_phase(
            runs,
            options,
            plan,
            &mut outputs,
            progress,
            &mut measured.merge_times,
        )?;
    }
    measured.bytes_written = outputs.bytes_written;
    // Making OUT durable is the last write the merge waits for.
    timed(&mut measured.merge_times.write_wait_secs, || {
        outputs.out.commit()
    })?;
    measured.merge_secs = start.elapsed().as_secs_f64();
    Ok(measured)
}

/// Reads `M`-byte chunks, sorts each, writes it as a run (or, if the input
/// is one chunk, straight to OUT; or, if the plan says so, keeps the last
/// one in memory). Returns the runs in input order.
///
/// ```text
///   reader ──chunk k+1──▶ this thread: sort keys ──(chunk k, order)──▶ run writer: gather ──blocks──▶ writer
/// ```
///
/// The run writer gathers and writes chunk k while this thread sorts the
/// keys of chunk k+1, so storage writes while keys sort. Done one after
/// the other, the 8 GB benchmark's key sorts (`bench/extsort.sh 80000000
/// 2048 1`) took 5.28 s with the storage idle but for reads, and the
/// phase waited 6.03 s more for writes behind its 5.22 s of gathering. On
/// the 2 GB sort (`--mem 512MiB --run-size 200MiB`, alternating with a
/// build that waited for each run) the phase took 3.85, 3.70, 2.29 s
/// against 5.81, 4.37, 4.32 s in RAM (tmpfs), and 4.63, 3.70 s against
/// 5.42, 4.10 s on disk, where the model predicted 4.37 s.
///
/// Two chunk buffers, not three: the reader refills chunk k's buffer only
/// once run k is written. With a third (14 runs of 570 MiB in 2 GiB) this
/// thread waited 0.31-0.36 s for reads against 3.62-4.03 s, and as much
/// longer for the run writer: the 8 GB sort's phase took 7.82 and 7.41 s
/// against 7.76 and 7.39 s. This VM's disk moved 2.12 and 2.13 GB/s in
/// all (reads plus writes, 0.25 s samples of `/sys/block/vda/stat`), its
/// reads and writes sharing one channel.
fn sort_phase(
    input: &Path,
    options: &ExtsortOptions,
    plan: &Plan,
    outputs: &mut Outputs,
    progress: &dyn Fn(Phase, u64),
    times: &mut SortTimes,
) -> Result<Vec<Run>> {
    let r = options.record_size;
    // The short chunk first: the last is whole, and reading the first
    // (which nothing overlaps) takes less time.
    let first = plan.input_bytes - (plan.runs - 1) * plan.run_bytes;
    let mut reader = BlockReader::spawn_first(
        input,
        0,
        plan.input_bytes,
        first.max(1) as usize,
        plan.run_bytes as usize,
    )?;
    let one_run = plan.input_bytes <= plan.run_bytes;
    let (jobs, to_write) = sync_channel::<RunJob>(0);
    let recycler = reader.recycler();
    let (mut sorted, mut kept) = (0u64, None);
    let (handed, written) = std::thread::scope(|s| {
        let run_writer = std::thread::Builder::new()
            .name("insitu-runs".into())
            .spawn_scoped(s, || write_runs(to_write, recycler, plan, options, one_run))
            .map_err(|e| ExtsortError::Invalid(format!("cannot start the run writer: {e}")))?;
        // Bytes of the chunk handed last: written once the run writer
        // takes the next.
        let mut unreported = 0;
        let handed = (|| -> Result<()> {
            while let Some(chunk) = timed(&mut times.main.read_wait_secs, || reader.next_block())? {
                let order = timed(&mut times.main.sort_keys_secs, || {
                    sort_chunk(&chunk, r, options.key_size, options.threads)
                });
                sorted += 1;
                if sorted == plan.runs && plan.last_run_in_memory {
                    progress(Phase::Sort, chunk.len() as u64);
                    kept = Some(Run::Memory {
                        chunk: Arc::new(chunk),
                        order: Arc::new(order),
                    });
                    continue;
                }
                let (file, path) = outputs.target(one_run)?;
                let bytes = chunk.len() as u64;
                let job = RunJob {
                    chunk,
                    order,
                    file,
                    path,
                };
                // A closed channel: the run writer failed, and says why.
                if timed(&mut times.main.write_wait_secs, || jobs.send(job)).is_err() {
                    break;
                }
                progress(Phase::Sort, std::mem::replace(&mut unreported, bytes));
            }
            Ok(())
        })();
        drop(jobs);
        let written = timed(&mut times.main.write_wait_secs, || run_writer.join());
        progress(Phase::Sort, unreported);
        Ok::<_, ExtsortError>((handed, written))
    })?;
    let written = written
        .map_err(|_| ExtsortError::Invalid("the run writer panicked".into()))
        .and_then(|w| handed.and(w))?;
    outputs.bytes_written += written.bytes;
    times.run_writer = written.times;
    let mut runs = written.runs;
    runs.extend(kept);
    debug_assert!(
        one_run || runs.len() as u64 == plan.runs,
        "one run per chunk"
    );
    Ok(runs)
}

/// A sorted chunk on its way to storage: its records, their order, and
/// the file they go to.
struct RunJob {
    chunk: Block,
    order: Vec<u32>,
    file: File,
    path: PathBuf,
}

/// What the sort phase's run writer wrote.
struct WrittenRuns {
    /// The runs on disk, in the order their chunks came (none when the
    /// one chunk went to OUT).
    runs: Vec<Run>,
    bytes: u64,
    times: PhaseTimes,
}

/// The run writer: gathers each chunk's records in order into blocks and
/// hands them to a [`BlockWriter`], then gives the chunk back to the
/// reader. Compressed runs are gathered and compressed frame by frame on
/// every thread: the block writer thread only writes.
fn write_runs(
    jobs: Receiver<RunJob>,
    recycler: Recycler,
    plan: &Plan,
    options: &ExtsortOptions,
    one_run: bool,
) -> Result<WrittenRuns> {
    let r = options.record_size;
    // The plan sizes blocks as the writer fills them: whole records, and
    // whole pages when that many fit (`model::writer_block_bytes`).
    let block_records = plan.sort_block_bytes as usize / r;
    debug_assert_eq!(block_records, aligned_block_records(block_records * r, r));
    let block = block_records * r;
    let compress = !one_run && plan.run_codec != RunCodec::None;
    let shape = frame_shape(plan, options.threads);
    let stored_block = match compress {
        true => stored_bytes_max(block, shape.frame),
        false => block,
    };
    // One frame per compressing thread, kept across blocks.
    let mut scratch = vec![];
    let mut done = WrittenRuns {
        runs: vec![],
        bytes: 0,
        times: PhaseTimes::default(),
    };
    let times = &mut done.times;
    for RunJob {
        chunk,
        order,
        file,
        path,
    } in jobs
    {
        let mut frames = compress.then(Vec::new);
        let write = || -> Result<Written> {
            let mut writer = BlockWriter::spawn(file, &path, stored_block)?;
            for piece in order.chunks(block_records) {
                let mut out = timed(&mut times.write_wait_secs, || writer.buffer())?;
                timed(&mut times.gather_secs, || match frames.as_mut() {
                    Some(lens) => {
                        let source = FrameSource::Gather {
                            chunk: &chunk,
                            order: piece,
                        };
                        compress_frames_from(source, shape, &mut scratch, &mut out, lens);
                    }
                    None => {
                        let out = out.resize_for_overwrite(piece.len() * r);
                        gather_records(&chunk, r, piece, out, options.threads)
                    }
                });
                timed(&mut times.write_wait_secs, || writer.write(out))?;
            }
            timed(&mut times.write_wait_secs, || writer.finish())
        };
        let written = write();
        recycler.recycle(chunk);
        done.bytes += written?.bytes;
        if !one_run {
            done.runs.push(Run::File { path, frames });
        }
    }
    Ok(done)
}

/// One sorted run being merged: its current block and position.
struct RunCursor {
    reader: BlockReader,
    block: Block,
    at: usize,
    record: usize,
    key: usize,
    /// The current key's first 16 bytes, big-endian and zero-padded: one
    /// integer compare decides most (all, for keys up to 16 bytes).
    prefix: u128,
    /// Seconds spent waiting for this run's blocks.
    read_wait_secs: f64,
}

/// How far ahead in its block a run's bytes are prefetched as the merge
/// takes its records: a run's next record is wanted only after the other
/// runs' turns, but its key, read at once for the tree, missed the cache.
/// At 512 bytes the 2 GB sort (512 MiB budget, fan-in 10) merged in a
/// median 0.875 of the time without, over 10 alternating pairs (9 of them
/// faster); 1024 bytes gained less.
const MERGE_PREFETCH_BYTES: usize = 512;

/// Key bytes the cursor's integer prefix covers.
const PREFIX_BYTES: usize = 16;

/// The loser tree over `cursors` of `key`-byte keys: keyed by their
/// prefixes alone when those hold whole keys.
fn merge_tree<C: MergeCursor>(cursors: Vec<C>, key: usize) -> LoserTree<C> {
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
fn merge_phase(
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
fn merge_group(
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
struct Head {
    file: File,
    path: PathBuf,
    at: u64,
    len: usize,
}

/// A merge's output: records into blocks of exactly `block` bytes for a
/// [`BlockWriter`] (a record may straddle two blocks), after the [`Head`]
/// if there is one. Blocks of whole records and pages stay so when there
/// is no head.
struct MergeOut<'p> {
    writer: BlockWriter,
    buf: AlignedBuf,
    /// Bytes `buf` takes before it is handed on: the block, or the head's
    /// length while the head fills.
    limit: usize,
    block: usize,
    head: Option<Head>,
    progress: &'p dyn Fn(u64),
    write_wait_secs: f64,
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
fn merge_in_parts(
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
fn bytes_in_heads(starts: &[u64]) -> u64 {
    let heads = starts[1..starts.len() - 1].iter().zip(&starts[2..]);
    heads.map(|(&at, &end)| head_bytes(at, end)).sum()
}

/// Bytes of a part covering `at..end` of OUT up to the first page
/// boundary from `at` (its [`Head`]).
fn head_bytes(at: u64, end: u64) -> u64 {
    let page = DIRECT_ALIGN as u64;
    ((page - at % page) % page).min(end - at)
}

/// OUT opened twice for a part that covers `at..end` of it: for its writer
/// at the first page boundary from `at`, and for its [`Head`] before that.
fn part_files(path: &Path, at: u64, end: u64) -> Result<(File, Option<Head>)> {
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
struct RunKeys<'a> {
    records: u64,
    source: KeySource<'a>,
    record: usize,
    key: usize,
}

enum KeySource<'a> {
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
fn splitter_keys(runs: &[RunKeys], parts: usize) -> Result<Vec<Vec<u8>>> {
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
fn run_bounds(run: &RunKeys, splitters: &[Vec<u8>]) -> Result<Vec<u64>> {
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

/// Checks a sort's parameters before any work: a clear error, not a
/// half-done sort.
pub fn check_request(input: &Path, output: &Path) -> Result<()> {
    if input == output {
        return Err(ExtsortError::Invalid(
            "IN and OUT are the same file; sort into a new file".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records of `r` bytes with `k`-byte keys of few distinct values
    /// (duplicates; keys past 16 bytes share their prefix, so the tail
    /// decides), each payload its record number (stability shows).
    fn records(n: usize, r: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut data = vec![0u8; n * r];
        for (i, rec) in data.chunks_exact_mut(r).enumerate() {
            for (j, b) in rec[..k].iter_mut().enumerate() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = if j < 16 && k > 16 { 7 } else { (x % 3) as u8 };
            }
            let tail = &mut rec[k..];
            let len = tail.len().min(8);
            tail[..len].copy_from_slice(&(i as u64).to_le_bytes()[..len]);
        }
        data
    }

    /// The 16-byte load gives what copying the key's bytes gives, at
    /// every key length and at every position, the buffer's end included.
    #[test]
    fn key_prefix_is_the_zero_padded_key_wherever_it_lies() {
        let bytes: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(151) | 1).collect();
        for key in 1..=20 {
            for at in 0..=bytes.len() {
                let mut want = [0u8; PREFIX_BYTES];
                let take = key.min(PREFIX_BYTES);
                let want = match bytes.get(at..at + take) {
                    Some(k) => {
                        want[..take].copy_from_slice(k);
                        u128::from_be_bytes(want)
                    }
                    None => 0,
                };
                assert_eq!(key_prefix(&bytes, at, key), want, "key {key} at {at}");
            }
        }
    }

    /// On every thread count the order is the stable order by whole key,
    /// at sizes where the keys are read on one thread and on several, for
    /// keys shorter than, as long as, and longer than one 8-byte slice and
    /// two; keys of bytes 0-2 tie on their first slices in ranges of every
    /// size (and keys over 16 bytes tie on all of their first 16), so
    /// ranges are finished both by comparison and by radix, serial and
    /// parallel (the last size).
    #[test]
    fn sort_chunk_orders_records_stably_on_any_thread_count() {
        let sizes = [0, 1, 2, 7, 49, 50, 51, 1000, PARALLEL_RECORDS_MIN + 7];
        for (r, k) in [(100, 10), (30, 3), (30, 8), (30, 9), (40, 16), (40, 24)] {
            for n in sizes
                .into_iter()
                .chain((k == 10 || k == 24).then_some(140_001))
            {
                let data = records(n, r, k, (n + k) as u64);
                let mut want: Vec<u32> = (0..n as u32).collect();
                want.sort_by_key(|&i| &data[i as usize * r..][..k]);
                for threads in [1, 2, 3] {
                    let got = sort_chunk(&data, r, k, threads);
                    assert_eq!(got, want, "r {r} k {k} n {n} threads {threads}");
                }
            }
        }
    }

    /// The calibration merge orders records as the merge phase does: by
    /// the whole key, past the 16-byte prefix too, and stably (ties keep
    /// run order), so its rate is the merge phase's work.
    #[test]
    fn merge_in_memory_orders_runs_by_their_whole_keys() {
        for (r, k) in [(100, 10), (40, 24)] {
            for runs in [1, 2, 7, 16] {
                for n in [0, 1, 2, 7, 49, 50, 51, 1000] {
                    let data = records(n, r, k, (n * runs + k) as u64);
                    let parts: Vec<Vec<u8>> = data
                        .chunks((n.div_ceil(runs)).max(1) * r)
                        .map(|part| {
                            let mut sorted = vec![0; part.len()];
                            gather_records(part, r, &sort_chunk(part, r, k, 1), &mut sorted, 1);
                            sorted
                        })
                        .collect();
                    let mut out = AlignedBuf::with_capacity(data.len());
                    assert_eq!(merge_in_memory(&parts, r, k, &mut out), n * r);
                    let mut want: Vec<&[u8]> = data.chunks(r).collect();
                    want.sort_by(|a, b| a[..k].cmp(&b[..k]));
                    assert_eq!(&out[..], want.concat(), "r {r} k {k} runs {runs} n {n}");
                }
            }
        }
    }
}
