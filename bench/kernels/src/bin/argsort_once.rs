//! Argsorts of N random u64 keys, for profilers and A/B runs:
//! argsort_once [N] [THREADS] [REPS]. Prints each run's time, then the
//! fastest and the median (the first run also pays for page faults).
use arrow::array::UInt64Array;
use arrow::compute::SortOptions;
fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(100_000_000, |a| a.parse().expect("N"));
    let t: usize = args.next().map_or(2, |a| a.parse().expect("THREADS"));
    let reps: usize = args.next().map_or(1, |a| a.parse().expect("REPS"));
    let keys = UInt64Array::from(insitu_kernel_bench::random_u64(n, 1));
    let mut times = vec![];
    for _ in 0..reps.max(1) {
        let start = std::time::Instant::now();
        let idx = insitu_kernels::argsort_to::<u32>(
            &keys,
            SortOptions::default(),
            insitu_kernels::Parallelism(t),
        )
        .unwrap();
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{n} rows, {t} threads: {secs:.3} s (first {:?})",
            idx.first()
        );
        times.push(secs);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "fastest {:.3} s, median {:.3} s",
        times[0],
        times[times.len() / 2]
    );
}
