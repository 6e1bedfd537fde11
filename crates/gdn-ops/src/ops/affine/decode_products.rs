//! Which kernel runs the decode products on CUDA: the tensor-core kernels ([`super::mma`])
//! where they take the matrix and input, else the streamed ones ([`super::stream`]), or the
//! streamed ones always (the reference the tensor-core kernels are measured and tested
//! against). Process-wide, set by `Model::load` from `RunOptions` (`QWEN_GDN_DECODE_PRODUCTS`)
//! like [`super::DenseRows`]; a [`scope`] overrides it on one thread (the tests). Other
//! backends run their own products whatever the choice.

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

super::process_choice::process_choice!(DecodeProducts, set_decode_products, decode_products);

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
