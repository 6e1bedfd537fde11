//! When one rank of an `mpirun` job ends early (it died, or it gave up on a stalled peer),
//! Open MPI stops every other rank with SIGTERM. Each of them then still ends with one line
//! naming itself, instead of vanishing mid-wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

static LINE: OnceLock<Vec<u8>> = OnceLock::new();
/// Set once the process has printed its own last line ([`mute`]).
static MUTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_terminate(_signal: libc::c_int) {
    // Only async-signal-safe calls: write(2) of a line prepared in advance, then _exit.
    if let Some(line) = LINE.get().filter(|_| !MUTED.load(Ordering::SeqCst)) {
        // SAFETY: the pointer and length come from a live, never-freed Vec.
        unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    }
    // SAFETY: _exit has no preconditions; 143 = 128 + SIGTERM, as shells report it.
    unsafe { libc::_exit(143) };
}

/// From now on a SIGTERM (the launcher stopping this rank) ends the process with exit code 143
/// and the one line `error: rank <rank>: stopped by the launcher after another rank ended`.
pub fn install(rank: usize) {
    let line = format!("error: rank {rank}: stopped by the launcher after another rank ended\n");
    if LINE.set(line.into_bytes()).is_err() {
        return; // installed already
    }
    let handler: extern "C" fn(libc::c_int) = on_terminate;
    // SAFETY: the handler only calls async-signal-safe functions.
    unsafe { libc::signal(libc::SIGTERM, handler as libc::sighandler_t) };
}

/// The process is about to print its own last line and exit: a SIGTERM from now on ends it
/// silently, so that it never ends with two lines.
pub fn mute() {
    MUTED.store(true, Ordering::SeqCst);
}
