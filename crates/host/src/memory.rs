//! The host's memory: one budget (`host_mem_bytes_max`) for every query
//! of a session, enforced by DataFusion's memory pool, and a spill
//! directory where sorts, aggregates and sort-merge joins put what does
//! not fit.
//!
//! ```text
//!  query ─▶ MeteredPool (its own peak) ─▶ TrackConsumersPool ─▶ BudgetPool(budget)
//!  spilling operator ─▶ DiskManager ─▶ <spill dir>/host-<pid>-<n>/datafusion-*/
//! ```
//!
//! [`BudgetPool`] shares the budget between the operators that spill as
//! they run, and always keeps room for one more to start; operators that
//! cannot spill (a hash join's build side) take what is left, and fail
//! with an error naming themselves and the budget when it runs out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation, TrackConsumersPool,
};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use insitu_stage::MeteredPool;
use insitu_wire::units::human_bytes;

/// Consumers an out-of-memory error lists, largest first.
const CONSUMERS_LISTED_ON_ERROR: usize = 5;

/// Most bytes the host's spill files may hold at once (`spill_bytes_max`).
pub const SPILL_BYTES_MAX: u64 = 256 << 30;

/// How refusals of the host's pool begin (device budgets name their device).
pub const HOST_BUDGET_LABEL: &str = "host memory budget";

/// Most spill files one merge step of a host sort reads at once
/// (`spill_merge_fan_in_max`): more merge in further passes. DataFusion's
/// default, unlimited, lets one sort's merge reserve a buffer per file
/// while it can, and a sort running beside it is then refused even the
/// memory for one batch (Q18 at SF1 on 200 MiB with sort-merge joins).
pub const SPILL_MERGE_FAN_IN_MAX: usize = 4;

/// The memory each host sort sets aside for merging its spilled runs: a
/// sixty-fourth of the budget, within 1 to 10 MiB (DataFusion's default).
pub fn sort_merge_reservation_bytes(budget: usize) -> usize {
    (budget / 64).clamp(1 << 20, 10 << 20)
}

/// Most rows per batch of the host's operators (`host_batch_rows_max`),
/// DataFusion's default.
pub const HOST_BATCH_ROWS_MAX: usize = 8192;

/// Rows per host batch for a budget: [`HOST_BATCH_ROWS_MAX`], or fewer
/// under 128 MiB (one row per 16 KiB of budget, at least 512). A merge of
/// spilled runs reserves two batches per run it reads, and several sorts
/// merge at once in a plan of sort-merge joins: at 8192 rows two of Q18's
/// merges took 16 of a 24 MiB budget and a third sort could not start.
pub fn batch_rows_for(budget: usize) -> usize {
    (budget >> 14).clamp(512, HOST_BATCH_ROWS_MAX)
}

/// Prefix of a host process's spill directory under the spill root.
const SPILL_DIR_PREFIX: &str = "host-";

/// The host's budget and spill directory, shared by its queries.
#[derive(Debug)]
pub struct HostMemory {
    budget: usize,
    pool: Arc<dyn MemoryPool>,
    spill: SpillDir,
}

impl HostMemory {
    /// A budget of `mem_bytes_max` bytes spilling under `spill_root`.
    pub fn new(mem_bytes_max: usize, spill_root: &Path) -> Result<Self> {
        let pool = Arc::new(TrackConsumersPool::new(
            BudgetPool::new(mem_bytes_max),
            std::num::NonZeroUsize::new(CONSUMERS_LISTED_ON_ERROR).expect("nonzero"),
        ));
        Ok(Self {
            budget: mem_bytes_max,
            pool,
            spill: SpillDir::create(spill_root)?,
        })
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Where this host's spill files go.
    pub fn spill_dir(&self) -> &Path {
        &self.spill.path
    }

    /// Bytes reserved by all queries now.
    pub fn reserved(&self) -> usize {
        self.pool.reserved()
    }

    /// The runtime the session starts with: the budget and the spill
    /// directory.
    pub fn runtime(&self) -> Result<Arc<RuntimeEnv>> {
        let disk = DiskManagerBuilder::default()
            .with_mode(DiskManagerMode::Directories(vec![self.spill.path.clone()]))
            .with_max_temp_directory_size(SPILL_BYTES_MAX)
            .with_max_spill_merge_fan_in(SPILL_MERGE_FAN_IN_MAX);
        RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::clone(&self.pool))
            .with_disk_manager_builder(disk)
            .build_arc()
    }

    /// A view of the budget for one query, counting its own peak.
    pub fn query_pool(&self) -> Arc<MeteredPool> {
        let label = format!(
            "{HOST_BUDGET_LABEL} (host_mem_bytes_max {}, set by --host-mem)",
            human_bytes(self.budget as u64)
        );
        Arc::new(MeteredPool::new(Arc::clone(&self.pool), label))
    }
}

/// Share of the budget kept for operators that spill to start in
/// (`start_headroom_share`, as a divisor): an operator that holds nothing
/// yet may reserve its first batch from it, which the others may not
/// touch. DataFusion's sort fails when its first batch is refused, and in
/// a plan of sort-merge joins many sorts start while others still fill
/// the budget.
pub const START_HEADROOM_SHARE: usize = 4;

/// A memory pool for a host budget shared by many concurrent operators.
///
/// - An operator that spills, holding nothing yet, gets its first
///   reservation whenever the budget has room for it.
/// - Operators that cannot spill (a hash join's build side, a sort's
///   merge buffers) may use the headroom too, as long as all of them
///   together stay below the budget less the headroom.
/// - An operator that spills and holds memory stays below the budget
///   less the headroom, and within an equal share of what those that
///   cannot spill leave, split among the spilling operators that hold
///   memory now (DataFusion's `FairSpillPool` splits it among all
///   registered ones: dozens of idle repartition buffers shrink every
///   share to a few kilobytes).
///
/// Refused, an operator that spills frees its memory to disk and asks
/// again; one that cannot fails the query.
#[derive(Debug)]
pub struct BudgetPool {
    limit: usize,
    headroom: usize,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    reserved: usize,
    unspillable: usize,
    /// Bytes held by each spilling consumer holding any (by consumer id).
    spillers: HashMap<usize, usize>,
}

impl BudgetPool {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            headroom: limit / START_HEADROOM_SHARE,
            state: Mutex::new(PoolState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(state: &mut PoolState, r: &MemoryReservation, bytes: usize) {
        state.reserved += bytes;
        if r.consumer().can_spill() {
            *state.spillers.entry(r.consumer().id()).or_default() += bytes;
        } else {
            state.unspillable += bytes;
        }
    }

    /// Bytes `r` may add now.
    fn room_for(&self, state: &PoolState, r: &MemoryReservation) -> usize {
        let free = self.limit.saturating_sub(state.reserved);
        let below_headroom = self.limit.saturating_sub(self.headroom);
        if !r.consumer().can_spill() {
            // The headroom too, while all that cannot spill stays below it.
            return free.min(below_headroom.saturating_sub(state.unspillable));
        }
        if r.size() == 0 {
            return free;
        }
        let spilling_room = self
            .limit
            .saturating_sub(self.headroom)
            .saturating_sub(state.unspillable);
        let holders = state.spillers.len().max(1);
        let share = (spilling_room / holders).saturating_sub(r.size());
        share.min(free.saturating_sub(self.headroom))
    }
}

impl std::fmt::Display for BudgetPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Display(self, &self.lock()).fmt(f)
    }
}

impl MemoryPool for BudgetPool {
    fn name(&self) -> &str {
        "budget"
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.lock().spillers.remove(&consumer.id());
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        Self::add(&mut self.lock(), reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        let mut s = self.lock();
        s.reserved = s.reserved.saturating_sub(shrink);
        let id = reservation.consumer().id();
        if reservation.consumer().can_spill() {
            if let Some(held) = s.spillers.get_mut(&id) {
                *held = held.saturating_sub(shrink);
                if *held == 0 {
                    s.spillers.remove(&id);
                }
            }
        } else {
            s.unspillable = s.unspillable.saturating_sub(shrink);
        }
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        let mut s = self.lock();
        let room = self.room_for(&s, reservation);
        if additional > room {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "Failed to allocate additional {} for {} with {} already allocated for this \
                 reservation - {} remain available to it in the pool: {}",
                human_bytes(additional as u64),
                reservation.consumer().name(),
                human_bytes(reservation.size() as u64),
                human_bytes(room as u64),
                Display(self, &s),
            )));
        }
        Self::add(&mut s, reservation, additional);
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.lock().reserved
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}

/// The pool's state as its refusals print it (the lock is already held).
struct Display<'a>(&'a BudgetPool, &'a PoolState);

impl std::fmt::Display for Display<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (pool, s) = (self.0, self.1);
        write!(
            f,
            "budget(used: {}, pool_size: {}, start headroom: {}, spilling operators holding memory: {})",
            human_bytes(s.reserved as u64),
            human_bytes(pool.limit as u64),
            human_bytes(pool.headroom as u64),
            s.spillers.len()
        )
    }
}

/// The operator a pool refused and how much it asked for, from the
/// refusal's text (`Failed to allocate additional 1.00 MiB for X with …`).
pub fn refused_reservation(refusal: &str) -> Option<(String, String)> {
    let rest = refusal.split("Failed to allocate additional ").nth(1)?;
    let (size, rest) = rest.split_once(" for ")?;
    let (operator, _) = rest.split_once(" with ")?;
    Some((operator.to_string(), size.to_string()))
}

/// The consumer lines of a refusal (DataFusion's `TrackConsumersPool`
/// lists the largest), or the refusal itself if it has none.
pub fn top_consumers(refusal: &str) -> String {
    let lines: Vec<&str> = refusal
        .lines()
        .filter(|l| l.contains("consumed"))
        .map(str::trim)
        .collect();
    if lines.is_empty() {
        return format!("  {refusal}");
    }
    lines
        .iter()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `e` says a memory budget ran out (anywhere in its chain).
pub fn is_out_of_memory(e: &DataFusionError) -> bool {
    matches!(e.find_root(), DataFusionError::ResourcesExhausted(_))
}

/// A directory of this process's own under the spill root, removed when
/// the host goes; those of processes that died are removed on start.
#[derive(Debug)]
struct SpillDir {
    path: PathBuf,
}

impl SpillDir {
    fn create(root: &Path) -> Result<Self> {
        static HOSTS: AtomicU64 = AtomicU64::new(0);
        let io = |what: &str, p: &Path, e: std::io::Error| {
            DataFusionError::Execution(format!("spill directory {}: {what}: {e}", p.display()))
        };
        std::fs::create_dir_all(root).map_err(|e| io("cannot create", root, e))?;
        remove_stale(root);
        let n = HOSTS.fetch_add(1, Ordering::Relaxed);
        let path = root.join(format!("{SPILL_DIR_PREFIX}{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).map_err(|e| io("cannot create", &path, e))?;
        Ok(Self { path })
    }
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes the spill directories of host processes that are gone.
fn remove_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(SPILL_DIR_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        if !alive {
            tracing::info!(dir = %entry.path().display(), "removing a dead host's spill directory");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::MemoryConsumer;

    #[test]
    fn a_query_pool_names_the_budget_when_it_runs_out() {
        let root = tempfile::tempdir().unwrap();
        let memory = HostMemory::new(1000, root.path()).unwrap();
        let pool: Arc<dyn MemoryPool> = memory.query_pool();
        let r = MemoryConsumer::new("HashJoinInput[0]").register(&pool);
        r.try_grow(700).unwrap();
        let e = r.try_grow(200).unwrap_err();
        assert!(is_out_of_memory(&e));
        let text = e.to_string();
        assert!(text.contains("host memory budget"), "{text}");
        assert!(text.contains("HashJoinInput[0]"), "{text}");
        let root = e.find_root().to_string();
        let (op, size) = refused_reservation(&root).expect("a refusal");
        assert_eq!((op.as_str(), size.as_str()), ("HashJoinInput[0]", "200 B"));
        assert!(top_consumers(&root).contains("HashJoinInput[0]#"), "{root}");
        assert_eq!(memory.reserved(), 700);
    }

    fn pool(limit: usize) -> Arc<dyn MemoryPool> {
        Arc::new(BudgetPool::new(limit))
    }

    #[test]
    fn operators_that_spill_may_always_start_but_not_grow_into_the_headroom() {
        let p = pool(1000); // headroom 250
        let sort = MemoryConsumer::new("sort")
            .with_can_spill(true)
            .register(&p);
        sort.try_grow(700).unwrap();
        assert!(
            sort.try_grow(100).is_err(),
            "past the limit less the headroom"
        );
        let other = MemoryConsumer::new("other sort")
            .with_can_spill(true)
            .register(&p);
        other.try_grow(250).unwrap(); // its first batch, from the headroom
        assert!(other.try_grow(1).is_err());
        let late = MemoryConsumer::new("late")
            .with_can_spill(true)
            .register(&p);
        assert!(late.try_grow(51).is_err(), "the budget itself still holds");
        assert_eq!(p.reserved(), 950);
    }

    #[test]
    fn spilling_operators_holding_memory_share_what_the_others_leave() {
        let p = pool(1000); // 750 below the headroom
        let join = MemoryConsumer::new("HashJoinInput").register(&p);
        join.try_grow(150).unwrap();
        // Idle spillers (repartition buffers) do not shrink the shares.
        let idle: Vec<_> = (0..20)
            .map(|i| {
                MemoryConsumer::new(format!("idle {i}"))
                    .with_can_spill(true)
                    .register(&p)
            })
            .collect();
        let a = MemoryConsumer::new("a").with_can_spill(true).register(&p);
        let b = MemoryConsumer::new("b").with_can_spill(true).register(&p);
        a.try_grow(100).unwrap();
        a.try_grow(150).unwrap(); // alone it may hold up to 600
        b.try_grow(10).unwrap(); // its first batch
                                 // Two holders now: 300 each.
        b.try_grow(290).unwrap();
        let e = b.try_grow(1).unwrap_err().to_string();
        assert!(e.contains("Failed to allocate additional 1 B for b"), "{e}");
        a.try_grow(50).unwrap();
        assert!(a.try_grow(1).is_err());
        a.shrink(300); // a spilled: b may take what a held
        b.try_grow(300).unwrap();
        assert!(b.try_grow(1).is_err(), "the budget less the headroom holds");
        drop(idle);
    }

    #[test]
    fn operators_that_cannot_spill_stop_short_of_the_headroom_together() {
        let p = pool(1000);
        let join = MemoryConsumer::new("HashJoinInput").register(&p);
        join.try_grow(750).unwrap();
        assert!(join.try_grow(1).is_err());
        let sort = MemoryConsumer::new("sort")
            .with_can_spill(true)
            .register(&p);
        sort.try_grow(250).unwrap();
        assert_eq!(p.reserved(), 1000);
        drop(join);
        // A sort's merge buffers may take the headroom spillers leave.
        sort.try_grow(500).unwrap();
        let merge = MemoryConsumer::new("ExternalSorterMerge").register(&p);
        merge.try_grow(250).unwrap();
        assert!(merge.try_grow(1).is_err(), "the budget holds");
        drop(merge);
        drop(sort);
        assert_eq!(p.reserved(), 0);
    }

    #[test]
    fn spill_directories_are_per_host_and_dead_ones_are_removed() {
        let root = tempfile::tempdir().unwrap();
        // A process id that cannot be alive (above Linux's pid_max).
        let dead = root.path().join(format!("{SPILL_DIR_PREFIX}4294967295-0"));
        std::fs::create_dir_all(dead.join("datafusion-x")).unwrap();
        let other = root.path().join("not-ours");
        std::fs::create_dir_all(&other).unwrap();
        let a = HostMemory::new(1 << 20, root.path()).unwrap();
        let b = HostMemory::new(1 << 20, root.path()).unwrap();
        assert!(!dead.exists(), "a dead host's directory is removed");
        assert!(other.exists(), "other directories are left alone");
        assert_ne!(a.spill_dir(), b.spill_dir());
        assert!(a.spill_dir().is_dir());
        let path = a.spill_dir().to_path_buf();
        drop(a);
        assert!(!path.exists(), "removed with its host");
        assert!(b.spill_dir().is_dir());
    }
}
