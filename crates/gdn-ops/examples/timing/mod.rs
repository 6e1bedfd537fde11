//! Wall time of repeated calls, shared by the CPU benchmarks.

use std::time::Instant;

/// The wall milliseconds of each of `reps` calls of `f`, sorted (the median at `reps / 2`).
pub fn sorted_ms(f: &mut impl FnMut(), reps: usize) -> Vec<f64> {
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times
}
