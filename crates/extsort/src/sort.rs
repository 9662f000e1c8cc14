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
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::codec::{measure_codec, RunCodec};
use crate::direct::AlignedBuf;
use crate::files::{io_err, AtomicFile, RunDir};
use crate::model::{plan_with_run_bytes, Plan, Rates, FRAME_BYTES_MAX};
use crate::probe::storage_rates;
use crate::record::{check_shape, check_whole_records};
use crate::{ExtsortError, Result};

use crate::merge_phase::{merge_in_memory, merge_phase};
pub use crate::options::ExtsortOptions;
use crate::report::timed;
pub use crate::report::{Measured, Phase, PhaseTimes, SortTimes};
use crate::run_phase::{gather_records, sort_chunk, sort_phase, Outputs, Run};

/// Bytes written and read to measure the storage at start (`probe_bytes`).
/// Planning a 4.3 GB sort took 0.20-0.27 s with 128 MiB against 0.34-0.47
/// s with 256 MiB (`--explain`, 4 runs each, alternating), and the rates
/// read the same: 1237-2636 MB/s read, 2173-2728 MB/s write, against
/// 1314-3043 and 2214-2466 (the disk's state moves them, not the size).
pub const PROBE_BYTES_MAX: u64 = 128 << 20;

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
    use crate::merge_phase::{key_prefix, PREFIX_BYTES};
    use crate::run_phase::PARALLEL_RECORDS_MIN;

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
