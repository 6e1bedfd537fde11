//! Shader compilation before the first timed call. On Metal our kernels and candle's are
//! compiled from source at their first use, which would otherwise land inside the first
//! prompt's tokens-per-second figure.

use crate::Model;
use anyhow::Result;
use std::time::{Duration, Instant};

impl Model {
    /// Compiles every kernel a prefill chunk and a decode step use: our shader libraries
    /// directly, candle's by running a two-token chunk and one decode step through a scratch
    /// cache. Returns the time it took; on the CPU it does nothing.
    pub fn warm_up(&self) -> Result<Duration> {
        let start = Instant::now();
        if self.device().is_cpu() {
            return Ok(Duration::ZERO);
        }
        #[cfg(any(feature = "metal", target_os = "macos"))]
        if let candle_core::Device::Metal(dev) = self.device() {
            gdn_ops::metal::precompile(dev, self.dtype())?;
        }
        let mut scratch = self.new_cache();
        self.prefill(&[0, 0], &mut scratch, 2)?;
        self.forward_last(&[0], &mut scratch)?;
        self.device().synchronize()?;
        Ok(start.elapsed())
    }
}
