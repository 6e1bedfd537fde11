//! Launch geometry of the block-split decode products (`affine_split_products_*` in
//! kernels/affine.cu): which products take them and how a launch is shaped. Backend-free
//! arithmetic, tested on any machine.
//!
//! The wide kernels ([`super::wide`]) give a row to a warp (or less); a matrix of few rows and
//! long rows (qwen4_exp's merged hyper-connection down+inject product: 324 rows of 10 240
//! four-bit columns, too long a row for the streamed kernels) then leaves most SMs idle while
//! each lane walks many chunks one round trip after another. The split kernel puts a block of
//! [`WARPS`] warps on each row (or two), reduced in shared memory: many times the warps, each
//! lane with one or two chunks a row, all in flight at once.

use super::{stream, wide};

/// Warps per block (`kSplitWarps` in kernels/affine.cu).
pub const WARPS: usize = 8;

/// Below this many warps an SM the wide kernel's grid leaves the memory idle.
const WIDE_WARPS_PER_SM: usize = 4;

/// Whether a product (not a SwiGLU) of `outputs` rows for `out_rows` activation rows takes the
/// split kernel: the wide kernels cover the matrix, the streamed ones do not (rows longer than
/// 4 chunks a lane), and the wide kernel's grid would give fewer than
/// [`WIDE_WARPS_PER_SM`] warps an SM.
pub fn chooses(
    bits: usize,
    group_size: usize,
    cols: usize,
    outputs: usize,
    out_rows: usize,
    sms: usize,
) -> bool {
    if !wide::covers(bits, group_size, cols) || stream::covers(bits, group_size, cols) {
        return false;
    }
    let lpr = wide::lanes_per_row(bits, cols);
    let rows = wide::rows_per_group(outputs, out_rows, lpr, false, sms);
    let wide_warps = wide::blocks_x(outputs, lpr, rows) * wide::WARPS * out_rows;
    wide_warps < WIDE_WARPS_PER_SM * sms
}

/// Output rows a block: 2 where that still gives every SM a block (half the re-reads of x),
/// else 1.
pub fn rows_per_block(outputs: usize, out_rows: usize, sms: usize) -> usize {
    if outputs.div_ceil(2) * out_rows >= sms {
        2
    } else {
        1
    }
}

/// Blocks along the outputs.
pub fn blocks_x(outputs: usize, rows: usize) -> usize {
    outputs.div_ceil(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_merged_hyper_connection_product_takes_the_split_kernel() {
        // qwen4_exp release: R + S = 320 + 4 rows over S·H = 4 · 2 560 columns, 4-bit g64.
        assert!(chooses(4, 64, 10240, 324, 1, 132));
        assert_eq!(rows_per_block(324, 1, 132), 2);
        assert_eq!(blocks_x(324, 2), 162);
        // The release's 8-bit router (513 rows of 2 560: 5 chunks a lane, not streamed): the
        // wide grid's 129 blocks of 4 warps are 516 warps, under 4 an SM.
        assert!(chooses(8, 64, 2560, 513, 1, 132));
        // Its up product's rows are short (320 columns): not this kernel's.
        assert!(!chooses(4, 64, 320, 10240, 1, 132));
        // The streamed kernels' shapes stay theirs: the in-projection, the out-projection.
        assert!(!chooses(4, 64, 2048, 12352, 1, 132));
        assert!(!chooses(4, 64, 4096, 2048, 1, 132));
        // A long-row matrix of many rows fills the wide grid already (the GDN out-projection
        // of 6 144 columns, 2 560 rows: 1 280 warps).
        assert!(!chooses(4, 64, 6144, 2560, 1, 132));
        // What the wide kernels do not cover, neither does this.
        assert!(!chooses(3, 64, 10240, 324, 1, 132));
        // Few rows for few SMs: one row a block.
        assert_eq!(rows_per_block(100, 1, 132), 1);
    }
}
