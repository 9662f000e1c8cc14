//! A memory pool wrapper that remembers its high-water mark, so a device
//! can prove it stayed within `mem_bytes_max`, and that lends what its
//! queries have not reserved to the kernels' scratch pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::common::Result;
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};

#[derive(Debug)]
pub(crate) struct PeakTrackingPool {
    inner: Arc<dyn MemoryPool>,
    peak: AtomicUsize,
}

impl PeakTrackingPool {
    pub fn new(inner: Arc<dyn MemoryPool>) -> Self {
        Self {
            inner,
            peak: AtomicUsize::new(0),
        }
    }

    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    fn observe(&self) {
        self.peak
            .fetch_max(self.inner.reserved(), Ordering::Relaxed);
    }
}

impl std::fmt::Display for PeakTrackingPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (peak {} bytes)", self.inner, self.peak())
    }
}

impl MemoryPool for PeakTrackingPool {
    fn name(&self) -> &str {
        "peak_tracking"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.inner.register(consumer)
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.inner.unregister(consumer)
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        scratch::reserve(additional);
        self.inner.grow(reservation, additional);
        self.observe();
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink);
        scratch::release(shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        // The scratch pool gives the bytes back before the query has them.
        scratch::reserve(additional);
        if let Err(e) = self.inner.try_grow(reservation, additional) {
            scratch::release(additional);
            return Err(e);
        }
        self.observe();
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.inner.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.inner.memory_limit()
    }
}

/// The budgets of the devices alive in this process and what their
/// queries have reserved: the kernels' process-wide scratch pool retains
/// at most the difference, so reservations plus retained scratch stay
/// within the budgets.
pub(crate) mod scratch {
    use std::sync::Mutex;

    #[derive(Debug, Default, PartialEq)]
    pub(super) struct Ledger {
        pub budgets: usize,
        pub reserved: usize,
    }

    impl Ledger {
        /// What the scratch pool may retain.
        pub fn retainable(&self) -> usize {
            self.budgets.saturating_sub(self.reserved)
        }
    }

    static LEDGER: Mutex<Ledger> = Mutex::new(Ledger {
        budgets: 0,
        reserved: 0,
    });

    fn update(change: impl FnOnce(&mut Ledger)) {
        let mut ledger = LEDGER.lock().unwrap_or_else(|e| e.into_inner());
        change(&mut ledger);
        // Under the lock, so concurrent updates apply in order.
        insitu_kernels::mem::set_scratch_pool_bytes_max(ledger.retainable());
    }

    /// A device with this budget starts.
    pub fn add_budget(bytes: usize) {
        update(|l| l.budgets += bytes)
    }

    /// A device with this budget stops.
    pub fn remove_budget(bytes: usize) {
        update(|l| l.budgets = l.budgets.saturating_sub(bytes))
    }

    pub fn reserve(bytes: usize) {
        if bytes > 0 {
            update(|l| l.reserved += bytes)
        }
    }

    pub fn release(bytes: usize) {
        if bytes > 0 {
            update(|l| l.reserved = l.reserved.saturating_sub(bytes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::GreedyMemoryPool;

    #[test]
    fn remembers_the_highest_reservation_and_keeps_the_limit() {
        let pool: Arc<dyn MemoryPool> =
            Arc::new(PeakTrackingPool::new(Arc::new(GreedyMemoryPool::new(100))));
        let r = MemoryConsumer::new("t").register(&pool);
        r.try_grow(60).unwrap();
        r.shrink(50);
        r.try_grow(30).unwrap();
        assert!(r.try_grow(80).is_err(), "limit still enforced");
        let tracking = pool.downcast_ref::<PeakTrackingPool>().unwrap();
        assert_eq!(tracking.peak(), 60);
        assert_eq!(pool.reserved(), 40);
    }

    #[test]
    fn scratch_retains_the_budgets_less_the_reservations() {
        let ledger = scratch::Ledger {
            budgets: 100,
            reserved: 30,
        };
        assert_eq!(ledger.retainable(), 70);
        let over = scratch::Ledger {
            budgets: 10,
            reserved: 30,
        };
        assert_eq!(over.retainable(), 0, "never negative");
    }

    /// Reservations through the pool lower what the process-wide scratch
    /// pool may retain by as much, before the query holds them; a refused
    /// reservation gives it back. (Other tests' devices change the same
    /// limit concurrently, and some test pools reserve without a device
    /// budget, so this one owns a budget far larger than theirs and checks
    /// changes of its own size.)
    #[test]
    fn reservations_come_out_of_the_scratch_pool() {
        let big: usize = 1 << 50;
        scratch::add_budget(big);
        let pool: Arc<dyn MemoryPool> = Arc::new(PeakTrackingPool::new(Arc::new(
            GreedyMemoryPool::new(big / 2),
        )));
        let r = MemoryConsumer::new("t").register(&pool);
        let limit = insitu_kernels::mem::scratch_pool_bytes_max;
        // Others' budgets and reservations are tiny next to this one's.
        let about_big = big - big / 16;
        assert!(limit() > about_big);
        r.try_grow(big / 4).unwrap();
        assert!(
            limit() < big - big / 8,
            "the reservation came out of the pool"
        );
        assert!(r.try_grow(big).is_err());
        assert!(limit() > big / 2, "a refused reservation is given back");
        r.shrink(big / 4);
        assert!(limit() > about_big, "released");
        scratch::remove_budget(big);
    }
}
