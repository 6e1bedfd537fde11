//! A per-thread switch set for the length of a scope: a mode the caller of a forward call
//! chooses (8-bit activations, row-exact batched products) and the products deep below read,
//! without passing it through every layer. Each model enters one per call, so models with and
//! without the mode can share a process.

use std::cell::Cell;
use std::thread::LocalKey;

/// Sets `flag` on the current thread until dropped, then restores what it was.
pub struct FlagScope {
    flag: &'static LocalKey<Cell<bool>>,
    previous: bool,
}

impl FlagScope {
    pub fn enter(flag: &'static LocalKey<Cell<bool>>, on: bool) -> Self {
        Self {
            flag,
            previous: flag.with(|c| c.replace(on)),
        }
    }
}

impl Drop for FlagScope {
    fn drop(&mut self) {
        self.flag.with(|c| c.set(self.previous));
    }
}
