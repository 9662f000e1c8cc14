//! The sort phase: chunks of M bytes read by a reader thread, their keys
//! radix-sorted (ties settled on the next key bytes), and a run writer
//! that gathers each chunk's records in order (compressing frames on every
//! thread when the plan says) while the next chunk's keys sort.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use insitu_kernels::gather_rows_into;
use insitu_kernels::mem::{huge_vec_with_capacity, take_vec_filled};
use insitu_kernels::radix::sort_pairs_with_ties;

use crate::blocks::{Block, BlockReader, BlockWriter, Recycler, Written};
use crate::codec::{compress_frames_from, stored_bytes_max, FrameShape, FrameSource, RunCodec};
use crate::direct::aligned_block_records;
use crate::files::{io_err, AtomicFile, RunDir};
use crate::model::Plan;
use crate::options::ExtsortOptions;
use crate::report::{timed, Phase, PhaseTimes, SortTimes};
use crate::{ExtsortError, Result};

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
pub(crate) const SLICE_BYTES: usize = 8;

/// Below this many records, a range whose keys tie so far is finished by
/// comparing the rest of the keys instead of another radix sort.
pub(crate) const TIES_RADIX_MIN: usize = 64;

/// Sorts `idx`, records whose keys tie on their first `from` bytes (in
/// stable order so far), by key bytes `from..k`, stably.
pub(crate) fn sort_ties(
    chunk: &[u8],
    (r, k): (usize, usize),
    from: usize,
    idx: &mut [u32],
    threads: usize,
) {
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
pub(crate) fn finish_ties(
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
pub(crate) fn key_slice(bytes: &[u8]) -> u64 {
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
pub(crate) fn extract_keys(chunk: &[u8], r: usize, k: usize, keys: &mut [u64], threads: usize) {
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
pub(crate) enum Run {
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
    pub(crate) fn path(&self) -> Option<&Path> {
        match self {
            Run::File { path, .. } => Some(path),
            Run::Memory { .. } => None,
        }
    }
}

/// A writer of a sorted stream: plain records to OUT (`to_run` false) or
/// a run file stored as the plan says.
pub(crate) fn stream_writer(
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
pub(crate) fn frame_shape(plan: &Plan, threads: usize) -> FrameShape {
    FrameShape {
        codec: plan.run_codec,
        frame: plan.frame_bytes as usize,
        record: plan.record_size as usize,
        threads,
    }
}

/// Where sorted streams go, and how many bytes they took there.
pub(crate) struct Outputs {
    pub(crate) out: AtomicFile,
    pub(crate) runs_dir: RunDir,
    pub(crate) bytes_written: u64,
}

impl Outputs {
    /// Where the next sorted stream goes: OUT itself (its temp name; a
    /// clone of its descriptor) when this is the last step, else a new run
    /// file.
    pub(crate) fn target(&mut self, to_out: bool) -> Result<(File, PathBuf)> {
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
pub(crate) const PARALLEL_RECORDS_MIN: usize = 4096;

/// `out` = the records of `chunk` that `order` names, in that order, on
/// `threads` threads: random reads of 100-byte records are the sort
/// phase's largest cost after the key sort.
pub(crate) fn gather_records(
    chunk: &[u8],
    r: usize,
    order: &[u32],
    out: &mut [u8],
    threads: usize,
) {
    assert_eq!(out.len(), order.len() * r, "room for the records named");
    let gather = |part: &[u32], dst: &mut [u8]| gather_rows_into(chunk, r, part, dst);
    on_threads((order, 1), (out, r), threads, gather);
}

/// `work` on parts of `input` and `output` that hold the same records,
/// one part per thread: each is given as a slice and the items it holds
/// per record. Below [`PARALLEL_RECORDS_MIN`] records, or on one thread,
/// `work` takes both whole on the calling thread.
pub(crate) fn on_threads<A: Sync, B: Send>(
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
pub(crate) fn sort_phase(
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
pub(crate) struct RunJob {
    pub(crate) chunk: Block,
    pub(crate) order: Vec<u32>,
    pub(crate) file: File,
    pub(crate) path: PathBuf,
}

/// What the sort phase's run writer wrote.
pub(crate) struct WrittenRuns {
    /// The runs on disk, in the order their chunks came (none when the
    /// one chunk went to OUT).
    pub(crate) runs: Vec<Run>,
    pub(crate) bytes: u64,
    pub(crate) times: PhaseTimes,
}

/// The run writer: gathers each chunk's records in order into blocks and
/// hands them to a [`BlockWriter`], then gives the chunk back to the
/// reader. Compressed runs are gathered and compressed frame by frame on
/// every thread: the block writer thread only writes.
pub(crate) fn write_runs(
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
