//! One argsort of N random u64 keys, for profilers: argsort_once [N] [THREADS]
use arrow::array::UInt64Array;
use arrow::compute::SortOptions;
fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(100_000_000, |a| a.parse().expect("N"));
    let t: usize = args.next().map_or(2, |a| a.parse().expect("THREADS"));
    let keys = UInt64Array::from(insitu_kernel_bench::random_u64(n, 1));
    let start = std::time::Instant::now();
    let idx = insitu_kernels::argsort_to::<u32>(
        &keys,
        SortOptions::default(),
        insitu_kernels::Parallelism(t),
    )
    .unwrap();
    println!(
        "{n} rows, {t} threads: {:.3} s (first {:?})",
        start.elapsed().as_secs_f64(),
        idx.first()
    );
}
