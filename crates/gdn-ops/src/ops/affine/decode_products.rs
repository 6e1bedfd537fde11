//! Which kernel runs the decode products on CUDA: the tensor-core kernels ([`super::mma`])
//! where they take the matrix and input, else the streamed ones ([`super::stream`]), or the
//! streamed ones always (the reference the tensor-core kernels are measured and tested
//! against). Process-wide, set by `Model::load` from `RunOptions` (`QWEN_GDN_DECODE_PRODUCTS`)
//! like [`super::DenseRows`]; a [`scope`] overrides it on one thread (the tests). Other
//! backends run their own products whatever the choice.

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};

/// The decode products' kernel family on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodeProducts {
    /// The tensor-core kernels where they cover the product (4-bit, bf16 activations, one
    /// activation row or gathered expert rows), else the streamed ones.
    #[default]
    Auto,
    /// The streamed kernels (and their wide and split relatives) only: the sums of the CPU
    /// twin's order, lane for lane.
    Streamed,
}

impl DecodeProducts {
    /// Every choice, with its name in `QWEN_GDN_DECODE_PRODUCTS`.
    pub const NAMED: [(&'static str, DecodeProducts); 2] = [
        ("auto", DecodeProducts::Auto),
        ("streamed", DecodeProducts::Streamed),
    ];

    fn code(self) -> u8 {
        match self {
            DecodeProducts::Auto => 0,
            DecodeProducts::Streamed => 1,
        }
    }

    fn from_code(code: u8) -> Self {
        match code {
            1 => DecodeProducts::Streamed,
            _ => DecodeProducts::Auto,
        }
    }
}

static CHOICE: AtomicU8 = AtomicU8::new(0);

thread_local! {
    /// A [`scope`]'s choice on this thread, over the process's.
    static SCOPED: Cell<Option<DecodeProducts>> = const { Cell::new(None) };
}

/// Sets the process's choice (the last model load wins).
pub fn set_decode_products(choice: DecodeProducts) {
    CHOICE.store(choice.code(), Ordering::Relaxed);
}

/// The choice in force on this thread: a [`scope`]'s, else the process's.
pub fn decode_products() -> DecodeProducts {
    SCOPED
        .get()
        .unwrap_or_else(|| DecodeProducts::from_code(CHOICE.load(Ordering::Relaxed)))
}

/// Runs this thread's decode products on `choice` until the guard drops.
pub fn scope(choice: DecodeProducts) -> Scope {
    Scope {
        before: SCOPED.replace(Some(choice)),
    }
}

/// The guard of [`scope`].
#[must_use = "the choice holds while the guard lives"]
pub struct Scope {
    before: Option<DecodeProducts>,
}

impl Drop for Scope {
    fn drop(&mut self) {
        SCOPED.set(self.before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_overrides_the_process_choice_on_its_thread_only() {
        assert_eq!(decode_products(), DecodeProducts::Auto);
        {
            let _s = scope(DecodeProducts::Streamed);
            assert_eq!(decode_products(), DecodeProducts::Streamed);
            let other = std::thread::spawn(decode_products).join().unwrap();
            assert_eq!(other, DecodeProducts::Auto);
        }
        assert_eq!(decode_products(), DecodeProducts::Auto);
        for (name, choice) in DecodeProducts::NAMED {
            assert_eq!(DecodeProducts::from_code(choice.code()), choice, "{name}");
        }
    }
}
