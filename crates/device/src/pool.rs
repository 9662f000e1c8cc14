//! A memory pool wrapper that remembers its high-water mark, so a device
//! can prove it stayed within `mem_bytes_max`.

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
        self.inner.grow(reservation, additional);
        self.observe();
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink)
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        self.inner.try_grow(reservation, additional)?;
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
}
