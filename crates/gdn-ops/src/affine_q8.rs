//! The opt-in 8-bit-activation path of the CPU matvec (llama.cpp's approach on the same
//! problem): each 64-element chunk of the activation row is rounded once to i8 with its own
//! scale, and 4-bit weights are dotted with it in integers, 32 products per AVX2 instruction
//! (`maddubs`) instead of eight float multiply-adds. It changes the numbers (the activation
//! rounding), so it is a separate mode, judged by the KL gate (tests/q8_activations.rs).

use crate::affine::{AffineMatrix, GroupParams};
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
    /// `[chunks, 8]`: per chunk the scale of elements 0..32 four times, then that of
    /// 32..64 four times (`x ≈ scale · q`), the layout of the eight i32 partial sums the
    /// SIMD dot leaves per chunk, so it scales them with one multiply.
    lane_scales: Vec<f32>,
}

impl Q8Row {
    /// `x.len()` must be a multiple of 64.
    pub fn quantize(x: &[f32]) -> Self {
        let chunks = x.len() / CHUNK;
        let mut values = vec![0i8; chunks * CHUNK];
        let mut lane_scales = vec![0f32; 8 * chunks];
        for ((chunk, out), lanes) in x
            .chunks_exact(CHUNK)
            .zip(values.chunks_exact_mut(CHUNK))
            .zip(lane_scales.chunks_exact_mut(8))
        {
            let mut inv = [0f32; 2];
            for (half, i) in inv.iter_mut().enumerate() {
                let part = &chunk[half * CHUNK / 2..(half + 1) * CHUNK / 2];
                let max = part.iter().fold(0f32, |m, v| m.max(v.abs()));
                lanes[4 * half..4 * half + 4].fill(max / 127.0);
                *i = if max > 0.0 { 127.0 / max } else { 0.0 };
            }
            for t in 0..CHUNK / 2 {
                // Elements 2t and 2t+1 lie in the same half: t < 16 is the first.
                let i = inv[t / (CHUNK / 4)];
                out[t] = (chunk[2 * t] * i).round() as i8;
                out[CHUNK / 2 + t] = (chunk[2 * t + 1] * i).round() as i8;
            }
        }
        Self {
            values,
            lane_scales,
        }
    }
}

/// Whether a matrix takes the 8-bit-activation path: 4-bit, groups of 64 or a larger power
/// of two.
pub fn supports(m: &AffineMatrix) -> bool {
    m.bits == 4 && m.group_size.is_multiple_of(CHUNK) && m.group_size.is_power_of_two()
}

/// `Σ_j w[row, j] · x[j]` with `x` rounded per chunk: per group
/// `scale · Σ_chunks dx · Σ q·xq + bias · Σ x` (`group_sums` holds the exact `Σ x`).
pub fn row_dot(m: &AffineMatrix, row: usize, x: &Q8Row, group_sums: &[f32]) -> f32 {
    let mut out = [0f32];
    rows_dot(m, row, x, group_sums, &mut out);
    out[0]
}

/// [`row_dot`] for the consecutive rows `first .. first + out.len()`, `ROWS_AT_ONCE` per
/// kernel call.
pub fn rows_dot(m: &AffineMatrix, first: usize, x: &Q8Row, group_sums: &[f32], out: &mut [f32]) {
    // Scales and biases stay in their stored dtype: the kernel widens them as it goes.
    match (m.scales(), m.biases()) {
        (GroupParams::Bf16(s), GroupParams::Bf16(b)) => {
            rows_dot_in(m, s, b, first, x, group_sums, out)
        }
        (GroupParams::F16(s), GroupParams::F16(b)) => {
            rows_dot_in(m, s, b, first, x, group_sums, out)
        }
        (scales, biases) => {
            let (s, b) = (scales.to_f32_vec(), biases.to_f32_vec());
            rows_dot_in(m, &s, &b, first, x, group_sums, out)
        }
    }
}

/// Rows per kernel call. Measured on Zen 3 (AVX2, two cores, bench checkpoint decode):
/// one row 22–27 tok/s, two rows 16, four rows 18: more rows share each chunk's activation
/// loads but run more weight streams at once, and here the streams cost more. The kernel
/// stays generic over the count so that other CPUs can be measured.
const ROWS_AT_ONCE: usize = 1;

fn rows_dot_in<P: Widen>(
    m: &AffineMatrix,
    scales: &[P],
    biases: &[P],
    first: usize,
    x: &Q8Row,
    group_sums: &[f32],
    out: &mut [f32],
) {
    let (wpr, gpr) = (m.words_per_row(), m.groups_per_row());
    let parts = |row: usize| RowParts {
        words: &m.packed()[row * wpr..(row + 1) * wpr],
        scales: &scales[row * gpr..(row + 1) * gpr],
        biases: &biases[row * gpr..(row + 1) * gpr],
        group_sums,
        chunks_per_group: m.group_size / CHUNK,
    };
    let mut blocks = out.chunks_exact_mut(ROWS_AT_ONCE);
    let mut row = first;
    for block in &mut blocks {
        let parts = std::array::from_fn::<_, ROWS_AT_ONCE, _>(|i| parts(row + i));
        block.copy_from_slice(&dispatch(&parts, x));
        row += ROWS_AT_ONCE;
    }
    for o in blocks.into_remainder() {
        *o = dispatch(&[parts(row)], x)[0];
        row += 1;
    }
}

/// The AVX2 rows where the CPU has them, else the portable ones.
fn dispatch<P: Widen, const R: usize>(rows: &[RowParts<P>; R], x: &Q8Row) -> [f32; R] {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() >= crate::simd::Level::Avx2 {
        // SAFETY: AVX2 and FMA are present (the level says so).
        return unsafe { rows_dot_avx2(rows, x) };
    }
    std::array::from_fn(|r| row_dot_portable(&rows[r], x))
}

/// A stored scale or bias type, widened to f32 (exactly) one value at a time.
pub trait Widen: Copy {
    fn widen(self) -> f32;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Widen for half::bf16 {
    /// A bf16 is the top half of an f32: a shift, which vectorises.
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

impl Widen for half::f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// One packed 4-bit row, its per-group weight scales and biases, and the exact per-group
/// sums of the activation row.
struct RowParts<'a, P> {
    words: &'a [u32],
    scales: &'a [P],
    biases: &'a [P],
    group_sums: &'a [f32],
    chunks_per_group: usize,
}

/// The AVX2 kernel's arithmetic in scalar code, operation for operation: eight lanes (lane
/// `l` of a chunk holds packed bytes `4l .. 4l + 4`, so lanes 0..4 cover elements 0..32 and
/// lanes 4..8 elements 32..64), the bias terms in eight lanes first, one fused multiply-add
/// per lane and chunk, the same horizontal sum. The result is bit for bit the SIMD one: the
/// mode rounds activations, so a last-bit difference in one product can move a rounding in
/// the next layer, and copies that summed in different orders would disagree visibly.
fn row_dot_portable<P: Widen>(row: &RowParts<P>, x: &Q8Row) -> f32 {
    let group_shift = row.chunks_per_group.trailing_zeros();
    let mut acc = [0f32; 8];
    for (b, s) in row.biases.chunks(8).zip(row.group_sums.chunks(8)) {
        for l in 0..b.len() {
            acc[l] += b[l].widen() * s[l];
        }
    }
    for (c, (words, xq)) in row
        .words
        .chunks_exact(8)
        .zip(x.values.chunks_exact(CHUNK))
        .enumerate()
    {
        let scale = row.scales[c >> group_shift].widen();
        for (l, &word) in words.iter().enumerate() {
            // Byte t holds element 2t in its low nibble and 2t + 1 in its high one; xq holds
            // a chunk's even elements, then its odd ones.
            let mut sum = 0i32;
            for k in 0..4 {
                let (byte, t) = ((word >> (8 * k)) & 0xFF, 4 * l + k);
                sum += (byte & 0xF) as i32 * xq[t] as i32
                    + (byte >> 4) as i32 * xq[CHUNK / 2 + t] as i32;
            }
            let dx = x.lane_scales[8 * c + l] * scale;
            acc[l] = (sum as f32).mul_add(dx, acc[l]);
        }
    }
    let v: [f32; 4] = std::array::from_fn(|l| acc[l] + acc[l + 4]);
    (v[0] + v[2]) + (v[1] + v[3])
}

/// `R` whole rows in AVX2: per chunk 32 packed bytes against 64 i8 activations in two
/// `maddubs` (u8 × i8 pairs summed in i16: at most 2 · 15 · 127, no saturation), widened to
/// eight i32 partial sums, converted and scaled into one f32 accumulator per row: one
/// horizontal sum per row, none per chunk. The rows share each chunk's activation loads.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_dot_avx2<P: Widen, const R: usize>(rows: &[RowParts<P>; R], x: &Q8Row) -> [f32; R] {
    use std::arch::x86_64::*;
    let groups = rows[0].scales.len();
    let chunks_per_group = rows[0].chunks_per_group;
    let chunks = groups * chunks_per_group;
    assert!(x.values.len() == CHUNK * chunks && x.lane_scales.len() == 8 * chunks);
    for row in rows {
        assert!(row.words.len() == 8 * chunks && row.scales.len() == groups);
        assert!(row.biases.len() == groups && row.group_sums.len() == groups);
        assert!(row.chunks_per_group == chunks_per_group);
    }
    // Group sizes are powers of two (64 or 128 here), so a chunk's group is a shift away.
    assert!(chunks_per_group.is_power_of_two());
    let group_shift = chunks_per_group.trailing_zeros();
    let xq = x.values.as_ptr() as *const __m256i;
    let low_mask = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    // One accumulator per row, started with the row's bias terms summed in eight lanes (a
    // scalar sum would serialise on the add latency). With four rows, four independent FMA
    // chains hide each other's latency.
    let mut bias_lanes = [[0f32; 8]; R];
    for (row, lanes) in rows.iter().zip(bias_lanes.iter_mut()) {
        for (b, s) in row.biases.chunks(8).zip(row.group_sums.chunks(8)) {
            for l in 0..b.len() {
                lanes[l] += b[l].widen() * s[l];
            }
        }
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for r in 0..R {
        acc[r] = _mm256_loadu_ps(bias_lanes[r].as_ptr());
    }
    for c in 0..chunks {
        // SAFETY: c < chunks, and the asserts above bound every read.
        let x_even = _mm256_loadu_si256(xq.add(2 * c));
        let x_odd = _mm256_loadu_si256(xq.add(2 * c + 1));
        let x_scales = _mm256_loadu_ps(x.lane_scales.as_ptr().add(8 * c));
        for r in 0..R {
            let packed = _mm256_loadu_si256((rows[r].words.as_ptr() as *const __m256i).add(c));
            let lo = _mm256_and_si256(packed, low_mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_mask);
            let sum16 = _mm256_add_epi16(
                _mm256_maddubs_epi16(lo, x_even),
                _mm256_maddubs_epi16(hi, x_odd),
            );
            // Lanes 0..4 sum elements 0..32 of the chunk, lanes 4..8 elements 32..64.
            let sum32 = _mm256_cvtepi32_ps(_mm256_madd_epi16(sum16, ones));
            let scale = rows[r].scales.get_unchecked(c >> group_shift).widen();
            let dx = _mm256_mul_ps(x_scales, _mm256_set1_ps(scale));
            acc[r] = _mm256_fmadd_ps(sum32, dx, acc[r]);
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let v = acc[r];
        let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        let v = _mm_add_ss(v, _mm_movehdup_ps(v));
        out[r] = _mm_cvtss_f32(v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::affine::pack_row;

    /// The portable row is `Σ_j (scale·q_j + bias) · x̂_j` with `x̂` the rounded activations
    /// (`dx · xq`), except that the bias multiplies the exact group sums: checked in f64
    /// against that definition written element by element.
    #[test]
    fn portable_row_is_the_rounded_dot() {
        let cols = 256;
        let q: Vec<u32> = (0..cols as u32).map(|j| (j * 7 + 3) % 16).collect();
        let words = pack_row(&q, 4);
        let x: Vec<f32> = (0..cols)
            .map(|j| ((j * 37 % 23) as f32 - 11.0) / 3.0)
            .collect();
        let xq = Q8Row::quantize(&x);
        let (scales, biases) = (vec![0.3f32, -0.2, 0.7, 0.1], vec![-0.4f32, 0.25, 0.0, 1.5]);
        let sums: Vec<f32> = x.chunks(64).map(|c| c.iter().sum()).collect();
        let rounded = |j: usize| {
            let (c, i) = (j / CHUNK, j % CHUNK);
            let stored = if i % 2 == 0 { i / 2 } else { CHUNK / 2 + i / 2 };
            let dx = xq.lane_scales[8 * c + 4 * (i / 32)];
            dx as f64 * xq.values[c * CHUNK + stored] as f64
        };
        let want: f64 = (0..cols)
            .map(|j| scales[j / 64] as f64 * q[j] as f64 * rounded(j))
            .sum::<f64>()
            + (0..4)
                .map(|g| biases[g] as f64 * sums[g] as f64)
                .sum::<f64>();
        let parts = RowParts {
            words: &words,
            scales: &scales,
            biases: &biases,
            group_sums: &sums,
            chunks_per_group: 1,
        };
        let got = row_dot_portable(&parts, &xq) as f64;
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }

    /// Runs one row through both copies and compares the bits.
    #[cfg(target_arch = "x86_64")]
    fn assert_same_bits<P: Widen>(
        words: &[u32],
        scales: &[P],
        biases: &[P],
        group_sums: &[f32],
        chunks_per_group: usize,
        xq: &Q8Row,
        what: &str,
    ) {
        let row = RowParts {
            words,
            scales,
            biases,
            group_sums,
            chunks_per_group,
        };
        let want = row_dot_portable(&row, xq);
        // SAFETY: the caller checked that AVX2 is present.
        let got = unsafe { rows_dot_avx2(&[row], xq) }[0];
        assert_eq!(got.to_bits(), want.to_bits(), "{what}: {got} vs {want}");
    }

    /// The AVX2 row and the portable one agree bit for bit, for one and several chunks per
    /// group, with f32 and bf16 scales.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_and_portable_rows_agree() {
        if crate::simd::level() < crate::simd::Level::Avx2 {
            eprintln!("no AVX2 here: only the portable row runs");
            return;
        }
        let cols = 640; // 10 or 5 groups: the eight-group bias step and its tail
        let q: Vec<u32> = (0..cols as u32).map(|j| (j * 13 + 7) % 16).collect();
        let words = pack_row(&q, 4);
        let x: Vec<f32> = (0..cols)
            .map(|j| ((j * 31 % 53) as f32 - 26.0) / 9.0)
            .collect();
        let xq = Q8Row::quantize(&x);
        for group in [64, 128] {
            let scales: Vec<f32> = (0..cols / group).map(|g| 0.5 - 0.13 * g as f32).collect();
            let biases: Vec<f32> = (0..cols / group).map(|g| 0.07 * g as f32 - 0.2).collect();
            let group_sums: Vec<f32> = x.chunks(group).map(|c| c.iter().sum()).collect();
            let cpg = group / CHUNK;
            let what = format!("f32, group {group}");
            assert_same_bits(&words, &scales, &biases, &group_sums, cpg, &xq, &what);
            let bf16 = |v: &[f32]| -> Vec<half::bf16> {
                v.iter().map(|&f| half::bf16::from_f32(f)).collect()
            };
            let (s16, b16) = (bf16(&scales), bf16(&biases));
            let what = format!("bf16, group {group}");
            assert_same_bits(&words, &s16, &b16, &group_sums, cpg, &xq, &what);
        }
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
