//! The opt-in 8-bit-activation path of the CPU matvec (llama.cpp's approach on the same
//! problem): each 64-element chunk of the activation row is rounded once to i8 with its own
//! scale, and 4-bit weights are dotted with it in integers, 32 products per AVX2 instruction
//! (`maddubs`) instead of eight float multiply-adds. It changes the numbers (the activation
//! rounding), so it is a separate mode, judged by the KL gate (tests/q8_activations.rs).

use crate::affine::AffineMatrix;
use std::cell::Cell;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(false) };
}

/// Whether decode-shaped products on this thread use 8-bit activations.
pub fn enabled() -> bool {
    ENABLED.with(Cell::get)
}

/// Turns the mode on or off for the current thread until dropped (the model enters one per
/// forward call, so models loaded with and without it can share a process).
pub struct Scope(bool);

impl Scope {
    pub fn enter(on: bool) -> Self {
        Self(ENABLED.with(|c| c.replace(on)))
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        ENABLED.with(|c| c.set(self.0));
    }
}

/// Elements per i8 quantization chunk (and per 32-byte run of packed 4-bit weights).
pub const CHUNK: usize = 64;

/// One activation row rounded to i8 per 64-element chunk. Within a chunk the values are
/// stored even elements first, then odd ones: the order of the low and high nibbles of 32
/// consecutive packed bytes, so a chunk of weights needs no shuffling.
#[derive(Debug, Clone)]
pub struct Q8Row {
    /// `[chunks, 64]`: per chunk `x[2t]` for t < 32, then `x[2t + 1]`.
    values: Vec<i8>,
    /// Per 32 elements (two per chunk): `x ≈ scale · q`.
    scales: Vec<f32>,
}

impl Q8Row {
    /// `x.len()` must be a multiple of 64.
    pub fn quantize(x: &[f32]) -> Self {
        let chunks = x.len() / CHUNK;
        let mut values = vec![0i8; chunks * CHUNK];
        let mut scales = vec![0f32; 2 * chunks];
        for ((chunk, out), scale) in x
            .chunks_exact(CHUNK)
            .zip(values.chunks_exact_mut(CHUNK))
            .zip(scales.chunks_exact_mut(2))
        {
            let mut inv = [0f32; 2];
            for (half, (s, i)) in scale.iter_mut().zip(inv.iter_mut()).enumerate() {
                let part = &chunk[half * CHUNK / 2..(half + 1) * CHUNK / 2];
                let max = part.iter().fold(0f32, |m, v| m.max(v.abs()));
                *s = max / 127.0;
                *i = if max > 0.0 { 127.0 / max } else { 0.0 };
            }
            for t in 0..CHUNK / 2 {
                // Elements 2t and 2t+1 lie in the same half: t < 16 is the first.
                let i = inv[t / (CHUNK / 4)];
                out[t] = (chunk[2 * t] * i).round() as i8;
                out[CHUNK / 2 + t] = (chunk[2 * t + 1] * i).round() as i8;
            }
        }
        Self { values, scales }
    }
}

/// Whether a matrix takes the 8-bit-activation path: 4-bit, groups a multiple of 64.
pub fn supports(m: &AffineMatrix) -> bool {
    m.bits == 4 && m.group_size.is_multiple_of(CHUNK)
}

/// `Σ_j w[row, j] · x[j]` with `x` rounded per chunk: per group
/// `scale · Σ_chunks dx · Σ q·xq + bias · Σ x` (`group_sums` holds the exact `Σ x`).
pub fn row_dot(m: &AffineMatrix, row: usize, x: &Q8Row, group_sums: &[f32]) -> f32 {
    let (wpr, gpr) = (m.words_per_row(), m.groups_per_row());
    let words = &m.packed()[row * wpr..(row + 1) * wpr];
    let scales = &m.scales()[row * gpr..(row + 1) * gpr];
    let biases = &m.biases()[row * gpr..(row + 1) * gpr];
    let chunks_per_group = m.group_size / CHUNK;
    let mut total = 0f32;
    for g in 0..gpr {
        let mut qx = 0f32;
        for c in g * chunks_per_group..(g + 1) * chunks_per_group {
            // 64 nibbles are 8 words.
            let w = &words[c * 8..(c + 1) * 8];
            let xq = &x.values[c * CHUNK..(c + 1) * CHUNK];
            let (first, second) = chunk_dot(w, xq);
            qx += x.scales[2 * c] * first as f32 + x.scales[2 * c + 1] * second as f32;
        }
        total += scales[g] * qx + biases[g] * group_sums[g];
    }
    total
}

/// `Σ q_j · xq_j` over one chunk's two halves (elements 0..32 and 32..64): 8 packed words
/// against 64 reordered i8 activations.
#[inline]
fn chunk_dot(words: &[u32], xq: &[i8]) -> (i32, i32) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() >= crate::simd::Level::Avx2 {
        // SAFETY: AVX2 is present; both slices hold exactly one chunk.
        return unsafe { chunk_dot_avx2(words, xq) };
    }
    chunk_dot_portable(words, xq)
}

/// Byte `t` of the 32 packed bytes holds element `2t` in its low nibble and `2t + 1` in its
/// high nibble; `xq` holds the even elements, then the odd ones.
fn chunk_dot_portable(words: &[u32], xq: &[i8]) -> (i32, i32) {
    let mut acc = [0i32; 2];
    for (k, &w) in words.iter().enumerate() {
        for b in 0..4 {
            let byte = (w >> (8 * b)) & 0xFF;
            let t = 4 * k + b;
            acc[t / (CHUNK / 4)] +=
                (byte & 0xF) as i32 * xq[t] as i32 + (byte >> 4) as i32 * xq[CHUNK / 2 + t] as i32;
        }
    }
    (acc[0], acc[1])
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn chunk_dot_avx2(words: &[u32], xq: &[i8]) -> (i32, i32) {
    use std::arch::x86_64::*;
    debug_assert!(words.len() == 8 && xq.len() == CHUNK);
    let packed = _mm256_loadu_si256(words.as_ptr() as *const __m256i);
    let low_mask = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(packed, low_mask);
    let hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_mask);
    let x_even = _mm256_loadu_si256(xq.as_ptr() as *const __m256i);
    let x_odd = _mm256_loadu_si256(xq.as_ptr().add(CHUNK / 2) as *const __m256i);
    // u8 × i8 → pairs summed in i16: at most 2 · 15 · 127, no saturation.
    let sum16 = _mm256_add_epi16(
        _mm256_maddubs_epi16(lo, x_even),
        _mm256_maddubs_epi16(hi, x_odd),
    );
    let sum32 = _mm256_madd_epi16(sum16, _mm256_set1_epi16(1));
    // The low 128 bits hold bytes 0..16, i.e. elements 0..32; the high 128 bits the rest.
    let hsum = |v: __m128i| {
        let v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0b01_00_11_10));
        let v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0b10_11_00_01));
        _mm_cvtsi128_si32(v)
    };
    (
        hsum(_mm256_castsi256_si128(sum32)),
        hsum(_mm256_extracti128_si256(sum32, 1)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::affine::pack_row;

    #[test]
    fn simd_and_portable_chunk_dots_agree() {
        let q: Vec<u32> = (0..64u32).map(|j| (j * 7 + 3) % 16).collect();
        let words = pack_row(&q, 4);
        let x: Vec<f32> = (0..64)
            .map(|j| ((j * 37 % 23) as f32 - 11.0) / 3.0)
            .collect();
        let row = Q8Row::quantize(&x);
        let product = |j: usize| {
            let t = j / 2;
            let xq = if j.is_multiple_of(2) {
                row.values[t]
            } else {
                row.values[32 + t]
            };
            q[j] as i32 * xq as i32
        };
        let want = ((0..32).map(product).sum(), (32..64).map(product).sum());
        assert_eq!(chunk_dot_portable(&words, &row.values), want);
        assert_eq!(chunk_dot(&words, &row.values), want);
    }
}

#[cfg(test)]
mod row_tests {
    use super::*;
    use crate::affine::{pack_row, AffineMatrix};

    /// The 8-bit-activation dot is the exact dot up to the activation rounding: within
    /// 1% of Σ|w·x| on random rows at every supported group size.
    #[test]
    fn row_dot_tracks_the_exact_dot() {
        for group in [64, 128] {
            let cols = 256;
            let q: Vec<u32> = (0..cols as u32).map(|j| (j * 11 + 5) % 16).collect();
            let groups = cols / group;
            let scales: Vec<f32> = (0..groups).map(|g| 0.02 + 0.01 * g as f32).collect();
            let biases: Vec<f32> = (0..groups).map(|g| -0.1 + 0.03 * g as f32).collect();
            let m =
                AffineMatrix::new(4, group, [1, 1, cols], pack_row(&q, 4), scales, biases).unwrap();
            let x: Vec<f32> = (0..cols)
                .map(|j| ((j * 29 % 41) as f32 - 20.0) / 7.0)
                .collect();
            let sums: Vec<f32> = x.chunks(group).map(|c| c.iter().sum()).collect();
            let mut w = vec![0f32; cols];
            m.dequantize_row(0, &mut w);
            let exact: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
            let scale: f32 = w.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            let got = row_dot(&m, 0, &Q8Row::quantize(&x), &sums);
            assert!(
                (got - exact).abs() <= 0.01 * scale,
                "group {group}: {got} vs {exact} (Σ|wx| {scale})"
            );
        }
    }
}
