//! The grouped expert matmul's cases (`AffineTensor::grouped_matmul_t`, a MoE prefill chunk's
//! products), run by every backend's test alike: the Metal kernel in emulation against the
//! per-expert reference (tests/affine_grouped_emulation.rs), the CUDA kernel's body in
//! emulation (tests/affine_grouped_cuda_emulation.rs) and the CUDA kernel
//! (tests/cuda_affine_grouped.rs): one list of instantiations, shapes and per-expert row
//! counts, one input generator.

use super::dtype::{tensor, Ty, TYPES};
use super::random::{random_matrix, Rng};
use candle_core::Tensor;
use gdn_ops::ops::affine::AffineMatrix;

/// A stack of `counts.len()` experts of `[rows, cols]`, expert `e` given `counts[e]` rows of x.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub x: Ty,
    pub scales: Ty,
    pub bits: usize,
    pub group: usize,
    pub rows: usize,
    pub cols: usize,
    pub counts: Vec<usize>,
}

fn case(
    (x, scales): (Ty, Ty),
    (bits, group): (usize, usize),
    [rows, cols]: [usize; 2],
    counts: &[usize],
) -> Case {
    Case {
        x,
        scales,
        bits,
        group,
        rows,
        cols,
        counts: counts.to_vec(),
    }
}

impl Case {
    /// Rows of x: every expert's pairs.
    pub fn pairs(&self) -> usize {
        self.counts.iter().sum()
    }
    /// Multiply-adds, `pairs · rows · cols`: what a case costs the emulators.
    pub fn work(&self) -> usize {
        self.pairs() * self.rows * self.cols
    }
    pub fn label(&self) -> String {
        format!(
            "x {} scales {} {}-bit g{} rows {} cols {} counts {:?}",
            self.x.name(),
            self.scales.name(),
            self.bits,
            self.group,
            self.rows,
            self.cols,
            self.counts
        )
    }
}

/// The most work ([`Case::work`]) a case may have for the emulations: a 512-token chunk's
/// routing over the model's experts is the CUDA test's alone.
pub const EMULATION_MAX_WORK: usize = 50_000_000;

/// Every backend's cases.
pub fn cases() -> Vec<Case> {
    let bf16 = (Ty::Bf16, Ty::Bf16);
    let mut out = vec![];
    // Every instantiation, 4 and 8 bits, groups 32 and 64: experts with no rows (first, middle
    // and last), one row, a full 64-pair tile, tiles crossed (33, 65, 70); R below, at and
    // above the 32 columns of a Metal threadgroup and the 128 of a CUDA block, not a multiple
    // of 8 either.
    let counts: [&[usize]; 4] = [
        &[0, 1, 33, 0, 5],
        &[32, 0, 70, 1],
        &[1, 65, 0],
        &[3, 0, 0, 40, 2, 0],
    ];
    let mut i = 0;
    for &x in &TYPES {
        for &scales in &TYPES {
            for (bits, group) in [(4, 64), (8, 32), (4, 32), (8, 64)] {
                let rows = [40, 32, 13, 72][i % 4];
                let cols: usize = [128, 96, 64, 192][(i / 2) % 4];
                let cols = cols.max(group).next_multiple_of(group);
                out.push(case(
                    (x, scales),
                    (bits, group),
                    [rows, cols],
                    counts[i % 4],
                ));
                i += 1;
            }
            // Pairs of 64, 65 and 130 around the tiles.
            let counts = [0, 1, 64, 0, 65, 3, 130, 0];
            out.push(case((x, scales), (4, 64), [96, 256], &counts));
            out.push(case((x, scales), (4, 64), [96, 128], &[0, 1, 70, 3, 0]));
        }
    }
    // The other widths the kernels unpack (3, 5 and 6 bits: the CUDA per-expert path), every
    // group size.
    for (j, bits) in [2, 3, 5, 6].into_iter().enumerate() {
        let pair = [
            bf16,
            (Ty::F16, Ty::F32),
            (Ty::F32, Ty::Bf16),
            (Ty::Bf16, Ty::F16),
        ][j];
        out.push(case(pair, (bits, 128), [24, 256], &[2, 0, 35]));
    }
    for bits in [2, 3, 4, 8] {
        for group in [32, 64, 128] {
            out.push(case(bf16, (bits, group), [128, 256], &[5, 0, 70, 1]));
        }
    }
    // Two CUDA row blocks, the second partial (200 = 128 + 72), a last step of 32 columns
    // (96 = 64 + 32); counts that leave whole 16-pair fragments of a tile empty.
    for pair in [bf16, (Ty::F16, Ty::F32), (Ty::F32, Ty::F16)] {
        out.push(case(pair, (4, 32), [200, 96], &[40, 17, 0, 2]));
    }
    out.push(case(bf16, (8, 32), [64, 96], &[5, 0, 64, 2]));
    out.push(case((Ty::Bf16, Ty::F32), (2, 128), [32, 256], &[17, 1]));
    out.push(case((Ty::F32, Ty::Bf16), (8, 128), [80, 128], &[2, 129]));
    // Many steps (7 and 16), 8 and 2 bits, 2-bit rows of 24 bytes.
    out.push(case((Ty::F16, Ty::F16), (8, 64), [136, 448], &[20, 3, 33]));
    out.push(case(bf16, (2, 64), [72, 1024], &[9, 2]));
    out.push(case((Ty::Bf16, Ty::F16), (2, 32), [64, 96], &[5, 3]));
    // Model widths: Qwen3-Next-80B's expert down projection (Im = 512 → H = 2048) and gate/up
    // input (cols 2048), 4 bits, group 64, on one or two row blocks; a longer K.
    out.push(case(bf16, (4, 64), [2048, 512], &[5, 0, 40]));
    out.push(case(bf16, (4, 64), [128, 512], &[64, 0, 65, 1]));
    out.push(case(bf16, (4, 64), [64, 2048], &[3, 40]));
    out.push(case(bf16, (4, 64), [48, 1024], &[9, 0, 34, 1]));
    // A batched decode step's dense product (issue 29, `DenseRows::Grouped`): one matrix,
    // one group of 5 to 64 rows in one tile, 8-bit f32 activations (the router's width).
    for rows_x in [5, 16, 33, 64] {
        out.push(case(bf16, (4, 64), [200, 256], &[rows_x]));
    }
    out.push(case((Ty::F32, Ty::Bf16), (8, 32), [72, 128], &[9]));
    // Qwen3-Next-80B's expert shapes (gate/up [1024, 2048], down [2048, 512]) with 512
    // tokens × 11 slots routed at random over 64 experts, skewed: a few take many pairs,
    // several none.
    let mut rng = Rng::xorshift(0x5EED_A702);
    let mut counts = vec![0usize; 64];
    for _ in 0..512 * 11 {
        counts[(rng.below(64) * rng.below(64)) / 64] += 1;
    }
    for shape in [[1024, 2048], [2048, 512]] {
        out.push(case(bf16, (4, 64), shape, &counts));
    }
    out
}

/// A split-K dense case (`ops/affine_grouped/split_k.rs`: one matrix, 9–64 rows, the grouped
/// body over column slices into an f32 workspace, then the fixed-order sum), run by the CUDA
/// body's and the Metal kernel's emulations alike.
pub struct SplitCase {
    /// One expert: `counts` = `[rows of x]`.
    pub op: Case,
    /// Its inputs' seed index (as [`seed`]'s `i`).
    pub index: usize,
    /// Steps of 64 columns a slice: the host's cut (`slicing`), or a forced one.
    pub slice_steps: usize,
}

/// 9, 16, 33 and 64 rows (the CUDA tile heights 16, 32, 64; Metal's one or two 32-row tiles),
/// 4 and 8 bits, groups 32 and 64, f32, bf16 and f16 activations; at the host's slicing
/// ([`slicing`]: one step a slice on these small matrices) and at forced cuts (an uneven last
/// slice, a last step of 32 columns, one slice).
///
/// [`slicing`]: gdn_ops::ops::affine_grouped::slicing::slicing
pub fn split_cases() -> Vec<SplitCase> {
    let shapes = [
        // (x, scales, bits, group, rows, cols, rows of x, forced slice steps)
        (Ty::Bf16, Ty::Bf16, 4, 64, 200, 320, 16, Some(2)),
        (Ty::F32, Ty::F32, 8, 32, 72, 288, 9, None),
        (Ty::Bf16, Ty::Bf16, 4, 64, 136, 256, 64, None),
        (Ty::F32, Ty::Bf16, 4, 32, 130, 288, 33, Some(3)),
        (Ty::F16, Ty::F16, 8, 64, 40, 384, 16, Some(6)),
        (Ty::Bf16, Ty::F32, 8, 32, 100, 224, 33, None),
        (Ty::F32, Ty::F16, 4, 64, 64, 256, 64, None),
    ];
    let slicing = gdn_ops::ops::affine_grouped::slicing::slicing;
    shapes
        .into_iter()
        .enumerate()
        .map(
            |(i, (x, scales, bits, group, rows, cols, n, forced))| SplitCase {
                op: case((x, scales), (bits, group), [rows, cols], &[n]),
                index: 1000 + i,
                slice_steps: forced.unwrap_or_else(|| slicing(rows, cols).0),
            },
        )
        .collect()
}

/// The inputs' seed of case `i` of [`cases`]: the same on every backend.
pub fn seed(i: usize) -> u64 {
    super::random::case_seed(104_729, i, 0)
}

/// One case's inputs on the CPU: the stacked matrix, x `[P, cols]` rounded to its type, the
/// experts' row offsets.
pub struct Inputs {
    pub m: AffineMatrix,
    pub x: Vec<f32>,
    pub offsets: Vec<u32>,
}

pub fn inputs(c: &Case, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let shape = [c.counts.len(), c.rows, c.cols];
    let m = random_matrix(&mut rng, c.bits, c.group, shape, c.scales.dtype());
    let x = (0..c.pairs() * c.cols)
        .map(|_| c.x.round(rng.signed(0.05, 1.0)))
        .collect();
    Inputs {
        m,
        x,
        offsets: row_offsets(&c.counts),
    }
}

impl Inputs {
    /// x as a `[P, cols]` tensor.
    pub fn x_tensor(&self, c: &Case) -> Tensor {
        tensor(&self.x, &[c.pairs(), c.cols], c.x)
    }
}

/// The row offsets of experts holding `counts[e]` rows each, in expert order: `experts + 1`
/// entries from 0.
pub fn row_offsets(counts: &[usize]) -> Vec<u32> {
    std::iter::once(0)
        .chain(counts.iter().scan(0u32, |at, &c| {
            *at += c as u32;
            Some(*at)
        }))
        .collect()
}
