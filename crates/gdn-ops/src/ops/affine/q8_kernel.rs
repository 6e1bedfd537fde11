//! The opt-in 8-bit-activation path of the CPU matvec (llama.cpp's approach on the same
//! problem): each 64-element chunk of the activation row is rounded once to i8 with its own
//! scale, and 4-bit weights are dotted with it in integers, 32 products per AVX2 instruction
//! (`maddubs`) instead of eight float multiply-adds. It changes the numbers (the activation
//! rounding), so it is a separate mode, judged by the KL gate (tests/q8_activations.rs).

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
        quantize_chunks(x, &mut values, &mut lane_scales);
        Self {
            values,
            lane_scales,
        }
    }

    /// `[chunks, 64]`: per chunk the even elements, then the odd ones.
    pub(crate) fn values(&self) -> &[i8] {
        &self.values
    }

    /// `[chunks, 8]`: per chunk the first half's scale four times, then the second's.
    pub(crate) fn lane_scales(&self) -> &[f32] {
        &self.lane_scales
    }
}

crate::multiversion! {
    /// Rounds each 64-value chunk of `x` into `values` (even elements, then odd ones) and
    /// writes its two half-chunk scales into `lane_scales`. Ties round to even, which SIMD
    /// rounds in one instruction (`roundps`); the copies agree exactly.
    fn quantize_chunks(x: &[f32], values: &mut [i8], lane_scales: &mut [f32]) -> () {
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
                out[t] = (chunk[2 * t] * i).round_ties_even() as i8;
                out[CHUNK / 2 + t] = (chunk[2 * t + 1] * i).round_ties_even() as i8;
            }
        }
    }
}

/// Whether a matrix format takes the 8-bit-activation path: 4-bit, groups of 64 or a larger
/// power of two.
pub fn supports_format(bits: usize, group_size: usize) -> bool {
    bits == 4 && group_size.is_multiple_of(CHUNK) && group_size.is_power_of_two()
}

/// A plain-layout 4-bit matrix as the kernel reads it: `words` `[rows, words_per_row]`,
/// `scales` and `biases` `[rows, groups_per_row]` in their stored type.
pub struct PlainRows<'a, P> {
    pub words: &'a [u32],
    pub scales: &'a [P],
    pub biases: &'a [P],
    pub words_per_row: usize,
    pub groups_per_row: usize,
    pub group_size: usize,
}

/// Activation rows per kernel call. Each chunk of a weight row is unpacked once for all of
/// them, and they stay in L1 while the task's weight rows stream past. Measured on Zen 3
/// (one core, 512 × 2048 weights, 512 activation rows): 2 rows 33 GMAC/s, 4 rows 44–48,
/// 8 rows 53 (more accumulators than registers beyond that).
const ACTIVATIONS_AT_ONCE: usize = 4;

/// The plain layout's products: weight rows `first ..` of `m` (as many as `out` holds) with
/// every activation row of `xs`, into `out` as `[rows, xs.len()]`; `group_sums` is
/// `[xs.len(), groups]`.
pub fn rows_dot_plain<P: Widen>(
    m: &PlainRows<P>,
    first: usize,
    xs: &[Q8Row],
    group_sums: &[f32],
    out: &mut [f32],
) {
    let (wpr, gpr, n) = (m.words_per_row, m.groups_per_row, xs.len());
    let weights = |row: usize| WeightRow {
        words: &m.words[row * wpr..(row + 1) * wpr],
        scales: &m.scales[row * gpr..(row + 1) * gpr],
        biases: &m.biases[row * gpr..(row + 1) * gpr],
        chunks_per_group: m.group_size / CHUNK,
    };
    let activation = |j: usize| Activation {
        q: &xs[j],
        group_sums: &group_sums[j * gpr..(j + 1) * gpr],
    };
    let rows = out.len() / n.max(1);
    let mut j = 0;
    while j + ACTIVATIONS_AT_ONCE <= n {
        let block: [_; ACTIVATIONS_AT_ONCE] = std::array::from_fn(|a| activation(j + a));
        for r in 0..rows {
            let dots = dispatch(&weights(first + r), &block);
            out[r * n + j..r * n + j + ACTIVATIONS_AT_ONCE].copy_from_slice(&dots);
        }
        j += ACTIVATIONS_AT_ONCE;
    }
    for j in j..n {
        let one = [activation(j)];
        for r in 0..rows {
            out[r * n + j] = dispatch(&weights(first + r), &one)[0];
        }
    }
}

/// The selected level's copy ([`crate::simd::level`]): AVX-512 VNNI, AVX-VNNI, AVX2, else
/// the portable one (aarch64 runs the interleaved layout's kernels instead).
fn dispatch<P: Widen, const A: usize>(w: &WeightRow<P>, xs: &[Activation; A]) -> [f32; A] {
    #[cfg(target_arch = "x86_64")]
    use crate::simd::Level;
    match crate::simd::level() {
        // SAFETY (each arm): the selected level is supported by the CPU, and its features
        // include the copy's.
        #[cfg(target_arch = "x86_64")]
        Level::Avx512Vnni => unsafe { row_dots_vnni(w, xs) },
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Vnni => unsafe { row_dots_avxvnni(w, xs) },
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => unsafe { row_dots_avx2(w, xs) },
        _ => std::array::from_fn(|a| row_dot_portable(w, &xs[a])),
    }
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

/// One packed 4-bit row with its per-group weight scales and biases.
struct WeightRow<'a, P> {
    words: &'a [u32],
    scales: &'a [P],
    biases: &'a [P],
    chunks_per_group: usize,
}

/// One rounded activation row and its exact per-group sums.
pub(crate) struct Activation<'a> {
    pub(crate) q: &'a Q8Row,
    pub(crate) group_sums: &'a [f32],
}

/// The AVX2 kernel's arithmetic in scalar code, operation for operation: eight lanes (lane
/// `l` of a chunk holds packed bytes `4l .. 4l + 4`, so lanes 0..4 cover elements 0..32 and
/// lanes 4..8 elements 32..64), the bias terms `bias_g · Σx_g` first (lane `l` takes groups
/// `l, l + 8, …`, multiplied then added), one fused multiply-add per lane and chunk, the
/// same horizontal sum. The result is bit for bit the SIMD one: the mode rounds
/// activations, so a last-bit difference in one product can move a rounding in the next
/// layer, and copies that summed in different orders would disagree visibly.
fn row_dot_portable<P: Widen>(w: &WeightRow<P>, x: &Activation) -> f32 {
    let group_shift = w.chunks_per_group.trailing_zeros();
    let mut acc = [0f32; 8];
    for (b, s) in w.biases.chunks(8).zip(x.group_sums.chunks(8)) {
        for l in 0..b.len() {
            acc[l] += b[l].widen() * s[l];
        }
    }
    for (c, (words, xq)) in w
        .words
        .chunks_exact(8)
        .zip(x.q.values.chunks_exact(CHUNK))
        .enumerate()
    {
        let scale = w.scales[c >> group_shift].widen();
        for (l, &word) in words.iter().enumerate() {
            // Byte t holds element 2t in its low nibble and 2t + 1 in its high one; xq holds
            // a chunk's even elements, then its odd ones.
            let mut sum = 0i32;
            for k in 0..4 {
                let (byte, t) = ((word >> (8 * k)) & 0xFF, 4 * l + k);
                sum += (byte & 0xF) as i32 * xq[t] as i32
                    + (byte >> 4) as i32 * xq[CHUNK / 2 + t] as i32;
            }
            let dx = x.q.lane_scales[8 * c + l] * scale;
            acc[l] = (sum as f32).mul_add(dx, acc[l]);
        }
    }
    let v: [f32; 4] = std::array::from_fn(|l| acc[l] + acc[l + 4]);
    (v[0] + v[2]) + (v[1] + v[3])
}

/// One weight row against `A` activation rows in AVX2: per chunk, 32 packed bytes are
/// unpacked once, then dotted with each row's 64 i8 values in two `maddubs` (u8 × i8 pairs
/// summed in i16: at most 2 · 15 · 127, no saturation), widened to eight i32 partial sums,
/// converted and scaled into that row's f32 accumulator: one horizontal sum per pair, none
/// per chunk, and `A` independent FMA chains that hide each other's latency.
///
/// The kernel is written once and compiled three times (`row_dots_kernel!`): for AVX2, and
/// for AVX-VNNI and AVX-512 VNNI, where one `vpdpbusd` does the u8 × i8 products and their four-way i32 sums
/// (the same integers: nothing saturates in either form, so the results are bit-identical).
macro_rules! row_dots_kernel {
    ($name:ident, $features:literal, $chunk_dot:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<P: Widen, const A: usize>(
            w: &WeightRow<P>,
            xs: &[Activation; A],
        ) -> [f32; A] {
            use std::arch::x86_64::*;
            let groups = w.scales.len();
            let chunks_per_group = w.chunks_per_group;
            let chunks = groups * chunks_per_group;
            assert!(w.words.len() == 8 * chunks && w.biases.len() == groups);
            for x in xs {
                assert!(x.q.values.len() == CHUNK * chunks && x.q.lane_scales.len() == 8 * chunks);
                assert!(x.group_sums.len() == groups);
            }
            // Group sizes are powers of two (64 or 128 here), so a chunk's group is a shift away.
            assert!(chunks_per_group.is_power_of_two());
            let group_shift = chunks_per_group.trailing_zeros();
            let low_mask = _mm256_set1_epi8(0x0F);
            let packed_at = w.words.as_ptr() as *const __m256i;
            // The bias terms first, as the portable copy sums them: eight groups per step, a
            // multiply then an add (not fused), the tail lane by lane.
            let mut acc = [_mm256_setzero_ps(); A];
            let whole = groups / 8 * 8;
            for g in (0..whole).step_by(8) {
                let b: [f32; 8] = std::array::from_fn(|l| w.biases[g + l].widen());
                let b = _mm256_loadu_ps(b.as_ptr());
                for a in 0..A {
                    let sums = _mm256_loadu_ps(xs[a].group_sums.as_ptr().add(g));
                    acc[a] = _mm256_add_ps(acc[a], _mm256_mul_ps(b, sums));
                }
            }
            if whole < groups {
                for a in 0..A {
                    let mut lanes = [0f32; 8];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[a]);
                    for g in whole..groups {
                        lanes[g - whole] += w.biases[g].widen() * xs[a].group_sums[g];
                    }
                    acc[a] = _mm256_loadu_ps(lanes.as_ptr());
                }
            }
            for c in 0..chunks {
                // SAFETY: c < chunks, and the asserts above bound every read.
                let packed = _mm256_loadu_si256(packed_at.add(c));
                let lo = _mm256_and_si256(packed, low_mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_mask);
                let scale = _mm256_set1_ps(w.scales.get_unchecked(c >> group_shift).widen());
                for a in 0..A {
                    let xq = xs[a].q.values.as_ptr() as *const __m256i;
                    let x_even = _mm256_loadu_si256(xq.add(2 * c));
                    let x_odd = _mm256_loadu_si256(xq.add(2 * c + 1));
                    let x_scales = _mm256_loadu_ps(xs[a].q.lane_scales.as_ptr().add(8 * c));
                    // Lanes 0..4 sum elements 0..32 of the chunk, lanes 4..8 elements 32..64.
                    let sum32 = _mm256_cvtepi32_ps($chunk_dot(lo, hi, x_even, x_odd));
                    let dx = _mm256_mul_ps(x_scales, scale);
                    acc[a] = _mm256_fmadd_ps(sum32, dx, acc[a]);
                }
            }
            let mut out = [0f32; A];
            for a in 0..A {
                let v = acc[a];
                let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
                let v = _mm_add_ss(v, _mm_movehdup_ps(v));
                out[a] = _mm_cvtss_f32(v);
            }
            out
        }
    };
}

/// Four-byte sums of `lo · x_even + hi · x_odd` (u8 × i8) in i32 lanes, in AVX2: pairs summed
/// in i16 by `maddubs` (at most 2 · 2 · 15 · 127: no saturation), then widened by `madd`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn chunk_dot_avx2(
    lo: std::arch::x86_64::__m256i,
    hi: std::arch::x86_64::__m256i,
    x_even: std::arch::x86_64::__m256i,
    x_odd: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let sum16 = _mm256_add_epi16(
        _mm256_maddubs_epi16(lo, x_even),
        _mm256_maddubs_epi16(hi, x_odd),
    );
    _mm256_madd_epi16(sum16, _mm256_set1_epi16(1))
}

/// The same sums with AVX-512 VNNI (256-bit form): two `vpdpbusd`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn chunk_dot_vnni(
    lo: std::arch::x86_64::__m256i,
    hi: std::arch::x86_64::__m256i,
    x_even: std::arch::x86_64::__m256i,
    x_odd: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let even = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, x_even);
    _mm256_dpbusd_epi32(even, hi, x_odd)
}

/// The same sums with AVX-VNNI (VEX `vpdpbusd`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
unsafe fn chunk_dot_avxvnni(
    lo: std::arch::x86_64::__m256i,
    hi: std::arch::x86_64::__m256i,
    x_even: std::arch::x86_64::__m256i,
    x_odd: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let even = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, x_even);
    _mm256_dpbusd_avx_epi32(even, hi, x_odd)
}

row_dots_kernel!(row_dots_avx2, "avx2,fma", chunk_dot_avx2);
row_dots_kernel!(row_dots_avxvnni, "avx2,fma,avxvnni", chunk_dot_avxvnni);
row_dots_kernel!(
    row_dots_vnni,
    "avx2,fma,avx512f,avx512vl,avx512vnni",
    chunk_dot_vnni
);

#[cfg(test)]
mod tests {
    use super::super::packing::pack_row;
    use super::*;

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
        let w = WeightRow {
            words: &words,
            scales: &scales,
            biases: &biases,
            chunks_per_group: 1,
        };
        let x = Activation {
            q: &xq,
            group_sums: &sums,
        };
        let got = row_dot_portable(&w, &x) as f64;
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }

    /// Runs one weight row against three activation rows through both copies (one at a
    /// time and three at once) and compares the bits.
    #[cfg(target_arch = "x86_64")]
    fn assert_same_bits<P: Widen>(
        w: &WeightRow<P>,
        xs: &[Q8Row; 3],
        group_sums: &[f32],
        what: &str,
    ) {
        let groups = w.scales.len();
        let acts: [Activation; 3] = std::array::from_fn(|a| Activation {
            q: &xs[a],
            group_sums: &group_sums[a * groups..(a + 1) * groups],
        });
        type Kernel<P> = unsafe fn(&WeightRow<P>, &[Activation; 3]) -> [f32; 3];
        type Single<P> = unsafe fn(&WeightRow<P>, &[Activation; 1]) -> [f32; 1];
        use crate::simd::Level;
        let mut kernels: Vec<(&str, Kernel<P>, Single<P>)> =
            vec![("avx2", row_dots_avx2::<P, 3>, row_dots_avx2::<P, 1>)];
        for (level, batched, single) in [
            (
                Level::Avx2Vnni,
                row_dots_avxvnni::<P, 3> as Kernel<P>,
                row_dots_avxvnni::<P, 1> as Single<P>,
            ),
            (
                Level::Avx512Vnni,
                row_dots_vnni::<P, 3>,
                row_dots_vnni::<P, 1>,
            ),
        ] {
            match level.missing() {
                None => kernels.push((level.name(), batched, single)),
                Some(why) => eprintln!("{}: not compared ({why})", level.name()),
            }
        }
        for (name, batched, single) in kernels {
            // SAFETY: the caller checked that AVX2 is present, and `missing` the rest.
            let together = unsafe { batched(w, &acts) };
            for (a, x) in acts.iter().enumerate() {
                let want = row_dot_portable(w, x);
                // SAFETY: as above.
                let alone = unsafe { single(w, std::array::from_ref(x)) };
                for (got, how) in [(alone[0], "alone"), (together[a], "batched")] {
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{what}, {name} {how}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The AVX2 row and the portable one agree bit for bit, for one and several chunks per
    /// group, with f32 and bf16 scales.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_and_portable_rows_agree() {
        if !crate::simd::Level::Avx2.supported() {
            eprintln!("no AVX2 here: only the portable row runs");
            return;
        }
        let cols = 640; // 10 or 5 groups: the eight-group bias step and its tail
        let q: Vec<u32> = (0..cols as u32).map(|j| (j * 13 + 7) % 16).collect();
        let words = pack_row(&q, 4);
        let x: Vec<Vec<f32>> = (0..3)
            .map(|a| {
                (0..cols)
                    .map(|j| ((j * 31 % 53 + 7 * a) as f32 - 26.0) / (9.0 + a as f32))
                    .collect()
            })
            .collect();
        let xq: [Q8Row; 3] = std::array::from_fn(|a| Q8Row::quantize(&x[a]));
        for group in [64, 128] {
            let scales: Vec<f32> = (0..cols / group).map(|g| 0.5 - 0.13 * g as f32).collect();
            let biases: Vec<f32> = (0..cols / group).map(|g| 0.07 * g as f32 - 0.2).collect();
            let group_sums: Vec<f32> = x
                .iter()
                .flat_map(|x| x.chunks(group).map(|c| c.iter().sum::<f32>()))
                .collect();
            let chunks_per_group = group / CHUNK;
            let w = WeightRow {
                words: &words,
                scales: &scales,
                biases: &biases,
                chunks_per_group,
            };
            assert_same_bits(&w, &xq, &group_sums, &format!("f32, group {group}"));
            let bf16 = |v: &[f32]| -> Vec<half::bf16> {
                v.iter().map(|&f| half::bf16::from_f32(f)).collect()
            };
            let (s16, b16) = (bf16(&scales), bf16(&biases));
            let w = WeightRow {
                words: &words,
                scales: &s16,
                biases: &b16,
                chunks_per_group,
            };
            assert_same_bits(&w, &xq, &group_sums, &format!("bf16, group {group}"));
        }
    }
}
