//! Memory accounting shared by both sides of the stage boundary: a view of
//! a memory pool that one query (on the host) or one query's stages (on a
//! device) reserve through, so each can report its own peak while the
//! budget stays the shared pool's.
//!
//! ```text
//!  query A ─▶ MeteredPool(A) ─┐
//!                             ├─▶ shared pool (the budget: FairSpillPool, Greedy…)
//!  query B ─▶ MeteredPool(B) ─┘
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};

/// Passes every reservation to a shared pool and counts what passed
/// through it: bytes held now and the most held at once.
#[derive(Debug)]
pub struct MeteredPool {
    shared: Arc<dyn MemoryPool>,
    /// Names the budget in refusals: `host memory budget (--host-mem 2.0 GiB)`.
    budget: String,
    held: AtomicUsize,
    peak: AtomicUsize,
}

impl MeteredPool {
    /// A view of `shared`; refusals are prefixed with `budget`.
    pub fn new(shared: Arc<dyn MemoryPool>, budget: impl Into<String>) -> Self {
        Self {
            shared,
            budget: budget.into(),
            held: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Bytes reserved through this view now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// The most bytes reserved through this view at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    fn add(&self, bytes: usize) {
        let now = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn sub(&self, bytes: usize) {
        // Saturating: a reservation registered elsewhere never shrinks
        // below what it grew here.
        let _ = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                Some(h.saturating_sub(bytes))
            });
    }
}

impl std::fmt::Display for MeteredPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (holds {} bytes, peak {})",
            self.budget,
            self.held(),
            self.peak()
        )
    }
}

impl MemoryPool for MeteredPool {
    fn name(&self) -> &str {
        "metered"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.shared.register(consumer)
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.shared.unregister(consumer)
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.shared.grow(reservation, additional);
        self.add(additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.shared.shrink(reservation, shrink);
        self.sub(shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        match self.shared.try_grow(reservation, additional) {
            Ok(()) => {
                self.add(additional);
                Ok(())
            }
            Err(DataFusionError::ResourcesExhausted(msg)) => Err(
                DataFusionError::ResourcesExhausted(format!("{} exhausted: {msg}", self.budget)),
            ),
            Err(e) => Err(e),
        }
    }

    fn reserved(&self) -> usize {
        self.shared.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.shared.memory_limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::GreedyMemoryPool;

    #[test]
    fn counts_its_own_reservations_against_the_shared_budget() {
        let shared: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(100));
        let a: Arc<dyn MemoryPool> = Arc::new(MeteredPool::new(Arc::clone(&shared), "budget A"));
        let b: Arc<dyn MemoryPool> = Arc::new(MeteredPool::new(Arc::clone(&shared), "budget B"));
        let ra = MemoryConsumer::new("ra").register(&a);
        let rb = MemoryConsumer::new("rb").register(&b);
        ra.try_grow(60).unwrap();
        ra.shrink(20);
        rb.try_grow(50).unwrap();
        let err = ra.try_grow(11).unwrap_err().to_string();
        assert!(err.contains("budget A exhausted"), "{err}");
        ra.grow(5);
        let metered = |p: &Arc<dyn MemoryPool>| {
            let m = p.downcast_ref::<MeteredPool>().unwrap();
            (m.held(), m.peak())
        };
        assert_eq!(metered(&a), (45, 60));
        assert_eq!(metered(&b), (50, 50));
        assert_eq!(shared.reserved(), 95, "the shared pool holds both");
        drop(ra);
        assert_eq!(metered(&a), (0, 60));
        assert_eq!(shared.reserved(), 50);
    }
}
