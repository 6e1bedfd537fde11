//! One reply's own work in a step (its prefill, sampling, constraint, stop strings, text)
//! run so that a panic in it fails that reply alone: the panic becomes the reply's error and
//! the other replies of the step go on, exact, as their states are not touched by another
//! reply's work. (The batched decode step itself is shared: a panic there fails every reply
//! in it.)

use anyhow::{anyhow, Result};
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A panic turned into an error, so that the caller can tell it from an ordinary failure
/// (state the panic may have left half-written must be dropped).
#[derive(Debug)]
pub struct Panicked(pub String);

impl std::fmt::Display for Panicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "panic: {}", self.0)
    }
}

impl std::error::Error for Panicked {}

/// `work`'s result, or its panic as a [`Panicked`] error. What `work` borrows mutably must
/// be dropped by the caller after a panic (the reply it belongs to has failed).
pub fn isolated<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(result) => result,
        Err(payload) => Err(anyhow!(Panicked(panic_message(payload.as_ref()).into()))),
    }
}

/// The text a panic was raised with.
pub fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("a panic")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_error_and_an_error_stays_itself() {
        let e = isolated::<()>(|| panic!("sampler broke at {}", 3)).unwrap_err();
        assert_eq!(e.to_string(), "panic: sampler broke at 3");
        assert!(e.is::<Panicked>());
        let e = isolated::<()>(|| Err(anyhow!("plain"))).unwrap_err();
        assert!(!e.is::<Panicked>());
        assert_eq!(isolated(|| Ok(5)).unwrap(), 5);
    }
}
