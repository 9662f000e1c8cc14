//! Shared helpers for the kernel benchmarks: seeded inputs and medians.

use std::time::Instant;

use rand::{Rng, SeedableRng};

pub fn random_u64(n: usize, seed: u64) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random()).collect()
}

pub fn random_indices(n: usize, range: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..range as u32)).collect()
}

/// Median wall time in seconds of `reps` runs of `f` (each run gets fresh
/// input from `setup`, not timed).
pub fn median_secs<T, R>(
    reps: usize,
    mut setup: impl FnMut() -> T,
    mut f: impl FnMut(T) -> R,
) -> f64 {
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let input = setup();
            let start = Instant::now();
            let out = f(input);
            let t = start.elapsed().as_secs_f64();
            drop(out);
            t
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}
