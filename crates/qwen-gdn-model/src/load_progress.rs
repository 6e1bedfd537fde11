//! A callback that follows how much of a checkpoint has been read while a model loads, so
//! that a front end can draw it (loading tens of gigabytes takes minutes).

use std::sync::Arc;

/// Called with (bytes of tensor data read so far, bytes the model will read in all), after
/// each tensor is read; possibly from several threads.
#[derive(Clone)]
pub struct LoadProgress(Arc<dyn Fn(u64, u64) + Send + Sync>);

impl LoadProgress {
    pub fn new(report: impl Fn(u64, u64) + Send + Sync + 'static) -> Self {
        Self(Arc::new(report))
    }

    pub(crate) fn report(&self, done: u64, total: u64) {
        (self.0)(done, total)
    }
}

impl std::fmt::Debug for LoadProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoadProgress")
    }
}
