//! The interleaved q8 kernel ([`q8_interleaved`](super::q8_interleaved)) in 256-bit registers:
//! for AVX2 (`vpmaddubsw` + `vpmaddwd` for the u8 × i8 dots) and for AVX2 with AVX-VNNI (VEX
//! `vpdpbusd`). A block's sixteen rows are two halves of eight rows, one 32-bit lane each;
//! each half runs the whole block with its own accumulators (three per activation row: the
//! two chunk halves' and the bias sum), so four activation rows fit the sixteen registers.
//!
//! The integer sums are the exact ones of every copy (nothing saturates, see [`dot4_avx2`]),
//! and the float steps are the portable kernel's, in its order: the results are bit for bit
//! the portable kernel's.

use super::q8_interleaved_block::{Block, Param, ROWS, WORDS_PER_CHUNK};
use super::q8_kernel::{Activation, CHUNK};
use std::arch::x86_64::*;

/// Adds the four-byte dots `lo · even + hi · odd` (u8 × i8) of one packed word per row to
/// `acc`, in AVX2: i16 lanes, two products each per `maddubs`. A half-chunk adds 16 products
/// of at most 15 · 127 to each i16 lane (30480 < 32767) and no pair exceeds 2 · 15 · 127, so
/// neither the saturating pair sums nor the wrapping adds ever clip: [`finish_avx2`] widens
/// the exact sums.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot4_avx2(
    acc: __m256i,
    lo: __m256i,
    hi: __m256i,
    even: __m256i,
    odd: __m256i,
) -> __m256i {
    let pairs = _mm256_add_epi16(
        _mm256_maddubs_epi16(lo, even),
        _mm256_maddubs_epi16(hi, odd),
    );
    _mm256_add_epi16(acc, pairs)
}

/// The i32 sum per row of [`dot4_avx2`]'s i16 lanes (two lanes per row).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn finish_avx2(acc: __m256i) -> __m256i {
    _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
}

/// [`dot4_avx2`] with AVX-VNNI: two `vpdpbusd`, accumulating in i32 lanes.
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
unsafe fn dot4_avxvnni(
    acc: __m256i,
    lo: __m256i,
    hi: __m256i,
    even: __m256i,
    odd: __m256i,
) -> __m256i {
    _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, lo, even), hi, odd)
}

/// The sums are i32 already.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn finish_avxvnni(acc: __m256i) -> __m256i {
    acc
}

/// Eight scales or biases (rows `at .. at + 8` of a group), widened to f32.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load8<P: Param>(p: &[P], at: usize) -> __m256 {
    debug_assert!(at + 8 <= p.len());
    let ptr = p.as_ptr().add(at);
    if P::IS_BF16 {
        // A bf16 is the top half of an f32.
        let half = _mm_loadu_si128(ptr as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16))
    } else {
        _mm256_loadu_ps(ptr as *const f32)
    }
}

/// Defines one copy of the kernel: `$dot4` adds a packed word's dots, `$finish` turns the
/// half-chunk's accumulator into i32 sums per row.
macro_rules! block_dots_256 {
    ($(#[$meta:meta])* $name:ident, $features:literal, $dot4:ident, $finish:ident) => {
        $(#[$meta])*
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name<P: Param, const A: usize>(
            b: &Block<P>,
            xs: &[Activation; A],
        ) -> [[f32; ROWS]; A] {
            let groups = b.checked_groups(xs);
            let low_mask = _mm256_set1_epi8(0x0F);
            let mut out = [[0f32; ROWS]; A];
            for rows8 in [0, 8] {
                let mut acc = [[_mm256_setzero_ps(); A]; 2];
                let mut bacc = [_mm256_setzero_ps(); A];
                for g in 0..groups {
                    let (ws, bs) = (load8(b.scales, g * ROWS + rows8), load8(b.biases, g * ROWS + rows8));
                    for a in 0..A {
                        let sum = _mm256_set1_ps(*xs[a].group_sums.get_unchecked(g));
                        bacc[a] = _mm256_fmadd_ps(bs, sum, bacc[a]);
                    }
                    for c in g * b.chunks_per_group..(g + 1) * b.chunks_per_group {
                        // SAFETY (every read below): c < chunks, and the asserts bound the slices.
                        let at = b.words.as_ptr().add(c * WORDS_PER_CHUNK * ROWS + rows8);
                        for (h, acc_h) in acc.iter_mut().enumerate() {
                            let mut isum = [_mm256_setzero_si256(); A];
                            for l in 4 * h..4 * h + 4 {
                                let packed = _mm256_loadu_si256(at.add(l * ROWS) as *const __m256i);
                                let lo = _mm256_and_si256(packed, low_mask);
                                let hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_mask);
                                for a in 0..A {
                                    // Four even elements (for the low nibbles) and four odd
                                    // ones, as one broadcast word each.
                                    let xq = xs[a].q.values().as_ptr().add(c * CHUNK) as *const i32;
                                    let even = _mm256_set1_epi32(xq.add(l).read_unaligned());
                                    let odd = _mm256_set1_epi32(xq.add(CHUNK / 8 + l).read_unaligned());
                                    isum[a] = $dot4(isum[a], lo, hi, even, odd);
                                }
                            }
                            for a in 0..A {
                                let x_scale = *xs[a].q.lane_scales().get_unchecked(8 * c + 4 * h);
                                let dx = _mm256_mul_ps(_mm256_set1_ps(x_scale), ws);
                                let sum = _mm256_cvtepi32_ps($finish(isum[a]));
                                acc_h[a] = _mm256_fmadd_ps(sum, dx, acc_h[a]);
                            }
                        }
                    }
                }
                for a in 0..A {
                    let v = _mm256_add_ps(_mm256_add_ps(acc[0][a], acc[1][a]), bacc[a]);
                    _mm256_storeu_ps(out[a].as_mut_ptr().add(rows8), v);
                }
            }
            out
        }
    };
}

block_dots_256!(
    /// The kernel in AVX2 and FMA.
    block_dots_avx2,
    "avx2,fma",
    dot4_avx2,
    finish_avx2
);
block_dots_256!(
    /// The kernel with AVX-VNNI's `vpdpbusd`.
    block_dots_avxvnni,
    "avx2,fma,avxvnni",
    dot4_avxvnni,
    finish_avxvnni
);

/// [`dot4_avxvnni`]'s twin in the EVEX encoding (AVX-512 VL with VNNI): the same `vpdpbusd` on
/// 256-bit registers, for the tests on CPUs without AVX-VNNI (AMD before Zen 5, Intel servers
/// before Sapphire Rapids), so that the kernel's VNNI form is checked where only its encoding
/// differs.
#[cfg(test)]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn dot4_evex(
    acc: __m256i,
    lo: __m256i,
    hi: __m256i,
    even: __m256i,
    odd: __m256i,
) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc, lo, even), hi, odd)
}

#[cfg(test)]
block_dots_256!(
    /// The AVX-VNNI copy's arithmetic in the EVEX encoding (tests only).
    block_dots_evex_vnni,
    "avx2,fma,avx512f,avx512vl,avx512vnni",
    dot4_evex,
    finish_avxvnni
);
