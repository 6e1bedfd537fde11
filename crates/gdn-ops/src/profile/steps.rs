//! The watcher of labelled steps: what sees every [`super::labelled`] step on every thread
//! while it is set (the model's phase timer, which times each step by its label).
//!
//! The labels are the one way a caller names a step of its work: the kernel profile writes
//! them on its rows, a watcher sees each step run. Process-wide, unlike the kernel profile:
//! the reference plan runs a block's steps on pool workers. Unset (the default), a step pays
//! one relaxed atomic load.

use anyhow::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Sees each labelled step run.
pub trait StepWatch: Send + Sync {
    /// Runs `step`, the work labelled `label` (steps nest: a watcher sees the inner ones
    /// from inside the outer one's `step`).
    fn watch(&self, label: &'static str, step: &mut dyn FnMut() -> Result<()>) -> Result<()>;
}

static WATCHING: AtomicBool = AtomicBool::new(false);
static WATCH: RwLock<Option<Arc<dyn StepWatch>>> = RwLock::new(None);

/// Sets `watch` as the watcher of every thread's steps until the returned guard drops.
/// One at a time: a second one replaces the first.
pub fn watch_steps(watch: Arc<dyn StepWatch>) -> Watching {
    *WATCH.write().unwrap_or_else(|e| e.into_inner()) = Some(watch);
    WATCHING.store(true, Ordering::Relaxed);
    Watching(())
}

/// See [`watch_steps`].
pub struct Watching(());

impl Drop for Watching {
    fn drop(&mut self) {
        WATCHING.store(false, Ordering::Relaxed);
        *WATCH.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The watcher set now, if any.
pub(super) fn watcher() -> Option<Arc<dyn StepWatch>> {
    if !WATCHING.load(Ordering::Relaxed) {
        return None;
    }
    WATCH.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Runs `f` under `watch` as the step `label`.
pub(super) fn run_watched<R>(
    watch: &dyn StepWatch,
    label: &'static str,
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let mut f = Some(f);
    let mut out = None;
    watch.watch(label, &mut || {
        if let Some(f) = f.take() {
            out = Some(f()?);
        }
        Ok(())
    })?;
    out.ok_or_else(|| anyhow::anyhow!("the step watcher did not run the step `{label}`"))
}
