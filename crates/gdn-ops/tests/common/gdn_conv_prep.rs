//! `gdn_conv_prep`'s cases, run by every backend's test alike: the CPU twin against the
//! composed path (tests/gdn_conv_prep.rs), the Metal kernel in emulation
//! (tests/gdn_conv_prep_emulation.rs) and the CUDA kernel (tests/cuda_gdn_conv_prep.rs): one
//! list of layer shapes and chunks, one input generator, and the check that a chunk's outputs
//! are its decode steps' outputs, bit for bit.

use super::compare::values;
use super::dtype::{tensor, Ty};
use super::random::Rng;
use candle_core::{Device, Tensor};
use gdn_ops::ops::gdn_conv_prep::{gdn_conv_prep, ConvPrepDims, ConvPrepOut};

/// `Hk` key heads of `Dk`, `Hv` value heads of `Dv`, `K` taps.
pub fn dims(hk: usize, dk: usize, hv: usize, dv: usize, k: usize) -> ConvPrepDims {
    ConvPrepDims {
        key_heads: hk,
        key_dim: dk,
        value_heads: hv,
        value_dim: dv,
        kernel_size: k,
    }
}

/// A decode step (`tokens` 1) or a prefill chunk of a layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Case {
    pub dims: ConvPrepDims,
    pub batch: usize,
    pub tokens: usize,
    /// From a random conv state, or from zeros (a first chunk).
    pub with_state: bool,
    /// The emulation's view padding: the elements between two token rows of qkv are
    /// `3·pad` (b's `pad`, a's `2·pad`), and a spare token row between batch rows when
    /// `pad > 0`. The other backends pass slices of a merged projection.
    pub pad: usize,
}

fn case(dims: ConvPrepDims, batch: usize, tokens: usize, with_state: bool, pad: usize) -> Case {
    Case {
        dims,
        batch,
        tokens,
        with_state,
        pad,
    }
}

/// Every backend's cases: the real shapes, then edges; decode steps (S = 1) and prefill
/// chunks (S < K − 1, K − 1, K, many), from a state and from zeros.
pub fn cases() -> Vec<Case> {
    // Qwen3-Next-80B-A3B (C = 8192) and Qwen3.5 with 48 and 64 value heads.
    let next = dims(16, 128, 32, 128, 4);
    let q35 = dims(16, 128, 48, 128, 4);
    let q35_64 = dims(16, 128, 64, 128, 4);
    // One key head, the widest heads, the most taps; 5 slots (a partial threadgroup).
    let wide = dims(1, 256, 3, 96, 8);
    // The fewest taps, the narrowest heads, GQA 2.
    let narrow = dims(2, 32, 4, 64, 2);
    // K = 4 and 8 with small heads.
    let small = dims(2, 32, 4, 64, 4);
    let small32 = dims(2, 32, 4, 32, 4);
    let k8 = dims(1, 64, 2, 32, 8);
    let mut out = vec![
        case(next, 1, 1, true, 0),
        case(next, 2, 1, true, 17),
        case(next, 3, 1, true, 0),
        case(next, 1, 5, true, 17),
        case(q35, 1, 1, true, 5),
        case(q35, 2, 2, true, 0),
        case(q35_64, 2, 1, true, 0),
        case(wide, 2, 1, true, 1),
        case(wide, 2, 6, true, 1),
        case(wide, 1, 9, true, 0),
        case(wide, 2, 5, true, 0),
        case(narrow, 3, 1, true, 2),
        case(narrow, 5, 1, true, 0),
        case(narrow, 2, 37, true, 2),
        case(narrow, 3, 300, true, 0),
        case(dims(3, 64, 6, 256, 3), 2, 1, true, 0),
        case(dims(2, 64, 6, 32, 4), 3, 1, true, 0),
        case(dims(2, 64, 6, 32, 3), 3, 1, true, 0),
        case(dims(1, 32, 1, 96, 2), 2, 1, true, 0),
        case(dims(3, 256, 3, 64, 8), 2, 1, true, 0),
        // K = 4: S = 2 = K − 2, K − 1, K, 37.
        case(small32, 2, 2, true, 3),
        case(small32, 1, 3, true, 0),
        case(small32, 2, 4, true, 1),
        case(small32, 2, 37, true, 4),
        // The release shape: K − 2, K − 1, K, 37, a 2048-token prefill chunk.
        case(next, 2, 2, true, 0),
        case(next, 1, 3, true, 0),
        case(next, 1, 4, false, 0),
        case(next, 1, 37, true, 0),
        case(next, 2, 37, true, 0),
        case(next, 1, 2048, true, 0),
        case(next, 1, 2048, false, 0),
    ];
    // S = 1, 2, K − 1, K, 37 and 300 at K = 4, from a state and from zeros.
    for s in [1, 2, 3, 4, 37, 300] {
        for with_state in [true, false] {
            out.push(case(small, 2, s, with_state, 0));
        }
        out.push(case(small, 1, s, false, 0));
    }
    // K = 8, one key head: S < K − 1 mixes old-state rows with new ones in the new state.
    for s in [1, 3, 6, 7, 8, 37] {
        out.push(case(k8, 1, s, true, 0));
    }
    out
}

impl Case {
    /// Tokens the case's projection holds, `B·S`, times its width: what it costs.
    pub fn work(&self) -> usize {
        let d = self.dims;
        self.batch * self.tokens * d.channels() * d.kernel_size
    }
}

/// The most work ([`Case::work`]) a case may have for the emulation: the 2048-token chunks
/// are the CPU twin's and the CUDA test's.
pub const EMULATION_MAX_WORK: usize = 2_500_000;

/// The inputs' seed of case `i` of [`cases`] at `ty`: the same on every backend.
pub fn seed(i: usize, ty: Ty) -> u64 {
    0xC0DE_0000 + (i * 3 + ty as usize) as u64
}

/// One case's inputs as values rounded to the activation type (the decay parameters f32).
#[derive(Clone)]
pub struct Inputs {
    /// `[B, S, C]`.
    pub qkv: Vec<f32>,
    /// `[B, S, Hv]`: both softplus branches and saturated sigmoids.
    pub b: Vec<f32>,
    pub a: Vec<f32>,
    /// `[B, K − 1, C]`: zeros for a case without a state.
    pub state: Vec<f32>,
    /// `[K, C]`.
    pub taps: Vec<f32>,
    /// `[Hv]`.
    pub dt_bias: Vec<f32>,
    /// `[Hv]`: `−exp(A_log)`.
    pub neg_a_exp: Vec<f32>,
}

pub fn inputs(c: &Case, ty: Ty, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let d = c.dims;
    let (ch, hv, k) = (d.channels(), d.value_heads, d.kernel_size);
    let rows = c.batch * c.tokens;
    let qkv = rng.values(rows * ch, -2.0, 2.0, ty);
    let b = rng.values(rows * hv, -8.0, 8.0, ty);
    let a = rng.values(rows * hv, -12.0, 12.0, ty);
    let mut state = rng.values(c.batch * (k - 1) * ch, -2.0, 2.0, ty);
    if !c.with_state {
        state.iter_mut().for_each(|x| *x = 0.0);
    }
    let taps = rng.values(k * ch, -0.6, 0.6, ty);
    let dt_bias = rng.values(hv, -1.0, 1.0, Ty::F32);
    let neg_a_exp = rng
        .values(hv, -3.0, 2.5, Ty::F32)
        .iter()
        .map(|x| -x.exp())
        .collect();
    Inputs {
        qkv,
        b,
        a,
        state,
        taps,
        dt_bias,
        neg_a_exp,
    }
}

/// One case's inputs as CPU tensors: qkv, b and a are slices of one merged projection
/// `[B, S, C + Z + 2·Hv]` (as the model passes them; z, which the op does not read, zero).
pub struct Tensors {
    pub dims: ConvPrepDims,
    pub proj: Tensor,
    pub state: Tensor,
    pub taps: Tensor,
    pub dt_bias: Tensor,
    pub neg_a_exp: Tensor,
}

impl Inputs {
    pub fn tensors(&self, c: &Case, ty: Ty) -> Tensors {
        let d = c.dims;
        let (ch, hv, k) = (d.channels(), d.value_heads, d.kernel_size);
        let (b, s) = (c.batch, c.tokens);
        let z = vec![0f32; b * s * hv * d.value_dim];
        let parts = [
            tensor(&self.qkv, &[b, s, ch], ty),
            tensor(&z, &[b, s, hv * d.value_dim], ty),
            tensor(&self.b, &[b, s, hv], ty),
            tensor(&self.a, &[b, s, hv], ty),
        ];
        let f32s = |v: &[f32]| Tensor::from_slice(v, hv, &Device::Cpu).unwrap();
        Tensors {
            dims: d,
            proj: Tensor::cat(&parts, 2).unwrap(),
            state: tensor(&self.state, &[b, k - 1, ch], ty),
            taps: tensor(&self.taps, &[k, ch], ty),
            dt_bias: f32s(&self.dt_bias),
            neg_a_exp: f32s(&self.neg_a_exp),
        }
    }
}

impl Tensors {
    /// Case `i` of [`cases`] at `ty`, as tensors.
    pub fn of_case(i: usize, c: &Case, ty: Ty) -> Self {
        inputs(c, ty, seed(i, ty)).tensors(c, ty)
    }

    /// A case's shape with random inputs from `seed`.
    pub fn random(dims: ConvPrepDims, batch: usize, tokens: usize, ty: Ty, seed: u64) -> Self {
        let c = case(dims, batch, tokens, true, 0);
        inputs(&c, ty, seed).tensors(&c, ty)
    }

    /// qkv, b and a: slices of the projection (on `dev`).
    pub fn views(&self, dev: &Device) -> [Tensor; 3] {
        let d = self.dims;
        let (c, hv) = (d.channels(), d.value_heads);
        let z = hv * d.value_dim;
        let proj = self.proj.to_device(dev).unwrap();
        [
            proj.narrow(2, 0, c).unwrap(),
            proj.narrow(2, c + z, hv).unwrap(),
            proj.narrow(2, c + z + hv, hv).unwrap(),
        ]
    }

    /// The op on `dev` over tokens `start .. start + len` of every batch row, from `state`
    /// (already on `dev`).
    pub fn run(&self, dev: &Device, start: usize, len: usize, state: &Tensor) -> ConvPrepOut {
        let [qkv, b, a] = self.views(dev).map(|t| t.narrow(1, start, len).unwrap());
        let up = |t: &Tensor| t.to_device(dev).unwrap();
        gdn_conv_prep(
            &qkv,
            &b,
            &a,
            state,
            &up(&self.taps),
            &up(&self.dt_bias),
            &up(&self.neg_a_exp),
            self.dims,
        )
        .unwrap()
    }
}

/// `chunk` (one call over S tokens) against `steps` (S calls of one token each, advancing
/// `state` in place): every output equal bit for bit, and the chunk's new state equal to the
/// state the steps left.
pub fn assert_chunk_is_its_steps(
    what: &str,
    chunk: &ConvPrepOut,
    steps: &[ConvPrepOut],
    state: &Tensor,
) {
    let cat = |f: fn(&ConvPrepOut) -> &Tensor| {
        Tensor::cat(&steps.iter().map(f).collect::<Vec<_>>(), 1).unwrap()
    };
    for (name, got, want) in [
        ("q", &chunk.q, cat(|o| &o.q)),
        ("k", &chunk.k, cat(|o| &o.k)),
        ("v", &chunk.v, cat(|o| &o.v)),
        ("g", &chunk.g, cat(|o| &o.g)),
        ("beta", &chunk.beta, cat(|o| &o.beta)),
    ] {
        assert_eq!(values(got), values(&want), "{what}: {name}");
    }
    assert_eq!(
        values(&chunk.conv_state),
        values(state),
        "{what}: conv state"
    );
}
