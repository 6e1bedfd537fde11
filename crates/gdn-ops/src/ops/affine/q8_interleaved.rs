//! The 8-bit-activation kernel on a layout repacked at load (llama.cpp's interleaved Q4_0
//! idea, on MLX's affine 4-bit groups): sixteen weight rows interleaved four bytes at a time,
//! so that one 512-bit `vpdpbusd` computes sixteen rows' partial sums (one 32-bit lane per
//! row) against a broadcast activation word, and the conversion, the scaling and the FMA
//! that follow serve all sixteen rows at once.
//!
//! The arithmetic of one (weight row, activation row) pair, the same in every copy and for any
//! number of activation rows per call, so a prompt token's products are bit for bit those of a
//! decoded token:
//!
//! - per chunk `c` of 64 elements and half `h` of it (32 elements: one activation scale),
//!   `isum = Σ q · xq` exactly in i32, then `acc_h = fma(f32(isum), xscale[c, h] · wscale[g], acc_h)`;
//! - per group `g`, in order, `bacc = fma(bias[g], Σx[g], bacc)`;
//! - the result is `(acc_0 + acc_1) + bacc`.
//!
//! That is not the plain kernel's order ([`q8_kernel`](super::q8_kernel) keeps eight float lanes per pair,
//! one per four packed bytes, summed at the end): reproducing it here would take eight
//! conversions and eight FMAs per sixteen `vpdpbusd` instead of two, and eight accumulators
//! per activation row, so at most two activation rows per call. The two kernels therefore
//! differ in the last bits (the tests bound it), and a matrix uses one of them for every
//! product, prefill and decode alike.

use super::group_params::GroupParams;
pub use super::q8_interleaved_block::ROWS;
use super::q8_interleaved_block::{Block, Param, WORDS_PER_CHUNK};
use super::q8_kernel::{supports_format, Activation, Q8Row, CHUNK};
use half::bf16;

/// Activation rows per kernel call: each block's chunk is loaded and unpacked once for all of
/// them. Three accumulators and two partial sums per activation row, so four fit the 32
/// vector registers with the unpacked weights.
const ACTIVATIONS_AT_ONCE: usize = 4;

/// Which layout the q8 mode runs its 4-bit matrices in (the model's `QWEN_GDN_Q8_LAYOUT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Q8Layout {
    /// Interleaved where the CPU level has a SIMD kernel for it
    /// ([`Level::has_interleaved_q8_kernel`](crate::simd::Level::has_interleaved_q8_kernel)),
    /// else plain: the portable kernel on the interleaved layout is slower than the plain
    /// layout's (the default).
    #[default]
    Auto,
    /// Repacked at load into blocks of interleaved rows, whatever the level.
    Interleaved,
    /// The checkpoint's own layout, run by the plain q8 kernels.
    Plain,
}

/// Whether matrices that the q8 mode runs should be repacked at load for `layout`, at the
/// selected CPU level.
pub fn repack_at_load(layout: Q8Layout) -> bool {
    match layout {
        Q8Layout::Auto => crate::simd::level().has_interleaved_q8_kernel(),
        Q8Layout::Interleaved => true,
        Q8Layout::Plain => false,
    }
}

/// Per-group scales and biases of each block, `[blocks, groups, ROWS]`, in the stored dtype
/// where the kernel widens it cheaply (bf16), else in f32 (f16 widens exactly).
#[derive(Debug, Clone)]
enum Params {
    Bf16 {
        scales: Vec<bf16>,
        biases: Vec<bf16>,
    },
    F32 {
        scales: Vec<f32>,
        biases: Vec<f32>,
    },
}

/// A 4-bit matrix `[experts, rows, cols]` with each expert's rows in blocks of [`ROWS`] (the
/// last block padded with zero rows), every block stored chunk by chunk: for each chunk, for
/// each of its eight packed words, that word of the block's sixteen rows side by side.
#[derive(Debug, Clone)]
pub struct Interleaved {
    rows: usize,
    cols: usize,
    group_size: usize,
    blocks_per_expert: usize,
    /// `[blocks, chunks, WORDS_PER_CHUNK, ROWS]`.
    words: Vec<u32>,
    params: Params,
}

/// A 4-bit matrix `[experts, rows, cols]` in MLX's plain layout, as [`Interleaved::new`]
/// reads it: `packed` `[experts * rows, cols / 8]`, `scales` and `biases`
/// `[experts * rows, cols / group_size]`.
pub struct PlainLayout<'a> {
    pub experts: usize,
    pub rows: usize,
    pub cols: usize,
    pub group_size: usize,
    pub packed: &'a [u32],
    pub scales: &'a GroupParams,
    pub biases: &'a GroupParams,
}

impl Interleaved {
    /// Repacks a matrix whose format the q8 kernel supports ([`supports_format`]).
    pub fn new(m: PlainLayout) -> Self {
        assert!(
            supports_format(4, m.group_size),
            "only 4-bit matrices with groups of 64 or more are interleaved"
        );
        let (wpr, gpr) = (m.cols / 8, m.cols / m.group_size);
        let blocks_per_expert = m.rows.div_ceil(ROWS);
        let blocks = m.experts * blocks_per_expert;
        let mut words = vec![0u32; blocks * wpr * ROWS];
        let mut scales = vec![0f32; blocks * gpr * ROWS];
        let mut biases = scales.clone();
        let (mut row_s, mut row_b) = (vec![0f32; gpr], vec![0f32; gpr]);
        for e in 0..m.experts {
            for r in 0..m.rows {
                let global = e * m.rows + r;
                let (block, lane) = (e * blocks_per_expert + r / ROWS, r % ROWS);
                let src = &m.packed[global * wpr..(global + 1) * wpr];
                // Word w of the row is word w % 8 of chunk w / 8.
                for (w, &word) in src.iter().enumerate() {
                    words[(block * wpr + w) * ROWS + lane] = word;
                }
                m.scales.widen_into(global * gpr, &mut row_s);
                m.biases.widen_into(global * gpr, &mut row_b);
                for g in 0..gpr {
                    scales[(block * gpr + g) * ROWS + lane] = row_s[g];
                    biases[(block * gpr + g) * ROWS + lane] = row_b[g];
                }
            }
        }
        let params = match m.scales {
            // Exact: these are widened bf16 values (and zeros).
            GroupParams::Bf16(_) if matches!(m.biases, GroupParams::Bf16(_)) => Params::Bf16 {
                scales: scales.iter().map(|&v| bf16::from_f32(v)).collect(),
                biases: biases.iter().map(|&v| bf16::from_f32(v)).collect(),
            },
            _ => Params::F32 { scales, biases },
        };
        Self {
            rows: m.rows,
            cols: m.cols,
            group_size: m.group_size,
            blocks_per_expert,
            words,
            params,
        }
    }

    fn words_per_row(&self) -> usize {
        self.cols / 8
    }

    fn groups_per_row(&self) -> usize {
        self.cols / self.group_size
    }

    /// Block and lane of a row of the stacked `[experts * rows]` matrix.
    fn locate(&self, row: usize) -> (usize, usize) {
        let (e, r) = (row / self.rows, row % self.rows);
        (e * self.blocks_per_expert + r / ROWS, r % ROWS)
    }

    /// The packed words of one stacked row, in the plain layout.
    pub fn row_words(&self, row: usize, out: &mut [u32]) {
        let (block, lane) = self.locate(row);
        let wpr = self.words_per_row();
        for (w, o) in out[..wpr].iter_mut().enumerate() {
            *o = self.words[(block * wpr + w) * ROWS + lane];
        }
    }

    /// Bytes of the interleaved words, scales and biases (padding included).
    pub fn bytes(&self) -> usize {
        4 * self.words.len()
            + match &self.params {
                Params::Bf16 { scales, biases } => 2 * (scales.len() + biases.len()),
                Params::F32 { scales, biases } => 4 * (scales.len() + biases.len()),
            }
    }

    /// The q8 mode's `rows_dot` on this layout: the stacked rows `first .. first + rows`
    /// against every activation row of `xs`, into `out` as `[rows, xs.len()]`; `group_sums`
    /// is `[xs.len(), groups]`. Rows are computed a whole block at a time.
    pub fn rows_dot(
        &self,
        first: usize,
        rows: usize,
        xs: &[Q8Row],
        group_sums: &[f32],
        out: &mut [f32],
    ) {
        let (n, gpr) = (xs.len(), self.groups_per_row());
        assert_eq!(out.len(), rows * n, "output is [rows, activations]");
        assert_eq!(group_sums.len(), n * gpr);
        for x in xs {
            assert_eq!(x.values().len(), self.cols, "activation width");
        }
        let activation = |j: usize| Activation {
            q: &xs[j],
            group_sums: &group_sums[j * gpr..(j + 1) * gpr],
        };
        let mut r = first;
        while r < first + rows {
            let (block, lane) = self.locate(r);
            let take = (ROWS - lane)
                .min(self.rows - r % self.rows)
                .min(first + rows - r);
            let mut put = |j: usize, dots: &[f32; ROWS]| {
                for i in 0..take {
                    out[(r - first + i) * n + j] = dots[lane + i];
                }
            };
            let mut j = 0;
            while j + ACTIVATIONS_AT_ONCE <= n {
                let batch: [_; ACTIVATIONS_AT_ONCE] = std::array::from_fn(|a| activation(j + a));
                for (a, dots) in self.block_dots(block, &batch).iter().enumerate() {
                    put(j + a, dots);
                }
                j += ACTIVATIONS_AT_ONCE;
            }
            for j in j..n {
                put(j, &self.block_dots(block, &[activation(j)])[0]);
            }
            r += take;
        }
    }

    /// One block against `A` activation rows: sixteen dots per activation row.
    fn block_dots<const A: usize>(&self, block: usize, xs: &[Activation; A]) -> [[f32; ROWS]; A] {
        let (wpr, gpr) = (self.words_per_row(), self.groups_per_row());
        let words = &self.words[block * wpr * ROWS..(block + 1) * wpr * ROWS];
        let params = block * gpr * ROWS..(block + 1) * gpr * ROWS;
        let chunks_per_group = self.group_size / CHUNK;
        let block = (words, params, chunks_per_group);
        match &self.params {
            Params::Bf16 { scales, biases } => dispatch(&Block::new(block, scales, biases), xs),
            Params::F32 { scales, biases } => dispatch(&Block::new(block, scales, biases), xs),
        }
    }
}

/// The selected level's copy of the kernel ([`crate::simd::level`]); every copy gives the
/// same bits.
fn dispatch<P: Param, const A: usize>(b: &Block<P>, xs: &[Activation; A]) -> [[f32; ROWS]; A] {
    // SAFETY: the selected level is one the CPU supports (`select_level` refuses others).
    unsafe { run_at(crate::simd::level(), b, xs) }
}

/// The kernel's copy for `level`.
///
/// # Safety
/// The CPU supports `level` (asked once per selection, not per block: the question costs a
/// few string comparisons, the block a few thousand instructions).
unsafe fn run_at<P: Param, const A: usize>(
    level: crate::simd::Level,
    b: &Block<P>,
    xs: &[Activation; A],
) -> [[f32; ROWS]; A] {
    use crate::simd::Level;
    match level {
        // SAFETY (each arm): the CPU has the level's features, which include the copy's.
        #[cfg(target_arch = "x86_64")]
        Level::Avx512Vnni => unsafe { block_dots_vnni(b, xs) },
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => unsafe {
            super::q8_interleaved_avx2::block_dots_avx2(b, xs)
        },
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Vnni => unsafe { super::q8_interleaved_avx2::block_dots_avxvnni(b, xs) },
        #[cfg(target_arch = "aarch64")]
        Level::NeonDotprod => unsafe { super::q8_interleaved_neon::block_dots_sdot(b, xs) },
        #[cfg(target_arch = "aarch64")]
        Level::NeonI8mm => unsafe { super::q8_interleaved_neon::block_dots_smmla(b, xs) },
        _ => std::array::from_fn(|a| block_dots_portable(b, &xs[a])),
    }
}

/// The kernel's arithmetic in scalar code, row by row: see the module's documentation.
fn block_dots_portable<P: Param>(b: &Block<P>, x: &Activation) -> [f32; ROWS] {
    let groups = b.scales.len() / ROWS;
    let (values, lane_scales) = (x.q.values(), x.q.lane_scales());
    std::array::from_fn(|i| {
        let (mut acc, mut bacc) = ([0f32; 2], 0f32);
        for g in 0..groups {
            let (ws, bs) = (
                b.scales[g * ROWS + i].widen(),
                b.biases[g * ROWS + i].widen(),
            );
            bacc = bs.mul_add(x.group_sums[g], bacc);
            for c in g * b.chunks_per_group..(g + 1) * b.chunks_per_group {
                let xq = &values[c * CHUNK..(c + 1) * CHUNK];
                for (h, acc) in acc.iter_mut().enumerate() {
                    let mut isum = 0i32;
                    for l in 4 * h..4 * h + 4 {
                        let word = b.words[(c * WORDS_PER_CHUNK + l) * ROWS + i];
                        // Byte t of word l holds elements 8l + 2t (low nibble) and 8l + 2t + 1
                        // (high); xq holds a chunk's even elements, then its odd ones.
                        for t in 0..4 {
                            let byte = (word >> (8 * t)) & 0xFF;
                            isum += (byte & 0xF) as i32 * xq[4 * l + t] as i32
                                + (byte >> 4) as i32 * xq[CHUNK / 2 + 4 * l + t] as i32;
                        }
                    }
                    let dx = lane_scales[8 * c + 4 * h] * ws;
                    *acc = (isum as f32).mul_add(dx, *acc);
                }
            }
        }
        (acc[0] + acc[1]) + bacc
    })
}

/// The same arithmetic, sixteen rows per register, `A` activation rows per call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_dots_vnni<P: Param, const A: usize>(
    b: &Block<P>,
    xs: &[Activation; A],
) -> [[f32; ROWS]; A] {
    use std::arch::x86_64::*;
    let groups = b.checked_groups(xs);
    // Sixteen scales or biases of group g, widened to f32 (a bf16 is the top half of an f32).
    // A macro, not a closure: the intrinsics stay inside this function's target features.
    macro_rules! load {
        ($p:expr, $g:expr) => {{
            let at = $p.as_ptr().add($g * ROWS);
            if P::IS_BF16 {
                let half = _mm256_loadu_si256(at as *const __m256i);
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16))
            } else {
                _mm512_loadu_ps(at as *const f32)
            }
        }};
    }
    let low_mask = _mm512_set1_epi8(0x0F);
    let mut acc = [[_mm512_setzero_ps(); A]; 2];
    let mut bacc = [_mm512_setzero_ps(); A];
    for g in 0..groups {
        let (ws, bs) = (load!(b.scales, g), load!(b.biases, g));
        for a in 0..A {
            let sum = _mm512_set1_ps(*xs[a].group_sums.get_unchecked(g));
            bacc[a] = _mm512_fmadd_ps(bs, sum, bacc[a]);
        }
        for c in g * b.chunks_per_group..(g + 1) * b.chunks_per_group {
            // SAFETY (every read below): c < chunks, and the asserts above bound the slices.
            let at = b.words.as_ptr().add(c * WORDS_PER_CHUNK * ROWS) as *const __m512i;
            for (h, acc_h) in acc.iter_mut().enumerate() {
                let mut lo_sum = [_mm512_setzero_si512(); A];
                let mut hi_sum = [_mm512_setzero_si512(); A];
                for l in 4 * h..4 * h + 4 {
                    let packed = _mm512_loadu_si512(at.add(l) as *const _);
                    let lo = _mm512_and_si512(packed, low_mask);
                    let hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_mask);
                    for a in 0..A {
                        // Four even elements (for the low nibbles) and four odd ones, as one
                        // broadcast word each.
                        let xq = xs[a].q.values().as_ptr().add(c * CHUNK) as *const i32;
                        let even = _mm512_set1_epi32(xq.add(l).read_unaligned());
                        let odd = _mm512_set1_epi32(xq.add(CHUNK / 8 + l).read_unaligned());
                        lo_sum[a] = _mm512_dpbusd_epi32(lo_sum[a], lo, even);
                        hi_sum[a] = _mm512_dpbusd_epi32(hi_sum[a], hi, odd);
                    }
                }
                for a in 0..A {
                    let isum = _mm512_add_epi32(lo_sum[a], hi_sum[a]);
                    let x_scale = *xs[a].q.lane_scales().get_unchecked(8 * c + 4 * h);
                    let dx = _mm512_mul_ps(_mm512_set1_ps(x_scale), ws);
                    acc_h[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dx, acc_h[a]);
                }
            }
        }
    }
    let mut out = [[0f32; ROWS]; A];
    for a in 0..A {
        let v = _mm512_add_ps(_mm512_add_ps(acc[0][a], acc[1][a]), bacc[a]);
        _mm512_storeu_ps(out[a].as_mut_ptr(), v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::packing::pack_row;
    use super::*;

    /// A `[1, rows, cols]` 4-bit matrix with bf16 or f32 scales, repacked.
    fn repacked(rows: usize, cols: usize, group: usize, bf16_params: bool) -> Interleaved {
        let q: Vec<u32> = (0..rows * cols)
            .map(|j| ((j * 2654435761) >> 9) as u32 % 16)
            .collect();
        let packed: Vec<u32> = q.chunks(cols).flat_map(|r| pack_row(r, 4)).collect();
        let groups = rows * cols / group;
        let scales: Vec<f32> = (0..groups).map(|g| 0.01 + 0.003 * (g % 7) as f32).collect();
        let biases: Vec<f32> = (0..groups).map(|g| 0.02 * (g % 5) as f32 - 0.05).collect();
        let (scales, biases): (GroupParams, GroupParams) = if bf16_params {
            let c = |v: Vec<f32>| -> Vec<bf16> { v.into_iter().map(bf16::from_f32).collect() };
            (c(scales).into(), c(biases).into())
        } else {
            (scales.into(), biases.into())
        };
        Interleaved::new(PlainLayout {
            experts: 1,
            rows,
            cols,
            group_size: group,
            packed: &packed,
            scales: &scales,
            biases: &biases,
        })
    }

    /// Four activation rows' dots of one block: a level's copy on all four at once and on
    /// each alone, and the portable kernel on each.
    type Dots = ([[f32; ROWS]; 4], Vec<[f32; ROWS]>, Vec<[f32; ROWS]>);

    /// A copy of the kernel under test: a level's, or a test-only twin.
    trait KernelCopy {
        fn name(&self) -> &str;
        fn dots<P: Param, const A: usize>(
            &self,
            b: &Block<P>,
            xs: &[Activation; A],
        ) -> [[f32; ROWS]; A];
    }

    impl KernelCopy for Level {
        fn name(&self) -> &str {
            Level::name(*self)
        }
        fn dots<P: Param, const A: usize>(
            &self,
            b: &Block<P>,
            xs: &[Activation; A],
        ) -> [[f32; ROWS]; A] {
            assert!(self.supported());
            // SAFETY: checked just above.
            unsafe { run_at(*self, b, xs) }
        }
    }

    /// The AVX-VNNI copy's arithmetic in AVX-512 VL's encoding of `vpdpbusd`.
    #[cfg(target_arch = "x86_64")]
    struct EvexVnni;

    #[cfg(target_arch = "x86_64")]
    impl KernelCopy for EvexVnni {
        fn name(&self) -> &str {
            "avx2-vnni (EVEX twin)"
        }
        fn dots<P: Param, const A: usize>(
            &self,
            b: &Block<P>,
            xs: &[Activation; A],
        ) -> [[f32; ROWS]; A] {
            assert!(Level::Avx512Vnni.supported());
            // SAFETY: AVX-512 VNNI implies every feature the twin is compiled for.
            unsafe { super::super::q8_interleaved_avx2::block_dots_evex_vnni(b, xs) }
        }
    }

    fn three_ways<P: Param>(copy: &impl KernelCopy, b: &Block<P>, acts: &[Activation; 4]) -> Dots {
        let together = copy.dots(b, acts);
        let alone = acts
            .iter()
            .map(|x| copy.dots(b, std::array::from_ref(x))[0])
            .collect();
        let portable = acts.iter().map(|x| block_dots_portable(b, x)).collect();
        (together, alone, portable)
    }

    use crate::simd::Level;

    /// Every level's copy this CPU runs and the portable kernel agree bit for bit, one
    /// activation row and four at a time, for one and two chunks per group, with bf16 and f32
    /// parameters.
    #[test]
    fn every_level_and_portable_blocks_agree() {
        for level in Level::ALL {
            match level.missing() {
                None => same_bits_as_portable(&level),
                Some(why) => eprintln!("{}: not run ({why})", level.name()),
            }
        }
        // Without AVX-VNNI its copy's arithmetic still runs, in the AVX-512 encoding.
        #[cfg(target_arch = "x86_64")]
        if !Level::Avx2Vnni.supported() && Level::Avx512Vnni.supported() {
            same_bits_as_portable(&EvexVnni);
        }
    }

    fn same_bits_as_portable(level: &impl KernelCopy) {
        let cols = 640;
        let x: Vec<Vec<f32>> = (0..4)
            .map(|a| {
                (0..cols)
                    .map(|j| ((j * 31 % 53 + 7 * a) as f32 - 26.0) / (9.0 + a as f32))
                    .collect()
            })
            .collect();
        let xq: Vec<Q8Row> = x.iter().map(|x| Q8Row::quantize(x)).collect();
        for group in [64, 128] {
            let sums: Vec<Vec<f32>> = x
                .iter()
                .map(|x| x.chunks(group).map(|c| c.iter().sum()).collect())
                .collect();
            let acts: [Activation; 4] = std::array::from_fn(|a| Activation {
                q: &xq[a],
                group_sums: &sums[a],
            });
            for bf16_params in [true, false] {
                let m = repacked(20, cols, group, bf16_params);
                for block in 0..2 {
                    let (wpr, gpr) = (m.words_per_row(), m.groups_per_row());
                    let words = &m.words[block * wpr * ROWS..(block + 1) * wpr * ROWS];
                    let params = block * gpr * ROWS..(block + 1) * gpr * ROWS;
                    let check = |(together, alone, want): Dots| {
                        for a in 0..4 {
                            for i in 0..ROWS {
                                let w = want[a][i].to_bits();
                                let at = format!("{}: group {group}, bf16 {bf16_params}, block {block}, act {a}, row {i}", level.name());
                                assert_eq!(together[a][i].to_bits(), w, "{at}: four at once");
                                assert_eq!(alone[a][i].to_bits(), w, "{at}: alone");
                            }
                        }
                    };
                    let block = (words, params, group / CHUNK);
                    match &m.params {
                        Params::Bf16 { scales, biases } => {
                            check(three_ways(level, &Block::new(block, scales, biases), &acts))
                        }
                        Params::F32 { scales, biases } => {
                            check(three_ways(level, &Block::new(block, scales, biases), &acts))
                        }
                    }
                }
            }
        }
    }

    /// The portable kernel is the dot of the dequantized row with the rounded activations
    /// (and the exact group sums for the bias), checked in f64.
    #[test]
    fn portable_block_is_the_rounded_dot() {
        let (rows, cols, group) = (3, 256, 128);
        let m = repacked(rows, cols, group, false);
        let x: Vec<f32> = (0..cols)
            .map(|j| ((j * 37 % 23) as f32 - 11.0) / 3.0)
            .collect();
        let xq = Q8Row::quantize(&x);
        let sums: Vec<f32> = x.chunks(group).map(|c| c.iter().sum()).collect();
        let Params::F32 { scales, biases } = &m.params else {
            unreachable!("f32 params")
        };
        let gpr = cols / group;
        let b = Block {
            words: &m.words[..m.words_per_row() * ROWS],
            scales: &scales[..gpr * ROWS],
            biases: &biases[..gpr * ROWS],
            chunks_per_group: group / CHUNK,
        };
        let got = block_dots_portable(
            &b,
            &Activation {
                q: &xq,
                group_sums: &sums,
            },
        );
        for (r, &got) in got.iter().enumerate().take(rows) {
            let mut words = vec![0u32; m.words_per_row()];
            m.row_words(r, &mut words);
            let mut want = 0f64;
            for j in 0..cols {
                let (c, i) = (j / CHUNK, j % CHUNK);
                let q = (words[j / 8] >> (4 * (j % 8))) & 0xF;
                let stored = if i % 2 == 0 { i / 2 } else { CHUNK / 2 + i / 2 };
                let dx = xq.lane_scales()[8 * c + 4 * (i / 32)] as f64;
                let xr = dx * xq.values()[c * CHUNK + stored] as f64;
                want += scales[(j / group) * ROWS + r] as f64 * q as f64 * xr;
            }
            for g in 0..gpr {
                want += biases[g * ROWS + r] as f64 * sums[g] as f64;
            }
            assert!(
                (got as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                "row {r}: {got} vs {want}"
            );
        }
        // The padded lanes hold zero rows.
        assert!(got[rows..].iter().all(|&v| v == 0.0));
    }
}
