//! The CPU worker pool the model's forward passes run on.
//!
//! A decoded token runs a few hundred small parallel products. Started from a thread outside
//! the pool, each one injects its job, wakes the workers and puts the caller to sleep until
//! they finish: two context switches per product, a tenth of the decode time on two cores
//! (measured with perf). Run on a worker instead, a product pushes its halves onto that
//! worker's own queue and works on them itself while the other workers steal.
//!
//! Between two products the other workers find nothing to do, and rayon puts an idle worker
//! to sleep after a few dozen rounds of looking; the next product then pays a wake-up (a
//! futex and a reschedule, tens of microseconds on a VM) before its second half starts. So
//! for the duration of one pass (`on_cpu_pool` from outside the pool) every other worker can
//! run a spinner (opt-in, `QWEN_GDN_SPIN_US`): it keeps taking the pass's work as soon as it
//! appears, and leaves when the pass ends or when it has found nothing for a bounded time
//! (then rayon's own sleep takes over, so a pass that waits on something else does not hold a
//! core forever). Rayon itself already looks a few dozen times before sleeping, which covers
//! most of those gaps: measured, the spinners did not pay on two cores (docs/perf-notes.md).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Runs `work` on a thread of the process-wide CPU pool (at once if already on one), with the
/// other workers spinning for work until it returns if [`spin_budget`] allows (see the
/// module note).
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
        Some(pool) => pool.install(|| {
            let _spinners = Spinners::start(pool, spin_budget());
            work()
        }),
        // No threads could be started: the caller's thread does the work (rayon falls back
        // to its global pool inside).
        None => work(),
    }
}

/// How long a spinner looks for work without finding any before it leaves:
/// [`set_spin_budget`]'s, else [`DEFAULT_SPIN`] (zero: no spinners).
pub fn spin_budget() -> Duration {
    Duration::from_micros(SPIN_MICROS.load(Ordering::Relaxed))
}

/// Sets [`spin_budget`] (the model's `QWEN_GDN_SPIN_US`). Process-wide, as the pool is: the
/// model's load sets it, and the next pass's spinners take it.
pub fn set_spin_budget(budget: Duration) {
    let micros = u64::try_from(budget.as_micros()).unwrap_or(u64::MAX);
    SPIN_MICROS.store(micros, Ordering::Relaxed);
}

static SPIN_MICROS: AtomicU64 = AtomicU64::new(DEFAULT_SPIN.as_micros() as u64);

/// Off: on the 2-core VM of docs/perf-notes.md (step 27) spinning did not speed decode up,
/// and where other jobs share the cores it slowed it (a spinner holds a core they want).
/// `QWEN_GDN_SPIN_US=1000` is longer than the serial stretches between a decode step's
/// parallel products (norms, elementwise work) and short against a step.
pub const DEFAULT_SPIN: Duration = Duration::ZERO;

/// How many spinners are looking for work right now (all pools).
pub fn spinning_now() -> usize {
    SPINNING_NOW.load(Ordering::Relaxed)
}

static SPINNING_NOW: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set on the thread that runs a pass with spinners, so nested passes start none.
    static IN_PASS: Cell<bool> = const { Cell::new(false) };
    /// Set on a worker while it spins, so a spinner it runs from the queue returns at once.
    static SPINNING: Cell<bool> = const { Cell::new(false) };
}

/// The spinners of one pass; dropping it (at the pass's end, or on a panic) sends them away.
struct Spinners {
    stop: Arc<AtomicBool>,
}

impl Spinners {
    /// One spinner for every worker but the caller's, unless spinning is off, the pool has
    /// one thread, or the caller already runs a pass.
    fn start(pool: &rayon::ThreadPool, budget: Duration) -> Option<Self> {
        if budget.is_zero() || pool.current_num_threads() < 2 || IN_PASS.get() {
            return None;
        }
        IN_PASS.set(true);
        let stop = Arc::new(AtomicBool::new(false));
        let owner = rayon::current_thread_index();
        for _ in 1..pool.current_num_threads() {
            let stop = stop.clone();
            // Pushed onto the caller's own queue: the other workers steal the oldest job
            // first, so they take these before the pass's first products.
            pool.spawn(move || spin(owner, &stop, budget));
        }
        Some(Self { stop })
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        IN_PASS.set(false);
    }
}

/// Runs the pool's pending jobs as they appear until `stop` is set or nothing has turned up
/// for `budget`. The caller's own worker (which may pop this job while it waits for a
/// product's other half) and a worker already spinning return at once.
fn spin(owner: Option<usize>, stop: &AtomicBool, budget: Duration) {
    if rayon::current_thread_index() == owner || SPINNING.get() {
        return;
    }
    SPINNING.set(true);
    SPINNING_NOW.fetch_add(1, Ordering::Relaxed);
    let mut idle_since = Instant::now();
    let mut idle_rounds = 0u32;
    while !stop.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle_rounds = 0,
            Some(rayon::Yield::Idle) => {
                // Reading the clock costs more than a look at the queues: once every 64.
                if idle_rounds == 0 {
                    idle_since = Instant::now();
                } else if idle_rounds.is_multiple_of(64) && idle_since.elapsed() > budget {
                    break;
                }
                idle_rounds = idle_rounds.wrapping_add(1);
                std::hint::spin_loop();
            }
            None => break,
        }
    }
    SPINNING_NOW.fetch_sub(1, Ordering::Relaxed);
    SPINNING.set(false);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a test pool")
    }

    /// Waits up to 10 s for `cond` (a spinner starts when a worker steals its job).
    fn eventually(cond: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        cond()
    }

    /// During a pass the other worker spins (and no second spinner starts for a nested
    /// pass), the pass's parallel work is complete and right, and the spinner leaves when
    /// the pass ends. One test: the spinner count is process-wide.
    #[test]
    fn spinners_serve_a_pass_and_leave_after_it() {
        let pool = pool(2);
        let sum: u64 = pool.install(|| {
            let _outer = Spinners::start(&pool, Duration::from_secs(60));
            assert!(_outer.is_some(), "a two-thread pool spins one worker");
            assert!(
                Spinners::start(&pool, Duration::from_secs(60)).is_none(),
                "a nested pass starts no spinners"
            );
            assert!(
                eventually(|| spinning_now() == 1),
                "the other worker never started spinning"
            );
            (0..100_000u64).into_par_iter().map(|i| i * i).sum()
        });
        assert_eq!(sum, (0..100_000u64).map(|i| i * i).sum::<u64>());
        assert!(
            eventually(|| spinning_now() == 0),
            "the spinner kept running after its pass"
        );

        // With a short budget the spinner leaves on its own while the pass goes on.
        pool.install(|| {
            let _spinners = Spinners::start(&pool, Duration::from_micros(200));
            assert!(
                eventually(|| spinning_now() == 0),
                "an idle spinner outlived its budget"
            );
        });

        // A one-thread pool and a zero budget spin nothing.
        let single = super::tests::pool(1);
        single.install(|| assert!(Spinners::start(&single, Duration::from_secs(1)).is_none()));
        pool.install(|| assert!(Spinners::start(&pool, Duration::ZERO).is_none()));
    }
}
