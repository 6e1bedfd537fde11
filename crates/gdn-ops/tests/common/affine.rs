//! The affine family's cases (quantized products and the gathered SwiGLU of
//! `gdn_ops::ops::affine`), run by every backend's test alike: the Metal kernels in emulation
//! against the exact products (tests/affine_emulation.rs), the CUDA wide kernels' body in
//! emulation (tests/affine_wide_cuda_emulation.rs), the CUDA kernels (tests/cuda_kernels.rs,
//! tests/cuda_moe.rs) and the SwiGLU's CPU twin against the composed products
//! (tests/affine_swiglu.rs): one list of instantiations and shapes, one input generator.

use super::dtype::{tensor, Ty, TYPES};
use super::harness_input::Input;
use super::random::{scaled_matrix, Rng};
use candle_core::{Device, Tensor};
use gdn_ops::ops::affine::{AffineMatrix, AffineTensor};

/// The fields of the kernels' `AffineParams` (kernels/params/affine.h), in order.
pub const AFFINE_PARAMS: [&str; 7] = [
    "rows",
    "cols",
    "bits",
    "group_size",
    "out_rows",
    "x_div",
    "has_ids",
];

pub const BITS: [usize; 6] = [2, 3, 4, 5, 6, 8];
pub const GROUPS: [usize; 3] = [32, 64, 128];

/// All nine (activation type, scale type) instantiations, activation type first as in the
/// kernels' names.
pub fn pairs() -> Vec<(Ty, Ty)> {
    TYPES
        .iter()
        .flat_map(|&x| TYPES.iter().map(move |&s| (x, s)))
        .collect()
}

/// What a case computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `x·Wᵀ`: `matmul_t` (dense) or `gather_matmul_t`.
    Products,
    /// `gather_swiglu` of a stacked gate-and-up matrix (`rows` = 2·Im per expert).
    Swiglu,
}

/// How the products are gathered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gather {
    /// One expert, no ids: `tokens` rows of x, one output row each.
    Dense,
    /// `slots` expert ids per token, every slot of a token reading the token's row of x.
    PerToken { slots: usize },
    /// `slots` expert ids per token, a row of x per slot.
    PerSlot { slots: usize },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub kind: Kind,
    pub x: Ty,
    pub scales: Ty,
    pub bits: usize,
    pub group: usize,
    pub experts: usize,
    /// Rows per expert (for the SwiGLU, Im gate rows then Im up rows).
    pub rows: usize,
    pub cols: usize,
    pub tokens: usize,
    pub gather: Gather,
    /// `None`: MLX-like scales; `Some(s)`: every |scale| in [s/2, s].
    pub scale_mag: Option<f32>,
    /// The magnitude of x's values.
    pub x_mag: f32,
    /// The expert ids (`tokens · slots`), or `None` to draw them.
    pub ids: Option<Vec<u32>>,
}

impl Case {
    pub fn new(
        kind: Kind,
        (x, scales): (Ty, Ty),
        (bits, group): (usize, usize),
        [experts, rows, cols]: [usize; 3],
        tokens: usize,
        gather: Gather,
    ) -> Self {
        Self {
            kind,
            x,
            scales,
            bits,
            group,
            experts,
            rows,
            cols,
            tokens,
            gather,
            scale_mag: None,
            x_mag: 1.0,
            ids: None,
        }
    }
    pub fn with_ids(self, ids: &[u32]) -> Self {
        Self {
            ids: Some(ids.to_vec()),
            ..self
        }
    }
    /// Expert ids per token (1 for a dense product).
    pub fn slots(&self) -> usize {
        match self.gather {
            Gather::Dense => 1,
            Gather::PerToken { slots } | Gather::PerSlot { slots } => slots,
        }
    }
    /// Rows of x.
    pub fn x_rows(&self) -> usize {
        match self.gather {
            Gather::PerSlot { slots } => self.tokens * slots,
            _ => self.tokens,
        }
    }
    /// Output rows per row of x (the kernels' `x_div`).
    pub fn x_div(&self) -> usize {
        match self.gather {
            Gather::PerToken { slots } => slots,
            _ => 1,
        }
    }
    /// Output rows: one per (token, slot).
    pub fn out_rows(&self) -> usize {
        self.tokens * self.slots()
    }
    /// Values per output row.
    pub fn outputs(&self) -> usize {
        match self.kind {
            Kind::Products => self.rows,
            Kind::Swiglu => self.rows / 2,
        }
    }
    pub fn label(&self) -> String {
        format!(
            "{:?} x {} scales {} {}-bit g{} {}x{}x{} {:?} tokens {} ids {:?} scale_mag {:?} x_mag {}",
            self.kind,
            self.x.name(),
            self.scales.name(),
            self.bits,
            self.group,
            self.experts,
            self.rows,
            self.cols,
            self.gather,
            self.tokens,
            self.ids,
            self.scale_mag,
            self.x_mag
        )
    }
}

/// Widths of x that a group size allows, most not a multiple of the 256 columns one Metal
/// simdgroup covers per step (nor of the 512 of a dequant threadgroup).
pub fn widths(group_size: usize) -> [usize; 4] {
    match group_size {
        32 => [96, 160, 320, 256],
        64 => [64, 192, 320, 512],
        _ => [128, 384, 640, 256],
    }
}

/// Every backend's cases.
pub fn cases() -> Vec<Case> {
    use Kind::{Products, Swiglu};
    let mut out = vec![];
    let pairs = pairs();
    // Dense products: every width x group size x instantiation; R = 13 and 21 leave idle
    // simdgroups and rows, R = 8 fills a Metal threadgroup, R = 3 leaves its second
    // simdgroup idle.
    for (bi, &bits) in BITS.iter().enumerate() {
        for (gi, &gs) in GROUPS.iter().enumerate() {
            for (pi, &pair) in pairs.iter().enumerate() {
                let k = widths(gs)[(bi + pi) % 4];
                let r = [13, 8, 21, 3][(gi + pi) % 4];
                let m = [1, 3][(bi + gi + pi) % 2];
                out.push(Case::new(
                    Products,
                    pair,
                    (bits, gs),
                    [1, r, k],
                    m,
                    Gather::Dense,
                ));
            }
        }
    }
    // Long rows: several steps per lane, K = 2176 not a multiple of 256.
    for (bi, &bits) in BITS.iter().enumerate() {
        let k = if bi % 2 == 0 { 2048 } else { 2176 };
        let dims = (bits, GROUPS[bi % 3]);
        out.push(Case::new(
            Products,
            pairs[(bi * 4) % 9],
            dims,
            [1, 13, k],
            3,
            Gather::Dense,
        ));
    }
    // A dense matrix, decode-shaped and prefill-shaped.
    for n in [1, 3, 17] {
        let pair = (Ty::F32, Ty::Bf16);
        out.push(Case::new(
            Products,
            pair,
            (4, 64),
            [1, 96, 512],
            n,
            Gather::Dense,
        ));
    }
    // Gathers: 5 experts, repeated ids; two slots per row of x, or a row of x per slot.
    for (pi, &pair) in pairs.iter().enumerate() {
        for (j, gather) in [Gather::PerSlot { slots: 2 }, Gather::PerToken { slots: 2 }]
            .into_iter()
            .enumerate()
        {
            let bits = BITS[(pi + j + 1) % 6];
            let gs = GROUPS[pi % 3];
            let shape = [5, [13, 8, 6][pi % 3], widths(gs)[(pi + j + 1) % 4]];
            let c = Case::new(Products, pair, (bits, gs), shape, 3, gather);
            out.push(c.with_ids(&[3, 0, 3, 4, 1, 1]));
        }
    }
    // Both gathers at every width x group size x scale type, f32 and bf16 activations.
    let mut i = 0;
    for bits in BITS {
        for gs in GROUPS {
            for scales in TYPES {
                for x in [Ty::F32, Ty::Bf16] {
                    let rows = 24 + (i * 13) % 40;
                    i += 1;
                    for gather in [Gather::PerToken { slots: 2 }, Gather::PerSlot { slots: 2 }] {
                        let shape = [5, rows, 256];
                        out.push(Case::new(
                            Products,
                            (x, scales),
                            (bits, gs),
                            shape,
                            3,
                            gather,
                        ));
                    }
                }
            }
        }
    }
    // One slot, the last expert.
    out.push(
        Case::new(
            Products,
            (Ty::Bf16, Ty::Bf16),
            (4, 64),
            [5, 13, 256],
            1,
            Gather::PerToken { slots: 1 },
        )
        .with_ids(&[4]),
    );
    // bf16 scales outside the f16 range: a conversion through half would flush or overflow.
    for (i, &x) in TYPES.iter().enumerate() {
        // With f16 y, x is scaled so that y stays normal (1e-6) and finite (3e5) in f16.
        let f16_y = x == Ty::F16;
        for (mag, x_mag) in [
            (1e-6f32, if f16_y { 100.0 } else { 1.0f32 }),
            (3e5, if f16_y { 1e-4 } else { 1.0 }),
        ] {
            let bits = BITS[(i * 2 + (mag > 1.0) as usize) % 6];
            let mut c = Case::new(
                Products,
                (x, Ty::Bf16),
                (bits, 32),
                [1, 13, 320],
                3,
                Gather::Dense,
            );
            c.scale_mag = Some(mag);
            c.x_mag = x_mag;
            out.push(c);
        }
    }
    // SwiGLU: every width x group size x instantiation, gathered as the MoE block does (x
    // [N, H], ids [N, S]); Im = 13 and 3 leave idle simdgroups and rows, 8 fills a Metal
    // threadgroup.
    for (bi, &bits) in BITS.iter().enumerate() {
        for (gi, &gs) in GROUPS.iter().enumerate() {
            for (pi, &pair) in pairs.iter().enumerate() {
                if (bi + gi + pi) % 3 != 0 {
                    continue;
                }
                let k = widths(gs)[(bi + pi) % 4];
                let im = [13, 8, 3, 6][(gi + pi) % 4];
                let (tokens, slots) = [(1, 3), (2, 2), (4, 1)][(bi + pi) % 3];
                let gather = Gather::PerToken { slots };
                out.push(Case::new(
                    Swiglu,
                    pair,
                    (bits, gs),
                    [4, 2 * im, k],
                    tokens,
                    gather,
                ));
            }
        }
    }
    // SwiGLU at every bit width, group size and (x, scale) type pair, 1 to 4 tokens of 3
    // slots over 5 experts.
    let mut i = 0;
    for bits in BITS {
        for gs in GROUPS {
            for &(x, scales) in &pairs {
                let im = 8 + (i * 7) % 24;
                let tokens = 1 + i % 4;
                i += 1;
                let gather = Gather::PerToken { slots: 3 };
                let shape = [5, 2 * im, 256];
                out.push(Case::new(
                    Swiglu,
                    (x, scales),
                    (bits, gs),
                    shape,
                    tokens,
                    gather,
                ));
            }
        }
    }
    // Small stacks of the composed path's comparison: 1 to 4 slots, f32 and bf16 x.
    for x in [Ty::F32, Ty::Bf16] {
        for (experts, im, h, bits, gs, tokens, slots) in [
            (5, 24, 256, 4, 64, 1, 3),
            (3, 16, 192, 8, 32, 4, 2),
            (4, 8, 384, 3, 128, 2, 4),
            (2, 12, 128, 6, 64, 3, 1),
        ] {
            let gather = Gather::PerToken { slots };
            let pair = (x, Ty::Bf16);
            out.push(Case::new(
                Swiglu,
                pair,
                (bits, gs),
                [experts, 2 * im, h],
                tokens,
                gather,
            ));
        }
    }
    // The Qwen3-Next-80B expert shape (H = 2048, Im = 512, 4 bits, group 64), the shared
    // expert appended as the last of 3 stacked experts, one token of 3 slots.
    for pair in [(Ty::Bf16, Ty::Bf16), (Ty::F16, Ty::F16)] {
        let gather = Gather::PerToken { slots: 3 };
        let c = Case::new(Swiglu, pair, (4, 64), [3, 1024, 2048], 1, gather);
        out.push(c.with_ids(&[1, 0, 2]));
    }
    out
}

/// The inputs' seed of case `i` of [`cases`]: the same on every backend.
pub fn seed(i: usize) -> u64 {
    super::random::case_seed(7919, i, 0)
}

/// One case's inputs on the CPU: the matrix, x (rounded to its type), the expert ids
/// (`tokens · slots`; empty for a dense product).
pub struct Inputs {
    pub m: AffineMatrix,
    pub x: Vec<f32>,
    pub ids: Vec<u32>,
}

pub fn inputs(c: &Case, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let shape = [c.experts, c.rows, c.cols];
    let scales = c.scales.dtype();
    let m = scaled_matrix(&mut rng, c.bits, c.group, shape, scales, c.scale_mag);
    let x = (0..c.x_rows() * c.cols)
        .map(|_| c.x.round(rng.signed(0.05, 1.0) * c.x_mag))
        .collect();
    let ids = match (&c.ids, c.gather) {
        (_, Gather::Dense) => vec![],
        (Some(ids), _) => ids.clone(),
        (None, _) => (0..c.out_rows())
            .map(|_| rng.below(c.experts) as u32)
            .collect(),
    };
    Inputs { m, x, ids }
}

impl Inputs {
    /// x as a tensor: `[x_rows, cols]`, or `[tokens, slots, cols]` for a row per slot.
    pub fn x_tensor(&self, c: &Case) -> Tensor {
        match c.gather {
            Gather::PerSlot { slots } => tensor(&self.x, &[c.tokens, slots, c.cols], c.x),
            _ => tensor(&self.x, &[c.x_rows(), c.cols], c.x),
        }
    }

    /// The case's op on the matrix `w` (uploaded to `dev`), x and the ids moved there:
    /// `matmul_t`, `gather_matmul_t` or `gather_swiglu`.
    pub fn run(&self, c: &Case, w: &AffineTensor, dev: &Device) -> Tensor {
        let x = self.x_tensor(c).to_device(dev).unwrap();
        let ids = || Tensor::from_vec(self.ids.clone(), (c.tokens, c.slots()), dev).unwrap();
        match (c.kind, c.gather) {
            (Kind::Products, Gather::Dense) => w.matmul_t(&x),
            (Kind::Products, _) => w.gather_matmul_t(&x, &ids()),
            (Kind::Swiglu, Gather::PerToken { .. }) => w.gather_swiglu(&x, &ids()),
            (Kind::Swiglu, gather) => panic!("no SwiGLU case for {gather:?}"),
        }
        .unwrap()
    }
}

/// Case `i` of [`cases`] on the CPU twin and on `dev`: the matrix uploaded to each, and the
/// op's results `[want, got]` (the CPU's, then `dev`'s).
pub fn on_cpu_and(dev: &Device, i: usize, c: &Case) -> ([AffineTensor; 2], [Tensor; 2]) {
    let x = inputs(c, seed(i));
    let w = [&Device::Cpu, dev].map(|d| AffineTensor::upload(&x.m, d).unwrap());
    let out = [(&w[0], &Device::Cpu), (&w[1], dev)].map(|(w, d)| x.run(c, w, d));
    (w, out)
}

/// The cases of one kind, with their index in [`cases`].
pub fn cases_of(kind: Kind) -> impl Iterator<Item = (usize, Case)> {
    cases()
        .into_iter()
        .enumerate()
        .filter(move |(_, c)| c.kind == kind)
}

/// Writes `m` to a harness's input as the CUDA harnesses read it: the (x, scale) type codes,
/// the packed words, then the scales and the biases in f32.
pub fn send_matrix(input: &mut Input, (x, scales): (Ty, Ty), m: &AffineMatrix) {
    input.u32(x.code()).u32(scales.code());
    m.packed().iter().for_each(|&w| {
        input.u32(w);
    });
    input
        .f32s(&m.scales().to_f32_vec())
        .f32s(&m.biases().to_f32_vec());
}

/// A gathered product's output row `bad` (an out-of-range expert id) must be all NaN; it is
/// then dropped from `got` and `want` so that the rest can be compared with the twin. Returns
/// the failure, if any.
pub fn drop_nan_row(
    what: &str,
    bad: usize,
    outputs: usize,
    got: &mut Vec<f32>,
    want: &mut Vec<f32>,
) -> Option<String> {
    let span = bad * outputs..(bad + 1) * outputs;
    if let Some(i) = got[span.clone()].iter().position(|v| !v.is_nan()) {
        return Some(format!(
            "{what}: output row {bad} has an out-of-range expert id, yet [{i}] = {}",
            got[span.start + i]
        ));
    }
    got.drain(span.clone());
    want.drain(span);
    None
}
