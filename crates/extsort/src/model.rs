//! The performance model of paper 001 (FANS, equations 4-8), as the
//! planner of the external sort: it picks the run size M and the merge
//! fan-in l from the memory budget and the measured rates, and predicts
//! the time of each phase.
//!
//! ```text
//!   sort phase   t1 = N / min(β_read, β_sort(M), β_write)                 (eq. 4)
//!                β_sort(M) = β_sample · ⌈log_256(S/n)⌉ / ⌈log_256(M/n)⌉      (eq. 3)
//!   merge phase  t2 = ⌈log_l(N/M)⌉ · N / min(β_read, β_merge(l), β_write)   (eq. 6)
//!                β_merge(l) = β_merge2 / log2(l)
//! ```
//!
//! Reads, sorting and writes overlap (double buffering), so each phase
//! runs at its slowest part. The sort kernel is a radix sort: its passes
//! over a run grow like the paper's merge-tree passes, with 256-way digits
//! and n-record blocks finished in cache (eq. 3's l1 = 256). β_sample and
//! β_merge2 are this machine's rates, measured at start on a sample of S
//! bytes; the paper's FPGA kernels had fixed ones.
//!
//! Choosing M: the paper takes the smallest M that adds no merge pass,
//! because its hardware merge tree runs at the same speed whatever its
//! fan-in. A CPU loser tree pays log2(l) comparisons per record, so here M
//! is the candidate run size with the least predicted total time (ties go
//! to the smaller M, the paper's rule), and l is the smallest fan-in that
//! needs no extra pass.

use crate::io::{read_buffer_bytes, write_staging_bytes};
use crate::{ExtsortError, Result};

/// Smallest block a merge reads from one run or writes at once
/// (`merge_block_bytes_min`): below it requests stop being sequential.
pub const MERGE_BLOCK_BYTES_MIN: u64 = 256 << 10;
/// Largest block worth using (`merge_block_bytes_max`).
pub const MERGE_BLOCK_BYTES_MAX: u64 = 8 << 20;
/// Output block of the sort phase (`sort_block_bytes`).
pub const SORT_BLOCK_BYTES: u64 = 4 << 20;
/// Sort phase bytes of key and index per record held besides the record:
/// a 16-byte key and 4-byte index, twice (the radix sort's scratch).
const SORT_BYTES_PER_RECORD: u64 = 40;

/// Records a radix bucket holds when it is finished in cache (the n of
/// eq. 3: the kernels' insertion-sorted small blocks).
const SORT_BLOCK_RECORDS: f64 = 48.0;

/// Rates the model runs on, bytes per second.
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    pub read: f64,
    pub write: f64,
    /// In-memory sort (key sort + gather of whole records) of a sample of
    /// `sort_sample_bytes`.
    pub sort: f64,
    pub sort_sample_bytes: u64,
    /// Merge CPU rate for a 2-way merge; l-way costs log2(l) times more
    /// comparisons per record.
    pub merge2: f64,
}

impl Rates {
    pub fn merge(&self, fan_in: u64) -> f64 {
        self.merge2 / (fan_in.max(2) as f64).log2()
    }

    /// In-memory sort rate for runs of `run_bytes` (eq. 3).
    pub fn sort(&self, run_bytes: u64, record_size: u64) -> f64 {
        let passes = |bytes: u64| {
            let blocks = bytes as f64 / record_size as f64 / SORT_BLOCK_RECORDS;
            blocks.log(256.0).ceil().max(1.0)
        };
        self.sort * passes(self.sort_sample_bytes) / passes(run_bytes)
    }
}

/// The plan of one external sort.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub input_bytes: u64,
    pub record_size: u64,
    pub mem_bytes: u64,
    /// Run size M after the sort phase.
    pub run_bytes: u64,
    pub runs: u64,
    /// Merge fan-in l.
    pub fan_in: u64,
    pub merge_passes: u32,
    /// Block read from each run (and written) during the merge.
    pub merge_block_bytes: u64,
    /// Block the sort phase writes runs in.
    pub sort_block_bytes: u64,
    pub rates: Rates,
    pub predicted_sort_secs: f64,
    pub predicted_merge_secs: f64,
}

impl Plan {
    /// The I/O floor: every byte read and written twice, at best speed.
    pub fn io_floor_secs(&self) -> f64 {
        let n = self.input_bytes as f64;
        (2.0 * n / self.rates.read).max(2.0 * n / self.rates.write)
    }

    pub fn predicted_total_secs(&self) -> f64 {
        self.predicted_sort_secs + self.predicted_merge_secs
    }
}

/// Bytes a merge of `fan_in` runs in `block`-byte blocks holds: two read
/// buffers per run (one being merged, one being read), two output blocks
/// (one being filled, one being written) and the writer's staging request.
/// The buffers as the reader and writer allocate them, alignment included:
/// the heap meter of `insitu extsort` checks this against the budget.
pub fn merge_footprint_bytes(fan_in: u64, block: u64) -> u64 {
    let block_usize = block as usize;
    2 * fan_in * read_buffer_bytes(block_usize) as u64
        + 2 * block
        + write_staging_bytes(block_usize) as u64
}

/// Bytes the sort phase holds besides the run's records and their keys:
/// two output blocks, the writer's staging request, and the two read
/// buffers' alignment room.
fn sort_overhead_bytes(sort_block: u64) -> u64 {
    let alignment_room = read_buffer_bytes(1) as u64 - 1;
    2 * sort_block + write_staging_bytes(sort_block as usize) as u64 + 2 * alignment_room
}

/// Heap the sort holds besides its buffers, set aside from the budget
/// (`bookkeeping_bytes`): file names, the loser tree, channels, thread
/// handles, the progress bar. `insitu extsort`'s heap meter measured 35-45
/// KiB of it on a 12-way merge with an 8 MiB budget.
pub const BOOKKEEPING_BYTES: u64 = 128 << 10;

/// The smallest memory budget that can merge: two runs in blocks of
/// [`MERGE_BLOCK_BYTES_MIN`], and the bookkeeping.
pub fn min_mem_bytes() -> u64 {
    merge_footprint_bytes(2, MERGE_BLOCK_BYTES_MIN) + BOOKKEEPING_BYTES
}

/// Largest run the sort phase can hold in `mem`: two input buffers
/// (double buffering), the keys and indices, and the output side.
fn max_run_bytes(mem: u64, record_size: u64) -> u64 {
    let budget = mem.saturating_sub(sort_overhead_bytes(sort_block_bytes(mem, record_size)));
    let per_record = 2 * record_size + SORT_BYTES_PER_RECORD;
    (budget / per_record) * record_size
}

/// The sort phase's output block: [`SORT_BLOCK_BYTES`], or less in a
/// small budget, whole records.
fn sort_block_bytes(mem: u64, record_size: u64) -> u64 {
    (SORT_BLOCK_BYTES.min(mem / 8) / record_size).max(1) * record_size
}

/// Most runs one merge can take in blocks of [`MERGE_BLOCK_BYTES_MIN`].
fn max_fan_in(mem: u64) -> u64 {
    let mut fan_in = (mem / (2 * MERGE_BLOCK_BYTES_MIN)).saturating_sub(1);
    while fan_in > 0 && merge_footprint_bytes(fan_in, MERGE_BLOCK_BYTES_MIN) > mem {
        fan_in -= 1;
    }
    fan_in
}

/// The largest merge block (whole records, at most
/// [`MERGE_BLOCK_BYTES_MAX`]) whose merge of `fan_in` runs fits in `mem`.
fn merge_block_bytes(mem: u64, fan_in: u64, record_size: u64) -> u64 {
    let (mut fits, mut over) = (1u64, MERGE_BLOCK_BYTES_MAX / record_size + 1);
    if merge_footprint_bytes(fan_in, record_size) > mem {
        return record_size;
    }
    // Binary search in records: the footprint grows with the block.
    while over - fits > 1 {
        let mid = (fits + over) / 2;
        if merge_footprint_bytes(fan_in, mid * record_size) <= mem {
            fits = mid;
        } else {
            over = mid;
        }
    }
    fits * record_size
}

/// ⌈log_l(runs)⌉: 0 for one run (the sort phase writes OUT itself).
fn passes(runs: u64, fan_in: u64) -> u32 {
    if runs <= 1 {
        return 0;
    }
    let mut p = 1;
    let mut reach = fan_in;
    while reach < runs {
        reach = reach.saturating_mul(fan_in);
        p += 1;
    }
    p
}

/// Plans sorting `input_bytes` of `record_size`-byte records in `mem` bytes.
pub fn plan(input_bytes: u64, record_size: u64, mem: u64, rates: Rates) -> Result<Plan> {
    if mem < min_mem_bytes() {
        return Err(ExtsortError::Invalid(format!(
            "--mem {mem} bytes is too small: a merge needs at least {} bytes \
             (2 runs x 2 blocks of {} bytes, 2 output blocks and a write request)",
            min_mem_bytes(),
            MERGE_BLOCK_BYTES_MIN
        )));
    }
    let budget = mem;
    // What the buffers may use; the rest is the bookkeeping's.
    let mem = mem - BOOKKEEPING_BYTES;
    let run_max = max_run_bytes(mem, record_size);
    if run_max < record_size {
        return Err(ExtsortError::Invalid(format!(
            "--mem {budget} bytes cannot hold even one {record_size}-byte record to sort"
        )));
    }
    let fan_max = max_fan_in(mem);
    let records = input_bytes.div_ceil(record_size).max(1);
    // Candidates: the largest run, and halvings of it down to one block.
    let mut candidates = vec![];
    let mut m = run_max;
    while m >= record_size && candidates.len() < 40 {
        candidates.push((m / record_size).max(1) * record_size);
        m /= 2;
    }
    let predict = |run_bytes: u64| {
        let runs = input_bytes.div_ceil(run_bytes).max(1);
        let merge_passes = passes(runs, fan_max);
        // The smallest fan-in that needs no extra pass.
        let fan_in = (2..=fan_max.max(2))
            .find(|&l| passes(runs, l) <= merge_passes)
            .unwrap_or(fan_max)
            .max(2);
        let n = input_bytes as f64;
        let sort = rates
            .read
            .min(rates.sort(run_bytes, record_size))
            .min(rates.write);
        let merge = rates.read.min(rates.merge(fan_in)).min(rates.write);
        let t1 = n / sort;
        let t2 = merge_passes as f64 * n / merge;
        (run_bytes, runs, merge_passes, fan_in, t1, t2)
    };
    let best = candidates
        .iter()
        .map(|&m| predict(m.min(records * record_size)))
        .min_by(|a, b| (a.4 + a.5).total_cmp(&(b.4 + b.5)).then(a.0.cmp(&b.0)))
        .expect("at least one candidate");
    let (run_bytes, runs, merge_passes, fan_in, predicted_sort_secs, predicted_merge_secs) = best;
    let merge_block_bytes = merge_block_bytes(mem, fan_in, record_size);
    Ok(Plan {
        input_bytes,
        record_size,
        mem_bytes: budget,
        run_bytes,
        runs,
        fan_in,
        merge_passes,
        merge_block_bytes,
        sort_block_bytes: sort_block_bytes(mem, record_size),
        rates,
        predicted_sort_secs,
        predicted_merge_secs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATES: Rates = Rates {
        read: 1e9,
        write: 5e8,
        sort: 4e8,
        sort_sample_bytes: 2 << 20,
        merge2: 2e9,
    };

    /// Predicted total of sorting `n` bytes into runs of `m` with fan-in
    /// `l` and `passes` merge passes, straight from eqs. 3, 4 and 6.
    fn total(n: u64, m: u64, l: u64, passes: u32) -> f64 {
        let sort = RATES.read.min(RATES.sort(m, 100)).min(RATES.write);
        let merge = RATES.read.min(RATES.merge(l)).min(RATES.write);
        n as f64 / sort + passes as f64 * n as f64 / merge
    }

    #[test]
    fn picks_the_run_size_with_the_least_predicted_time() {
        let gib = 1u64 << 30;
        let n = 8 * gib;
        let p = plan(n, 100, 2 * gib, RATES).unwrap();
        assert_eq!(p.merge_passes, 1, "{p:?}");
        assert!(p.runs <= p.fan_in, "{p:?}");
        assert_eq!(p.run_bytes % 100, 0);
        assert_eq!(p.runs, n.div_ceil(p.run_bytes));
        // The fan-in is the smallest that merges every run in one pass.
        assert_eq!(p.fan_in, p.runs.max(2));
        let chosen = total(n, p.run_bytes, p.fan_in, 1);
        assert!((p.predicted_total_secs() - chosen).abs() < 1e-6, "{p:?}");
        // Runs as large as memory allows take more radix passes each,
        // and the model finds that slower than merging more runs.
        let m_max = max_run_bytes(2 * gib, 100);
        assert!(p.run_bytes < m_max, "{p:?}");
        let runs_max = n.div_ceil(m_max);
        assert!(chosen < total(n, m_max, runs_max, 1), "{p:?}");
        // Halving again would not help either.
        let half = p.run_bytes / 200 * 100;
        assert!(chosen <= total(n, half, n.div_ceil(half), 1), "{p:?}");
        let n = n as f64;
        assert!((p.io_floor_secs() - 2.0 * n / 5e8).abs() < 1e-6);
    }

    #[test]
    fn the_sort_rate_falls_with_radix_passes() {
        // 2 MiB of 100-byte records: 437 in-cache blocks, 2 passes.
        assert_eq!(RATES.sort(2 << 20, 100), 4e8);
        // 1 MiB: 218 blocks, one pass: twice as fast.
        assert_eq!(RATES.sort(1 << 20, 100), 8e8);
        // 1 GB: 208k blocks, 3 passes.
        assert!((RATES.sort(1 << 30, 100) - 4e8 * 2.0 / 3.0).abs() < 1.0);
    }

    /// The buffers each phase allocates, as the reader and writer size
    /// them, plus the bookkeeping, fit the budget for every plan.
    #[test]
    fn every_plan_fits_its_budget() {
        let mib = 1u64 << 20;
        for mem in [
            min_mem_bytes(),
            2 * mib,
            3 * mib + 12345,
            8 * mib,
            64 * mib,
            1 << 30,
        ] {
            for n in [1000u64, mib, 40 * mib, 4 << 30] {
                for record in [100u64, 1, 4096] {
                    let p = plan(n, record, mem, RATES).unwrap();
                    let merge = merge_footprint_bytes(p.fan_in, p.merge_block_bytes);
                    let records = p.run_bytes / record;
                    let run_side = 2 * p.run_bytes + records * SORT_BYTES_PER_RECORD;
                    let sort = run_side + sort_overhead_bytes(p.sort_block_bytes);
                    for (phase, bytes) in [("merge", merge), ("sort", sort)] {
                        let held = bytes + BOOKKEEPING_BYTES;
                        assert!(held <= mem, "{phase} holds {held} of {mem}: {p:?}");
                    }
                    assert!(p.merge_block_bytes >= record && p.fan_in >= 2, "{p:?}");
                }
            }
        }
    }

    #[test]
    fn small_memory_means_more_passes_and_too_little_is_an_error() {
        let mib = 1u64 << 20;
        // 3 MiB: fan-in up to 4, runs of at most about 800 KiB.
        for (n, passes) in [(mib / 2, 0), (2 * mib, 1), (8 * mib, 2), (32 * mib, 3)] {
            let p = plan(n, 100, 3 * mib, RATES).unwrap();
            assert_eq!(p.merge_passes, passes, "{n}: {p:?}");
            assert!(passes < 2 || p.runs > p.fan_in.pow(passes - 1), "{p:?}");
        }
        let err = plan(mib, 100, mib, RATES).unwrap_err().to_string();
        assert!(
            err.contains("too small") && err.contains(&min_mem_bytes().to_string()),
            "{err}"
        );
    }
}
