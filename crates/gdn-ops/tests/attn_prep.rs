//! The CPU twin of `attn_prep` against the composed path it replaces in the model
//! (`Attention::forward` of crates/qwen-gdn-model for one token: q/k RMSNorm, partial RoPE
//! with host tables, `KvCache::append`'s write) over the op's cases
//! (tests/common/attn_prep.rs), and its input checks.
//!
//! The model's tables take angles in f64; the twin (like MLX and the kernels) in f32. The
//! twin is held to the composed path fed f32 angles, and, separately, to the f64 one within
//! the angle's f32 rounding at positions below 4096.

mod common;

use candle_core::{DType, Device, Tensor, D};
use common::attn_prep::{cases, seed, shape, Shape};
use common::{tensor, values, Rng, Ty};
use gdn_ops::ops::attn_prep::{attn_prep, supports};

const THETA: f64 = 10_000_000.0;
const EPS: f32 = 1e-6;

fn inv_freq_f64(rope_dims: usize) -> Vec<f64> {
    (0..rope_dims / 2)
        .map(|i| THETA.powf(-((2 * i) as f64) / rope_dims as f64))
        .collect()
}

/// cos and sin `[1, R/2]` in `dtype` for position `pos`: angles in f32 (`f32_angles`) or f64
/// (the model's `PartialRope::tables`).
fn tables(rope_dims: usize, pos: usize, f32_angles: bool, dtype: DType) -> (Tensor, Tensor) {
    let (mut cos, mut sin) = (vec![], vec![]);
    for f in inv_freq_f64(rope_dims) {
        let angle = if f32_angles {
            (pos as f32 * f as f32) as f64
        } else {
            pos as f64 * f
        };
        cos.push(angle.cos() as f32);
        sin.push(angle.sin() as f32);
    }
    let place = |v: Vec<f32>| {
        Tensor::from_vec(v, (1, rope_dims / 2), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    (place(cos), place(sin))
}

/// `PartialRope::forward` for `x` `[B, H, 1, Dh]`.
fn rope(x: &Tensor, rope_dims: usize, cos: &Tensor, sin: &Tensor) -> Tensor {
    let head_dim = x.dim(D::Minus1).unwrap();
    let rotated = candle_nn::rotary_emb::rope(
        &x.narrow(D::Minus1, 0, rope_dims)
            .unwrap()
            .contiguous()
            .unwrap(),
        cos,
        sin,
    )
    .unwrap();
    if rope_dims == head_dim {
        return rotated;
    }
    let pass = x
        .narrow(D::Minus1, rope_dims, head_dim - rope_dims)
        .unwrap();
    Tensor::cat(&[&rotated, &pass], D::Minus1).unwrap()
}

/// `Attention::forward` up to the cache append, for one token per sequence; writes the KV
/// buffers in place and returns `(q [B, Nq, Dh], gate [B, Nq·Dh])`.
#[allow(clippy::too_many_arguments)]
fn composed(
    s: Shape,
    qkv: &Tensor,
    q_norm: &Tensor,
    k_norm: &Tensor,
    pos: usize,
    f32_angles: bool,
    keys: &Tensor,
    values: &Tensor,
) -> (Tensor, Tensor) {
    let (b, nq, nkv, dh) = (s.batch, s.q_heads, s.kv_heads, s.head_dim);
    let x = qkv.reshape((b, 1, ())).unwrap();
    let qg = x
        .narrow(2, 0, 2 * nq * dh)
        .unwrap()
        .reshape((b, 1, nq, 2 * dh))
        .unwrap();
    let k = x.narrow(2, 2 * nq * dh, nkv * dh).unwrap();
    let v = x.narrow(2, (2 * nq + nkv) * dh, nkv * dh).unwrap();
    let q = qg.narrow(D::Minus1, 0, dh).unwrap().contiguous().unwrap();
    let gate = qg
        .narrow(D::Minus1, dh, dh)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((b, nq * dh))
        .unwrap();
    let q = candle_nn::ops::rms_norm(&q, q_norm, EPS)
        .unwrap()
        .transpose(1, 2)
        .unwrap();
    let k = k.contiguous().unwrap().reshape((b, 1, nkv, dh)).unwrap();
    let k = candle_nn::ops::rms_norm(&k, k_norm, EPS)
        .unwrap()
        .transpose(1, 2)
        .unwrap();
    let v = v
        .contiguous()
        .unwrap()
        .reshape((b, 1, nkv, dh))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap();
    let (cos, sin) = tables(s.rope_dims, pos, f32_angles, qkv.dtype());
    let q = rope(&q, s.rope_dims, &cos, &sin);
    let k = rope(&k, s.rope_dims, &cos, &sin);
    keys.slice_set(&k.contiguous().unwrap(), 2, pos).unwrap();
    values.slice_set(&v, 2, pos).unwrap();
    (q.reshape((b, nq, dh)).unwrap(), gate)
}

struct Inputs {
    qkv: Tensor,
    q_norm: Tensor,
    k_norm: Tensor,
    kv: Vec<f32>,
}

fn inputs(s: Shape, ty: Ty, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let width = (2 * s.q_heads + 2 * s.kv_heads) * s.head_dim;
    Inputs {
        qkv: tensor(
            &rng.values(s.batch * width, -3.0, 3.0, ty),
            &[s.batch, width],
            ty,
        ),
        q_norm: tensor(&rng.values(s.head_dim, 0.5, 1.5, ty), &[s.head_dim], ty),
        k_norm: tensor(&rng.values(s.head_dim, 0.5, 1.5, ty), &[s.head_dim], ty),
        kv: rng.values(
            s.batch * s.kv_heads * s.capacity * s.head_dim,
            -1.0,
            1.0,
            ty,
        ),
    }
}

fn max_rel(got: &Tensor, want: &Tensor) -> f32 {
    let (g, w) = (values(got), values(want));
    assert_eq!(g.len(), w.len());
    let scale = w.iter().fold(0f32, |m, x| m.max(x.abs()));
    g.iter()
        .zip(&w)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

/// The largest relative difference over q, gate, keys and values between the twin and the
/// composed path.
fn difference(s: Shape, ty: Ty, pos: usize, f32_angles: bool, seed: u64) -> f32 {
    let x = inputs(s, ty, seed);
    let kv_shape = [s.batch, s.kv_heads, s.capacity, s.head_dim];
    let buffers = || {
        (
            tensor(&x.kv, &kv_shape, ty),
            tensor(&x.kv, &kv_shape, ty).affine(-1.0, 0.0).unwrap(),
        )
    };
    let (keys, vals) = buffers();
    let freqs: Vec<f32> = inv_freq_f64(s.rope_dims)
        .iter()
        .map(|&f| f as f32)
        .collect();
    let (q, gate) = attn_prep(
        &x.qkv,
        &x.q_norm,
        &x.k_norm,
        EPS,
        &Tensor::new(freqs.as_slice(), &Device::Cpu).unwrap(),
        &Tensor::new(&[pos as u32], &Device::Cpu).unwrap(),
        &keys,
        &vals,
    )
    .unwrap();
    let (want_keys, want_vals) = buffers();
    let (want_q, want_gate) = composed(
        s, &x.qkv, &x.q_norm, &x.k_norm, pos, f32_angles, &want_keys, &want_vals,
    );
    [
        max_rel(&q, &want_q),
        max_rel(&gate, &want_gate),
        max_rel(&keys, &want_keys),
        max_rel(&vals, &want_vals),
    ]
    .into_iter()
    .fold(0f32, f32::max)
}

const QWEN3_NEXT: Shape = shape(1, 16, 2, 256, 64, 512, 0);

const SMALL: Shape = shape(3, 4, 2, 64, 64, 16, 7);

/// The op's cases the composed path can run: it writes the KV buffers at `pos`, so not those
/// past the buffers (a test of their own below).
fn composed_cases() -> impl Iterator<Item = (usize, Shape)> {
    cases()
        .into_iter()
        .enumerate()
        .filter(|(_, s)| s.pos < s.capacity)
}

#[test]
fn twin_matches_the_composed_path_in_f32() {
    for (i, s) in composed_cases() {
        let err = difference(s, Ty::F32, s.pos, true, seed(i, Ty::F32));
        assert!(err <= 1e-5, "{s:?}: off by {err}");
    }
}

#[test]
fn twin_matches_the_composed_path_in_bf16_and_f16() {
    for ty in [Ty::Bf16, Ty::F16] {
        for (i, s) in composed_cases() {
            let err = difference(s, ty, s.pos, true, seed(i, ty));
            assert!(err <= 2e-2, "{ty:?} {s:?}: off by {err}");
        }
    }
}

/// f32 angles lose up to half an f32 ulp of `pos · inv_freq` (2.4e-4 rad at 4095 for the
/// fastest frequency, 1): the twin stays within 1e-3 of the model's f64-angle tables.
#[test]
fn f32_angles_stay_close_to_the_f64_tables_below_4096() {
    let s = Shape {
        capacity: 4096,
        ..QWEN3_NEXT
    };
    for pos in [1000, 2047, 4095] {
        let err = difference(s, Ty::F32, pos, false, pos as u64);
        assert!(err <= 1e-3, "pos {pos}: off by {err}");
    }
}

#[test]
fn a_position_past_the_buffers_writes_nothing() {
    let s = SMALL;
    let x = inputs(s, Ty::F32, 9);
    let kv_shape = [s.batch, s.kv_heads, s.capacity, s.head_dim];
    let keys = tensor(&x.kv, &kv_shape, Ty::F32);
    let before = values(&keys);
    let freqs = Tensor::zeros(s.rope_dims / 2, DType::F32, &Device::Cpu).unwrap();
    let pos = Tensor::new(&[s.capacity as u32], &Device::Cpu).unwrap();
    attn_prep(
        &x.qkv,
        &x.q_norm,
        &x.k_norm,
        EPS,
        &freqs,
        &pos,
        &keys,
        &keys.copy().unwrap(),
    )
    .unwrap();
    assert_eq!(values(&keys), before);
}

#[test]
fn supports_covers_the_kernels() {
    assert!(supports(256, 64, DType::BF16));
    assert!(supports(128, 128, DType::F16));
    assert!(supports(96, 0, DType::F32));
    assert!(!supports(256, 63, DType::F32));
    assert!(!supports(64, 128, DType::F32));
    assert!(!supports(1024, 64, DType::F32));
    assert!(!supports(256, 64, DType::F64));
}

#[test]
fn input_checks() {
    let dev = &Device::Cpu;
    let z = |shape: &[usize], dtype| Tensor::zeros(shape, dtype, dev).unwrap();
    let (qkv, w) = (z(&[1, 12 * 64], DType::F32), z(&[64], DType::F32));
    let (freqs, pos) = (z(&[16], DType::F32), Tensor::new(&[0u32], dev).unwrap());
    let kv = z(&[1, 2, 8, 64], DType::F32);
    let run =
        |qkv: &Tensor, w: &Tensor, freqs: &Tensor, pos: &Tensor, keys: &Tensor, vals: &Tensor| {
            attn_prep(qkv, w, w, EPS, freqs, pos, keys, vals)
                .unwrap_err()
                .to_string()
        };
    let e = run(&qkv, &w, &freqs, &pos, &z(&[2, 8, 64], DType::F32), &kv);
    assert!(e.contains("expected [B, Nkv, cap, Dh]"), "{e}");
    let e = run(&qkv, &w, &freqs, &pos, &kv, &z(&[1, 2, 4, 64], DType::F32));
    assert!(e.contains("must match keys"), "{e}");
    let strided = z(&[1, 2, 64, 8], DType::F32).transpose(2, 3).unwrap();
    let e = run(&qkv, &w, &freqs, &pos, &strided, &strided);
    assert!(e.contains("contiguous"), "{e}");
    let e = run(&z(&[1, 11 * 64], DType::F32), &w, &freqs, &pos, &kv, &kv);
    assert!(e.contains("are not 2·Nq"), "{e}");
    let e = run(&z(&[1, 14 * 64], DType::F32), &w, &freqs, &pos, &kv, &kv);
    assert!(e.contains("not a multiple of 2 KV heads"), "{e}");
    let e = run(&z(&[2, 12 * 64], DType::F32), &w, &freqs, &pos, &kv, &kv);
    assert!(e.contains("one token per sequence"), "{e}");
    let e = run(&z(&[1, 12 * 64], DType::BF16), &w, &freqs, &pos, &kv, &kv);
    assert!(e.contains("keys is F32, qkv BF16"), "{e}");
    let e = run(&qkv, &z(&[32], DType::F32), &freqs, &pos, &kv, &kv);
    assert!(e.contains("q_norm [32], expected [64]"), "{e}");
    let e = run(&qkv, &w, &z(&[16], DType::F16), &pos, &kv, &kv);
    assert!(e.contains("inv_freq must be"), "{e}");
    let e = run(&qkv, &w, &z(&[40], DType::F32), &pos, &kv, &kv);
    assert!(e.contains("80 rotated dims"), "{e}");
    let e = run(
        &qkv,
        &w,
        &freqs,
        &Tensor::new(&[0i64], dev).unwrap(),
        &kv,
        &kv,
    );
    assert!(e.contains("pos must be a [1] u32"), "{e}");
    let e = attn_prep(&qkv, &w, &w, f32::NAN, &freqs, &pos, &kv, &kv)
        .unwrap_err()
        .to_string();
    assert!(e.contains("eps"), "{e}");
}
