//! Process-wide settings, made at the start of `main` before any thread exists.

/// Applies every setting below. Each yields to the same variable set in the environment.
pub fn configure() {
    use_one_malloc_arena();
    keep_candle_elementwise_on_the_caller();
}

/// Keeps glibc's allocator to one heap for the whole process. By default every thread that
/// allocates gets its own arena, and memory freed in one is not reused by another: the CPU
/// pool's workers allocating prefill temporaries added ~0.27 GB of peak RSS at `-p 512` on
/// the bench checkpoint (2.07 → 1.79 GB), with no measurable cost in speed (a few threads,
/// large allocations).
fn use_one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only changes allocator settings; no other thread allocates yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

/// Candle runs large elementwise ops on its own spinning thread pool, next to the CPU pool
/// our products run on (gdn_ops::threads): one thread per core in each, so the two pools
/// fight over the cores. With candle's pool off (`CANDLE_NUM_THREADS=1`) its ops run on the
/// calling worker: prefill +3–8% in three alternated pairs on the bench checkpoint (2
/// cores), decode unchanged (its tensors are below candle's parallel threshold).
fn keep_candle_elementwise_on_the_caller() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: called first thing in `main`, while this is the only thread, so nothing
        // reads the environment concurrently.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
}
