//! Launch geometry of the tensor-core decode products (`affine_mma_*` in
//! kernels/affine_mma.cu): which matrices and inputs they take and how a launch is shaped.
//! Backend-free arithmetic, tested on any machine; scripts/gpu/affine_mma_cuda.py mirrors it
//! for the GPU harness.
//!
//! A warp takes 16 weight rows (8 SwiGLU outputs) and a range of columns, unpacks each 4-bit
//! value into a bf16 pair with ~0.9 instructions (the streamed kernels spend 3) and lets one
//! `mma.sync` m16n8k16 add 256 products; its weights and scales stream through a ring of
//! `cp.async` stages in shared memory. Alone on the H200 they run Qwen3.8-Flash-Next's decode
//! products 1.2–1.4× faster than the streamed kernels, the 80B's head 1.4× and its experts'
//! down 1.1×, and tie (±5%) on the 80B's 2 048- and 4 096-column projections
//! (docs/perf-notes-gpu.md, "The decode products on the tensor cores"; see [`preferred`]). Their sums are not the streamed kernels' bits (f32 on the tensor core,
//! another order): the tests hold them to the CPU twin within bf16 tolerance.

use candle_core::DType;

/// Columns of a super-step: a row's 4 lanes × 32 values (`kSuperCols`).
const SUPER_COLS: usize = 128;
/// Super-steps a ring stage holds (`kBatch`, `AFFINE_MMA_BATCH`).
const BATCH: usize = 2;
/// Ring stages a warp (`kStages`, `AFFINE_MMA_STAGES`).
const STAGES: usize = 2;
/// Bytes of one stage: the weights of 2 rows × 32 lanes × 16 bytes a super-step, and 4 × 32
/// scale or bias pairs of 8 bytes (`sizeof(Stage<SC>)`).
const STAGE_BYTES: usize = BATCH * 2 * 32 * 16 + 4 * 32 * 8;
/// Most warps a block (`kMaxWarps`: the kernels' launch bound).
pub const MAX_WARPS: usize = 16;

/// Whether the tensor-core kernels take this product from the streamed ones on CUDA: where they
/// cover it, unless the streamed kernels fill every lane's chunk steps (2 048 or 4 096 columns
/// at 4 bits: Qwen3-Next-80B's projections, where the two measured within ±5% on the H200) and
/// the matrix is not a head-sized one (≥ 16 384 rows: the tensor cores' 28% faster there).
pub fn preferred(bits: usize, group_size: usize, cols: usize, outputs: usize, x: DType) -> bool {
    covers(bits, group_size, cols, x)
        && !(super::stream::fills_lanes(bits, group_size, cols) && outputs < 16_384)
}

/// Whether the tensor-core kernels take this product: 4-bit weights in groups of 64 or 128, an
/// even count of groups a row (a lane copies a pair of scales at once), whole super-steps of
/// 128 columns, and bf16 activations (the tensor core's operand; the sums are f32).
pub fn covers(bits: usize, group_size: usize, cols: usize, x: DType) -> bool {
    bits == 4
        && matches!(group_size, 64 | 128)
        && cols > 0
        && cols.is_multiple_of(SUPER_COLS)
        && (cols / group_size).is_multiple_of(2)
        && x == DType::BF16
}

/// Output rows a warp's tile takes: 16 products, or 8 SwiGLU outputs (gate and up rows).
pub fn tile_outputs(swiglu: bool) -> usize {
    if swiglu {
        8
    } else {
        16
    }
}

/// Warps splitting a tile's columns: one a whole macro step of 8 groups, at most 8, a power of
/// two (measured on the H200: 512–640 columns 1, 2 048–2 560 4, 4 096–6 144 8; a warp on a
/// partial step only unbalances the split).
pub fn warps(group_size: usize, cols: usize) -> usize {
    let macros = (cols / (8 * group_size)).clamp(1, 8);
    1 << macros.ilog2()
}

/// Dynamic shared memory of a block of `warps` warps: their rings, x permuted in bf16, each
/// group's sum of x, and the warps' sums of two tiles.
pub fn shared_bytes(group_size: usize, cols: usize, warps: usize) -> usize {
    warps * STAGES * STAGE_BYTES + 2 * cols + 4 * (cols / group_size) + 4 * 2 * 16 * warps
}

/// The launch of one product: warps a block and blocks along the tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub warps: usize,
    pub blocks_x: usize,
}

/// Warps a block and the grid's width: `16 / warps` blocks an SM over the `out_rows` grid rows
/// (about 16 warps an SM), never more than the tiles. On the H200 (call 10 of the seventeenth
/// session, timed with 3 ring stages; the shipped 2 not timed at this grid alone) this grid was
/// within 8% of the fastest one measured at Qwen3.8's shapes and 12% on the 80B's head.
pub fn launch(
    group_size: usize,
    cols: usize,
    outputs: usize,
    out_rows: usize,
    swiglu: bool,
    sms: usize,
) -> Launch {
    let warps = warps(group_size, cols);
    let tiles = outputs.div_ceil(tile_outputs(swiglu));
    let per_sm = (16 / warps).max(1);
    Launch {
        warps,
        blocks_x: tiles.min((per_sm * sms).div_ceil(out_rows.max(1))).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_is_4_bit_bf16_in_whole_super_steps_and_pairs_of_groups() {
        for cols in [512, 640, 2048, 2560, 4096, 6144] {
            assert!(covers(4, 64, cols, DType::BF16), "{cols}");
        }
        assert!(covers(4, 128, 2048, DType::BF16));
        assert!(
            !covers(8, 64, 2048, DType::BF16),
            "8-bit: the streamed kernels"
        );
        assert!(!covers(4, 32, 2048, DType::BF16), "groups of 32");
        assert!(!covers(4, 64, 2048, DType::F32), "f32 activations");
        assert!(!covers(4, 64, 2048, DType::F16), "f16 activations");
        assert!(!covers(4, 64, 2112, DType::BF16), "not whole super-steps");
        assert!(!covers(4, 128, 640, DType::BF16), "5 groups: an odd count");
        assert!(!covers(4, 64, 0, DType::BF16));
    }

    #[test]
    fn the_streamed_kernels_keep_the_matrices_they_fill() {
        // Qwen3-Next-80B: the 2 048- and 4 096-column projections stay streamed, the head and
        // the experts' down (512 columns, one chunk step a lane) go to the tensor cores.
        assert!(!preferred(4, 64, 2048, 12352, DType::BF16));
        assert!(!preferred(4, 64, 4096, 2048, DType::BF16));
        assert!(preferred(4, 64, 2048, 151_936, DType::BF16));
        assert!(preferred(4, 64, 512, 2048, DType::BF16));
        // Qwen3.8-Flash-Next: every product (2 560 and 640 columns leave lanes idle, 6 144 is
        // past the streamed kernels).
        for (cols, outputs) in [(2560, 16480), (2560, 640), (6144, 2560), (640, 2560)] {
            assert!(preferred(4, 64, cols, outputs, DType::BF16), "{cols}");
        }
    }

    #[test]
    fn launches_at_the_decode_shapes_are_the_measured_ones() {
        let at = |cols, outputs, out_rows, swiglu| {
            let l = launch(64, cols, outputs, out_rows, swiglu, 132);
            (l.warps, l.blocks_x)
        };
        // Qwen3-Next-80B: in-projection and q/k/v (4 warps, 4 blocks an SM), out-projection
        // (8 warps, every tile), the experts' gate/up over 11 slots and down (one warp, every
        // tile), the head.
        assert_eq!(at(2048, 12352, 1, false), (4, 528));
        assert_eq!(at(4096, 2048, 1, false), (8, 128));
        assert_eq!(at(2048, 512, 11, true), (4, 48));
        assert_eq!(at(512, 2048, 11, false), (1, 128));
        assert_eq!(at(2048, 151936, 1, false), (4, 528));
        // Qwen3.8-Flash-Next: in-projection, out-projection, gate/up and down.
        assert_eq!(at(2560, 16480, 1, false), (4, 528));
        assert_eq!(at(6144, 2560, 1, false), (8, 160));
        assert_eq!(at(2560, 640, 11, true), (4, 48));
        assert_eq!(at(640, 2560, 11, false), (1, 160));
        // Fewer tiles than the target: every tile its block.
        assert_eq!(at(2048, 40, 1, false), (4, 3));
    }

    #[test]
    fn blocks_fit_an_sm_and_stay_in_the_launch_bound() {
        for cols in [128, 512, 640, 2048, 2560, 4096, 6144, 8192, 16384] {
            let w = warps(64, cols);
            assert!((1..=8).contains(&w) && w.is_power_of_two());
            assert!(w <= MAX_WARPS);
            // 227 KB a block at most on an H100/H200.
            assert!(shared_bytes(64, cols, w) <= 227 * 1024, "{cols}");
        }
        assert_eq!(shared_bytes(64, 2048, 4), 4 * 2 * 3072 + 4096 + 128 + 512);
    }
}
