//! The processes a launcher of this binary started (`mpirun` for MPI ranks, or the ranks of an
//! NCCL job: `rank_launch.rs`), and the SIGTERM that goes on to them: a service manager stopping
//! `serve --ranks N` stops the whole job, instead of ending the launcher alone and leaving the
//! job running without it. (Ctrl-C reaches them from the terminal: they stay in its process
//! group, where rank 0 of `chat` reads its input.)

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// The most processes one launcher starts (one rank a GPU: hosts have at most 16).
pub(crate) const MAX_CHILDREN: usize = 64;

/// Their process ids (0: not started). A fixed array of atomics: a signal handler may read
/// nothing else.
static PIDS: [AtomicI32; MAX_CHILDREN] = [const { AtomicI32::new(0) }; MAX_CHILDREN];
static STARTED: AtomicUsize = AtomicUsize::new(0);

/// From now on a SIGTERM to this process goes on to `pid` (a child it started) too, and this
/// process goes on waiting for its children to end.
pub fn forward_sigterm_to(pid: u32) {
    let (Ok(pid), slot) = (i32::try_from(pid), STARTED.fetch_add(1, Ordering::SeqCst)) else {
        return;
    };
    let Some(entry) = PIDS.get(slot) else {
        return;
    };
    entry.store(pid, Ordering::SeqCst);
    let handler: extern "C" fn(libc::c_int) = signal_children;
    // SAFETY: the handler only reads atomics and calls kill, both async-signal-safe.
    unsafe { libc::signal(libc::SIGTERM, handler as libc::sighandler_t) };
}

/// Sends `signal` to every child started so far (one that has ended already ignores it: its
/// zombie is not reaped until the launcher's wait has seen it, so its pid is not reused
/// meanwhile).
pub(crate) extern "C" fn signal_children(signal: libc::c_int) {
    for pid in &PIDS {
        let pid = pid.load(Ordering::SeqCst);
        if pid > 0 {
            // SAFETY: kill has no memory preconditions; the pid is our own child's.
            unsafe { libc::kill(pid, signal) };
        }
    }
}
