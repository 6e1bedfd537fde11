//! How a rank waits for a transfer it polls (MPI's requests, NCCL's stream): the engines' own
//! waits spin a core for as long as the peer takes, and a rank may wait on a person.

use std::time::{Duration, Instant};

/// The pause between two polls of one wait.
pub(crate) struct PollPause {
    start: Instant,
    polls: u32,
}

impl PollPause {
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
            polls: 0,
        }
    }

    /// How long this wait has lasted.
    pub(crate) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Spins briefly (a decode step's activation arrives within microseconds of being sent),
    /// then gives the core back: ranks may share cores with each other; past a second (a rank
    /// waiting on a person) it wakes up less often.
    pub(crate) fn pause(&mut self) {
        self.polls += 1;
        if self.polls < 1000 {
            std::hint::spin_loop();
        } else if self.start.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
