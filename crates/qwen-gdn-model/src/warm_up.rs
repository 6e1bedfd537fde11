//! Shader compilation before the first timed call. On Metal our kernels and candle's are
//! compiled from source at their first use, which would otherwise land inside the first
//! prompt's tokens-per-second figure.

use crate::Model;
use anyhow::Result;
use std::time::{Duration, Instant};

impl Model {
    /// Compiles every kernel a prefill chunk and a decode step use (ours and candle's), by
    /// running a two-token chunk and one decode step through a scratch cache. Returns the
    /// time it took; on the CPU it does nothing.
    pub fn warm_up(&self) -> Result<Duration> {
        let start = Instant::now();
        if self.device().is_cpu() {
            return Ok(Duration::ZERO);
        }
        let mut scratch = self.new_cache();
        self.prefill(&[0, 0], &mut scratch, 2)?;
        self.forward_last(&[0], &mut scratch)?;
        self.device().synchronize()?;
        Ok(start.elapsed())
    }
}
