//! The CPU worker pool the model's forward passes run on.
//!
//! A decoded token runs a few hundred small parallel products. Started from a thread outside
//! the pool, each one injects its job, wakes the workers and puts the caller to sleep until
//! they finish: two context switches per product, a tenth of the decode time on two cores
//! (measured with perf). Run on a worker instead, a product pushes its halves onto that
//! worker's own queue and works on them itself while the other workers steal.

use std::sync::OnceLock;

/// Runs `work` on a thread of the process-wide CPU pool (at once if already on one).
/// `RAYON_NUM_THREADS` sizes the pool, as it does rayon's global one.
pub fn on_cpu_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    let pool = POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("qwen-gdn-cpu-{i}"))
            .build()
            .ok()
    });
    match pool {
        Some(pool) => pool.install(work),
        // No threads could be started: the caller's thread does the work (rayon falls back
        // to its global pool inside).
        None => work(),
    }
}
