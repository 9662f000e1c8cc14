//! The heap meter as the global allocator of this test binary.

use insitu_extsort::heap::{HeapMeter, MeteredAllocator};

#[global_allocator]
static ALLOCATOR: MeteredAllocator = MeteredAllocator(std::alloc::System);

const MIB: usize = 1 << 20;

/// One test only: the counters are process-wide, and other tests running
/// beside it would allocate into them.
#[test]
fn meter_counts_the_peak_of_what_was_added_since_it_started() {
    let before = vec![1u8; 4 * MIB]; // allocated before the meter
    let meter = HeapMeter::start();
    let a = vec![2u8; 3 * MIB];
    let mut b = Vec::<u8>::with_capacity(MIB);
    b.resize(5 * MIB, 3); // grows by realloc: 5 MiB live, 8 MiB in all
    drop(a);
    let c = vec![4u8; MIB]; // 6 MiB live: below the 8 MiB peak
    let peak = meter
        .peak_bytes()
        .expect("the metered allocator is installed") as usize;
    assert!(
        (8 * MIB..8 * MIB + 64 * 1024).contains(&peak),
        "peak {peak} bytes"
    );
    // Freeing what was there before lowers the live count, not the peak.
    drop(before);
    let d = vec![5u8; 2 * MIB]; // net live 4 MiB
    assert_eq!(meter.peak_bytes().unwrap() as usize, peak);
    drop(meter);
    // Stopped: nothing more counts.
    let e = vec![6u8; 32 * MIB];
    let again = HeapMeter::start();
    assert!(again.peak_bytes().unwrap() < 64 * 1024);
    std::hint::black_box((b, c, d, e));
}
