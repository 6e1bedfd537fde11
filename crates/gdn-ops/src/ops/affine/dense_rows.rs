//! How a single quantized matrix multiplies more activation rows than the decode products take
//! ([`super::MATVEC_MAX_ROWS`]) and at most [`DENSE_ROWS_MAX`]: the rows of a batched decode
//! step (issue 29: the in/out projections, the router, the shared expert and the head of B
//! sequences at once).
//!
//! Four ways, none of which makes a dequantized copy of the matrix:
//! - [`DenseRows::RowProducts`]: the decode products with one output row per activation row
//!   (`x_div` = 1). Each row runs exactly the sums it runs alone, so a batched step's row is
//!   bit for bit its single-sequence step's. Each row unpacks the whole matrix again (from L2
//!   when the rows' blocks walk it together): the instructions grow with B.
//! - [`DenseRows::Grouped`]: the prefill's grouped quantized GEMM
//!   (`ops/affine_grouped`, kernels/affine_grouped.{cu,metal}) with one group: every row in one
//!   tile of at most [`crate::ops::affine_grouped::TILE_PAIRS`], the packed weights read and
//!   dequantized once, the products on tensor cores. Its grid is one block per 128 output
//!   rows, so it fills the GPU only on tall matrices (the head); the sums differ from the
//!   decode products' (within the f32 gate, not bit for bit).
//! - [`DenseRows::SplitK`]: the same GEMM with its columns cut into slices so that a matrix
//!   of any height gets ~2 blocks per SM (`ops/affine_grouped/split_k.rs`): f32 partial sums
//!   per slice, added in a fixed order by a second launch (the same bits every run). CUDA,
//!   Metal (`kernels/affine_grouped.metal`'s split entries) and the CPU twin.
//! - [`DenseRows::Dequantize`]: the whole matrix dequantized into x's dtype and a dense GEMM,
//!   every step (what ran before; ~4× the packed bytes written and read again, 2 launches).
//!
//! [`DenseRows::Auto`] picks by rows and shape (argued in docs/perf-notes-gpu.md, "Dense
//! products of 5–64 rows"). The choice is process-wide, set by `Model::load` from
//! `RunOptions` (`QWEN_GDN_DENSE_ROWS`), like the CPU level: the products are leaves under
//! every layer. A [`scope`] overrides it on one thread (the tests).

/// Most activation rows the choice covers: a batched decode step's (the gathered expert
/// products' bound too). More rows are a prefill chunk's and dequantize once.
pub const DENSE_ROWS_MAX: usize = crate::ops::affine::GATHER_MAX_TOKENS;

/// Up to this many rows [`DenseRows::Auto`] runs the row products: on the H200 the decode
/// products of Qwen3-Next-80B's dense matrices take ~0.26 ms of issue a row (≈ 2.2 G weights,
/// ~4 instructions each, at ~33 T lane-instructions/s), against ~1.8 ms of dequantized bytes
/// plus two launches a product for the dequantizing path: they break even near 7 rows.
pub const AUTO_ROW_PRODUCTS_MAX: usize = 8;

/// Output rows from which [`DenseRows::Auto`] takes the grouped GEMM where there is no split
/// kernel (Metal): 128 blocks of its 128
/// rows, about one block per SM of an H100/H200 (132). Below it the GEMM's few blocks walk
/// the columns alone (a 2 048-row out-projection: 16 blocks) and the dequantizing path's full
/// grids win; above it (the 151 936-row head) it reads 155 MB once where the dequantizing path
/// writes and reads ~620 MB twice.
pub const AUTO_GROUPED_MIN_OUTPUTS: usize = 128 * 128;

/// Weights × activation rows up to which [`DenseRows::Auto`] keeps a product of more than
/// [`AUTO_ROW_PRODUCTS_MAX`] rows on the row products rather than split-K: short matrices
/// such as the router (513 × 2 048), whose split launch is nearly all fixed cost. Measured on
/// the H200 (docs/perf-notes-gpu.md, "Split-K dense products" and "The verify pass of 4
/// tokens"): split-K costs the router 15.8 µs a call at 16 rows (two launches, 32 slices of one
/// step each and their partial planes, for 1 M weights), while the row products cost about
/// 6 µs plus 0.29 ns a weight and row (the router 7.0 µs at 4 rows, the 25 M-weight
/// in-projection 29.7 µs at 4 rows). They break even near (15.8 − 6) µs / 0.29 ns ≈ 34 M
/// weight-rows: the router up to 32 rows; the in- and out-projections (25 M, 8.4 M weights)
/// never past 8 rows.
pub const AUTO_ROW_PRODUCTS_MAX_WEIGHT_ROWS: usize = 34_000_000;

/// How [`super::AffineTensor::matmul_t`] runs 5..=[`DENSE_ROWS_MAX`] rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DenseRows {
    /// Row products up to [`AUTO_ROW_PRODUCTS_MAX`] rows, and on short matrices up to
    /// [`AUTO_ROW_PRODUCTS_MAX_WEIGHT_ROWS`]; then the split-K GEMM where the device has it;
    /// elsewhere the grouped GEMM on matrices of at least [`AUTO_GROUPED_MIN_OUTPUTS`] rows,
    /// else dequantize.
    #[default]
    Auto,
    /// Dequantize and a dense GEMM (the reference the others are tested against).
    Dequantize,
    /// The decode products, one output row per activation row (each row bit for bit alone).
    RowProducts,
    /// The grouped quantized GEMM with one group, where the device has it.
    Grouped,
    /// As `Auto`, with 2..=8 dense rows in one pass over the weights (`affine_stream_rows_*`
    /// on CUDA, `affine_qmv_pass_*` on Metal: each weight chunk unpacked once for all rows,
    /// each row's bits as alone). Opt-in: on the H200 it ran slower than the row products'
    /// grid of one block row per activation row (`gdn.in_proj` over 4 rows 38.7 µs a call
    /// against 29.7; docs/perf-notes-gpu.md, "rows8"), and Metal's is not measured.
    OnePass,
    /// The grouped GEMM split over column slices, where the device has it (else dequantize).
    SplitK,
}

impl DenseRows {
    /// Every choice, with its name in `QWEN_GDN_DENSE_ROWS`.
    pub const NAMED: [(&'static str, DenseRows); 6] = [
        ("auto", DenseRows::Auto),
        ("dequantize", DenseRows::Dequantize),
        ("rows", DenseRows::RowProducts),
        ("grouped", DenseRows::Grouped),
        ("one-pass", DenseRows::OnePass),
        ("split", DenseRows::SplitK),
    ];

    fn code(self) -> u8 {
        match self {
            DenseRows::Auto => 0,
            DenseRows::Dequantize => 1,
            DenseRows::RowProducts => 2,
            DenseRows::Grouped => 3,
            DenseRows::OnePass => 4,
            DenseRows::SplitK => 5,
        }
    }

    fn from_code(code: u8) -> Self {
        match code {
            1 => DenseRows::Dequantize,
            2 => DenseRows::RowProducts,
            3 => DenseRows::Grouped,
            4 => DenseRows::OnePass,
            5 => DenseRows::SplitK,
            _ => DenseRows::Auto,
        }
    }

    /// The most rows one product runs as row products under this choice (each row the bits
    /// it gets alone, whatever the matrix): a verify pass of more rows runs as several.
    pub fn row_products_max(self) -> usize {
        match self {
            DenseRows::Auto | DenseRows::OnePass => AUTO_ROW_PRODUCTS_MAX,
            DenseRows::RowProducts => DENSE_ROWS_MAX,
            DenseRows::Dequantize | DenseRows::Grouped | DenseRows::SplitK => {
                crate::ops::affine::MATVEC_MAX_ROWS
            }
        }
    }

    /// The path for `x_rows` activation rows (in `MATVEC_MAX_ROWS < x_rows <= DENSE_ROWS_MAX`)
    /// of a matrix of `outputs` rows and `cols` columns; `grouped` and `split` say whether the
    /// grouped and the split-K kernels take this matrix, input and device. Never `Auto`;
    /// `Grouped` and `SplitK` fall back to `Dequantize` where their kernel is missing.
    pub fn path(
        self,
        x_rows: usize,
        [outputs, cols]: [usize; 2],
        grouped: bool,
        split: bool,
    ) -> DenseRows {
        debug_assert!(x_rows <= DENSE_ROWS_MAX);
        match self {
            DenseRows::Auto | DenseRows::OnePass
                if x_rows <= AUTO_ROW_PRODUCTS_MAX || short_matrix(x_rows, outputs, cols) =>
            {
                DenseRows::RowProducts
            }
            DenseRows::Auto | DenseRows::OnePass | DenseRows::SplitK if split => DenseRows::SplitK,
            DenseRows::Auto | DenseRows::OnePass | DenseRows::Grouped
                if grouped
                    && (self == DenseRows::Grouped || outputs >= AUTO_GROUPED_MIN_OUTPUTS) =>
            {
                DenseRows::Grouped
            }
            DenseRows::RowProducts => DenseRows::RowProducts,
            _ => DenseRows::Dequantize,
        }
    }
}

/// Whether `x_rows` rows of an `outputs × cols` matrix cost the row products less than a
/// split-K launch: at most [`AUTO_ROW_PRODUCTS_MAX_WEIGHT_ROWS`] weight-rows (the router;
/// every backend alike, the split launch's fixed cost being its two launches and its partials).
fn short_matrix(x_rows: usize, outputs: usize, cols: usize) -> bool {
    outputs.saturating_mul(cols).saturating_mul(x_rows) <= AUTO_ROW_PRODUCTS_MAX_WEIGHT_ROWS
}

super::process_choice::process_choice!(DenseRows, set_dense_rows, dense_rows);

/// Whether dense products of 2..=8 rows run in one pass over the weights on this thread
/// ([`DenseRows::OnePass`]).
pub fn one_pass() -> bool {
    dense_rows() == DenseRows::OnePass
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_row_products_then_the_split_gemm() {
        let auto = DenseRows::Auto;
        assert_eq!(
            auto.path(5, [2048, 4096], true, true),
            DenseRows::RowProducts
        );
        assert_eq!(
            auto.path(8, [151_936, 2048], true, true),
            DenseRows::RowProducts
        );
        // 9..=64 rows: split-K where the kernel exists (CUDA, Metal, the CPU twin).
        assert_eq!(auto.path(9, [2048, 4096], true, true), DenseRows::SplitK);
        assert_eq!(auto.path(16, [12_352, 2048], true, true), DenseRows::SplitK);
        assert_eq!(
            auto.path(64, [151_936, 2048], true, true),
            DenseRows::SplitK
        );
        // No split kernel (a format it does not take): the grouped GEMM on tall matrices, else
        // dequantize.
        assert_eq!(
            auto.path(9, [151_936, 2048], true, false),
            DenseRows::Grouped
        );
        assert_eq!(
            auto.path(64, [151_936, 2048], true, false),
            DenseRows::Grouped
        );
        assert_eq!(
            auto.path(16, [12_352, 2048], true, false),
            DenseRows::Dequantize
        );
        assert_eq!(
            auto.path(16, [151_936, 2048], false, false),
            DenseRows::Dequantize
        );
    }

    #[test]
    fn short_matrices_keep_the_row_products_past_eight_rows() {
        // Qwen3-Next-80B at B = 16: the router (513 × 2 048, 17 M weight-rows) on the row
        // products, the in-projection (12 352 × 2 048) on split-K, on CUDA and Metal alike.
        let (router, in_proj) = ([513, 2048], [12_352, 2048]);
        for grouped in [true, false] {
            assert_eq!(
                DenseRows::Auto.path(16, router, grouped, true),
                DenseRows::RowProducts
            );
            assert_eq!(
                DenseRows::Auto.path(16, in_proj, grouped, true),
                DenseRows::SplitK
            );
        }
        // The router up to 32 rows (33.6 M weight-rows at 32, 34.6 M at 33: split-K from 33).
        assert_eq!(
            DenseRows::Auto.path(32, router, true, true),
            DenseRows::RowProducts
        );
        assert_eq!(
            DenseRows::Auto.path(33, router, true, true),
            DenseRows::SplitK
        );
        assert_eq!(
            DenseRows::Auto.path(64, router, true, true),
            DenseRows::SplitK
        );
        assert_eq!(
            DenseRows::OnePass.path(16, router, true, true),
            DenseRows::RowProducts
        );
        // No split kernel: the same rule first.
        assert_eq!(
            DenseRows::Auto.path(16, router, true, false),
            DenseRows::RowProducts
        );
        // The out-projection (2 048 × 4 096) is split from 9 rows.
        assert_eq!(
            DenseRows::Auto.path(9, [2048, 4096], true, true),
            DenseRows::SplitK
        );
        // `split` forces split-K on every matrix (for measuring), `dequantize` its path.
        assert_eq!(
            DenseRows::SplitK.path(16, router, true, true),
            DenseRows::SplitK
        );
        assert_eq!(
            DenseRows::Dequantize.path(16, router, true, true),
            DenseRows::Dequantize
        );
    }

    #[test]
    fn a_scope_overrides_the_process_choice_on_its_thread_only() {
        let process = dense_rows();
        {
            let _rows = scope(DenseRows::RowProducts);
            assert_eq!(dense_rows(), DenseRows::RowProducts);
            {
                let _inner = scope(DenseRows::Grouped);
                assert_eq!(dense_rows(), DenseRows::Grouped);
            }
            assert_eq!(dense_rows(), DenseRows::RowProducts);
            let other = std::thread::spawn(dense_rows).join().unwrap();
            assert_eq!(other, process, "another thread keeps the process's choice");
        }
        assert_eq!(dense_rows(), process);
    }

    #[test]
    fn forced_choices_hold_where_the_kernel_exists() {
        assert_eq!(
            DenseRows::RowProducts.path(64, [2048, 4096], true, true),
            DenseRows::RowProducts
        );
        assert_eq!(
            DenseRows::Grouped.path(5, [2048, 4096], true, true),
            DenseRows::Grouped
        );
        assert_eq!(
            DenseRows::Grouped.path(5, [2048, 4096], false, false),
            DenseRows::Dequantize
        );
        assert_eq!(
            DenseRows::Dequantize.path(5, [151_936, 2048], true, true),
            DenseRows::Dequantize
        );
        assert_eq!(
            DenseRows::SplitK.path(5, [2048, 4096], true, true),
            DenseRows::SplitK
        );
        assert_eq!(
            DenseRows::SplitK.path(16, [2048, 4096], true, false),
            DenseRows::Dequantize
        );
        for (_, c) in DenseRows::NAMED {
            assert_eq!(DenseRows::from_code(c.code()), c);
        }
        assert_eq!(DenseRows::Auto.row_products_max(), 8);
        assert_eq!(DenseRows::Dequantize.row_products_max(), 4);
    }
}
