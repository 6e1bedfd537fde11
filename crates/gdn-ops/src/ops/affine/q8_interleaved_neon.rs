//! The interleaved q8 kernel ([`q8_interleaved`](super::q8_interleaved)) on aarch64: with the
//! dot-product extension (`sdot`: four i8 × i8 products summed into each i32 lane, the
//! activation word taken from a register lane, as `vpdpbusd` takes a broadcast one) and with
//! the 8-bit matrix multiply (`smmla`: a 2 × 8 by 8 × 2 product per instruction, two weight
//! rows against two activation rows). A block's sixteen rows are four quarters of four rows,
//! one 32-bit lane each; each quarter runs the whole block with its own accumulators.
//!
//! The 4-bit weights (0..15) are valid i8 values, so the signed forms take them as they are.
//! The integer sums are exact in every copy and the float steps are the portable kernel's, in
//! its order: the results are bit for bit the portable kernel's.
//!
//! `sdot` and `smmla` are written as inline assembly: their `std::arch` intrinsics are not
//! stable yet (`stdarch_neon_dotprod`, `stdarch_neon_i8mm`).

use super::q8_interleaved_block::{Block, Param, ROWS, WORDS_PER_CHUNK};
use super::q8_kernel::{Activation, CHUNK};
use std::arch::aarch64::*;
use std::arch::asm;

/// `acc[i] += Σ_k w[4i + k] · x[4·LANE + k]` (i8 × i8 into i32): `sdot` by element.
#[target_feature(enable = "neon,dotprod")]
#[inline]
unsafe fn sdot_lane<const LANE: i32>(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    asm!(
        "sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[{lane}]",
        acc = inout(vreg) acc,
        w = in(vreg) w,
        x = in(vreg) x,
        lane = const LANE,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// `acc += a · bᵀ` for `a`, `b` two rows of eight i8 each, `acc` the 2 × 2 i32 result row by
/// row: `smmla`.
#[target_feature(enable = "neon,i8mm")]
#[inline]
unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    asm!(
        "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// Four scales or biases (rows `at .. at + 4` of a group), widened to f32.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn load4<P: Param>(p: &[P], at: usize) -> float32x4_t {
    debug_assert!(at + 4 <= p.len());
    let ptr = p.as_ptr().add(at);
    if P::IS_BF16 {
        // A bf16 is the top half of an f32.
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(ptr as *const u16)))
    } else {
        vld1q_f32(ptr as *const f32)
    }
}

/// The float steps shared by both copies, for one quarter of rows and `A` activation rows:
/// the bias sums per group, then per chunk half `acc_h += f32(isum) · (x_scale · w_scale)`
/// with the integer sums from `isums(c, h)`, and `(acc_0 + acc_1) + bias sum` stored at
/// `out[a][quarter..]`.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn quarter<P: Param, const A: usize>(
    b: &Block<P>,
    xs: [&Activation; A],
    quarter: usize,
    groups: usize,
    mut isums: impl FnMut(usize, usize) -> [int32x4_t; A],
    out: [&mut [f32; ROWS]; A],
) {
    let mut acc = [[vdupq_n_f32(0.0); A]; 2];
    let mut bacc = [vdupq_n_f32(0.0); A];
    for g in 0..groups {
        let (ws, bs) = (
            load4(b.scales, g * ROWS + quarter),
            load4(b.biases, g * ROWS + quarter),
        );
        for a in 0..A {
            let sum = vdupq_n_f32(*xs[a].group_sums.get_unchecked(g));
            bacc[a] = vfmaq_f32(bacc[a], bs, sum);
        }
        for c in g * b.chunks_per_group..(g + 1) * b.chunks_per_group {
            for (h, acc_h) in acc.iter_mut().enumerate() {
                let isum = isums(c, h);
                for a in 0..A {
                    let x_scale = *xs[a].q.lane_scales().get_unchecked(8 * c + 4 * h);
                    let dx = vmulq_f32(vdupq_n_f32(x_scale), ws);
                    acc_h[a] = vfmaq_f32(acc_h[a], vcvtq_f32_s32(isum[a]), dx);
                }
            }
        }
    }
    for (a, out) in out.into_iter().enumerate() {
        let v = vaddq_f32(vaddq_f32(acc[0][a], acc[1][a]), bacc[a]);
        vst1q_f32(out.as_mut_ptr().add(quarter), v);
    }
}

/// The low and high nibbles of word `l` of chunk `c` for the quarter's four rows.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn nibbles<P>(b: &Block<P>, c: usize, l: usize, quarter: usize) -> (int8x16_t, int8x16_t) {
    let at = b
        .words
        .as_ptr()
        .add((c * WORDS_PER_CHUNK + l) * ROWS + quarter);
    let packed = vld1q_u8(at as *const u8);
    let lo = vandq_u8(packed, vdupq_n_u8(0x0F));
    let hi = vshrq_n_u8::<4>(packed);
    (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
}

/// The kernel with `sdot`: per chunk half, four words per row, each word's low nibbles against
/// the four even activations of one lane and its high nibbles against the four odd ones.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn block_dots_sdot<P: Param, const A: usize>(
    b: &Block<P>,
    xs: &[Activation; A],
) -> [[f32; ROWS]; A] {
    let groups = b.checked_groups(xs);
    let refs: [&Activation; A] = std::array::from_fn(|a| &xs[a]);
    let mut out = [[0f32; ROWS]; A];
    for q in (0..ROWS).step_by(4) {
        let isums = |c: usize, h: usize| -> [int32x4_t; A] {
            // The even elements of the chunk half (words 4h .. 4h + 4), then the odd ones.
            let x_at = |a: usize, odd: usize| {
                vld1q_s8(
                    refs[a]
                        .q
                        .values()
                        .as_ptr()
                        .add(c * CHUNK + odd * CHUNK / 2 + 16 * h),
                )
            };
            let even: [int8x16_t; A] = std::array::from_fn(|a| x_at(a, 0));
            let odd: [int8x16_t; A] = std::array::from_fn(|a| x_at(a, 1));
            let mut isum = [vdupq_n_s32(0); A];
            macro_rules! word {
                ($lane:literal) => {
                    let (lo, hi) = nibbles(b, c, 4 * h + $lane, q);
                    for a in 0..A {
                        isum[a] = sdot_lane::<$lane>(isum[a], lo, even[a]);
                        isum[a] = sdot_lane::<$lane>(isum[a], hi, odd[a]);
                    }
                };
            }
            word!(0);
            word!(1);
            word!(2);
            word!(3);
            isum
        };
        let outs = out.each_mut();
        quarter(b, refs, q, groups, isums, outs);
    }
    out
}

/// The kernel with `smmla` for pairs of activation rows (a last odd row takes `sdot`): words
/// `l` and `l + 1` of rows `i` and `i + 1` zipped into a 2 × 8 matrix, against the same eight
/// elements of both activation rows; the 2 × 2 results are unzipped into each activation
/// row's four rows.
#[target_feature(enable = "neon,dotprod,i8mm")]
pub(super) unsafe fn block_dots_smmla<P: Param, const A: usize>(
    b: &Block<P>,
    xs: &[Activation; A],
) -> [[f32; ROWS]; A] {
    let groups = b.checked_groups(xs);
    let mut out = [[0f32; ROWS]; A];
    for a in (0..A - A % 2).step_by(2) {
        let pair = [&xs[a], &xs[a + 1]];
        let (first, second) = out[a..a + 2].split_at_mut(1);
        for q in (0..ROWS).step_by(4) {
            let isums = |c: usize, h: usize| -> [int32x4_t; 2] {
                // Eight elements (words l, l + 1) of both activation rows, even or odd ones.
                let x_at = |odd: usize, l: usize| {
                    let at = |x: &Activation| {
                        vld1_s8(
                            x.q.values()
                                .as_ptr()
                                .add(c * CHUNK + odd * CHUNK / 2 + 4 * l),
                        )
                    };
                    vcombine_s8(at(pair[0]), at(pair[1]))
                };
                // Rows (0, 1) and (2, 3) of the quarter against both activation rows.
                let (mut r01, mut r23) = (vdupq_n_s32(0), vdupq_n_s32(0));
                for l in [4 * h, 4 * h + 2] {
                    let (lo0, hi0) = nibbles(b, c, l, q);
                    let (lo1, hi1) = nibbles(b, c, l + 1, q);
                    for (w0, w1, odd) in [(lo0, lo1, 0), (hi0, hi1, 1)] {
                        let (w0, w1) = (vreinterpretq_s32_s8(w0), vreinterpretq_s32_s8(w1));
                        let x = x_at(odd, l);
                        r01 = smmla(r01, vreinterpretq_s8_s32(vzip1q_s32(w0, w1)), x);
                        r23 = smmla(r23, vreinterpretq_s8_s32(vzip2q_s32(w0, w1)), x);
                    }
                }
                [vuzp1q_s32(r01, r23), vuzp2q_s32(r01, r23)]
            };
            quarter(b, pair, q, groups, isums, [&mut first[0], &mut second[0]]);
        }
    }
    if A % 2 == 1 {
        out[A - 1] = block_dots_sdot(b, std::array::from_ref(&xs[A - 1]))[0];
    }
    out
}
