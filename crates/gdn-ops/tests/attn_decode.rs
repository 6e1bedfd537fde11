//! The CPU twin of `attn_decode` against the composed path it replaces in the model (`attend`
//! of crates/qwen-gdn-model's attention layer for one query over views of the KV buffers,
//! then the `sigmoid(gate)` product) over the op's cases (tests/common/attn_decode.rs), and its
//! input checks.

mod common;

use candle_core::{DType, Device, Tensor};
use common::attn_decode::{cases, inputs, seed, Shape, EMULATION_MAX_WORK};
use common::{max_rel, Ty};
use gdn_ops::ops::attn_decode::{attn_decode, supports};

/// `attend(q, k, v, offset)` for S = 1 (no mask), as the model computes it, then
/// `o · sigmoid(gate)`: `[B, 1, Nq·Dh]`.
fn composed(q: &Tensor, gate: &Tensor, keys: &Tensor, values: &Tensor, pos: usize) -> Tensor {
    let (b, nq, dh) = q.dims3().unwrap();
    let nkv = keys.dim(1).unwrap();
    let rep = nq / nkv;
    let k = keys.narrow(2, 0, pos + 1).unwrap();
    let v = values.narrow(2, 0, pos + 1).unwrap();
    let q = q.reshape((b, nkv, rep, dh)).unwrap();
    let scores = (q.matmul(&k.t().unwrap()).unwrap() * (dh as f64).powf(-0.5)).unwrap();
    let p = candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32).unwrap())
        .unwrap()
        .to_dtype(v.dtype())
        .unwrap();
    let o = p
        .matmul(&v.contiguous().unwrap())
        .unwrap()
        .reshape((b, 1, nq * dh))
        .unwrap();
    let g = candle_nn::ops::sigmoid(&gate.reshape((b, 1, nq * dh)).unwrap()).unwrap();
    (o * g).unwrap()
}

fn compare(i: usize, s: Shape, ty: Ty, tol: f32) {
    let [q, gate, keys, vals] = inputs(s, ty, seed(i, ty)).tensors(s, ty);
    let pos_t = Tensor::new(&[s.pos as u32], &Device::Cpu).unwrap();
    let got = attn_decode(&q, &gate, &keys, &vals, &pos_t).unwrap();
    let want = composed(&q, &gate, &keys, &vals, s.pos);
    assert_eq!(got.dims(), want.dims());
    let err = max_rel(&got, &want);
    assert!(err <= tol, "{ty:?} {s:?} pos {}: off by {err}", s.pos);
}

/// The op's cases the composed path can run: it reads keys `0..=pos`, so a position past the
/// buffer (which the op clamps) is not one of them, nor the long contexts (the CUDA test's).
fn composed_cases() -> impl Iterator<Item = (usize, Shape)> {
    cases()
        .into_iter()
        .enumerate()
        .filter(|(_, s)| s.pos < s.capacity && s.work() <= EMULATION_MAX_WORK)
}

#[test]
fn twin_matches_the_composed_path_in_f32() {
    for (i, s) in composed_cases() {
        compare(i, s, Ty::F32, 1e-5);
    }
}

#[test]
fn twin_matches_the_composed_path_in_bf16_and_f16() {
    for ty in [Ty::Bf16, Ty::F16] {
        for (i, s) in composed_cases() {
            compare(i, s, ty, 2e-2);
        }
    }
}

#[test]
fn supports_covers_the_kernels() {
    for dh in [64, 128, 256] {
        for (nq, nkv) in [(16, 2), (16, 16), (16, 1), (3, 1)] {
            assert!(supports(dh, nq, nkv, DType::BF16));
        }
    }
    assert!(!supports(80, 16, 2, DType::F32));
    assert!(!supports(512, 16, 2, DType::F32));
    assert!(!supports(128, 6, 4, DType::F32));
    assert!(!supports(128, 16, 2, DType::F64));
}

#[test]
fn input_checks() {
    let dev = &Device::Cpu;
    let z = |shape: &[usize], dtype| Tensor::zeros(shape, dtype, dev).unwrap();
    let (q, gate) = (z(&[1, 4, 64], DType::F32), z(&[1, 256], DType::F32));
    let kv = z(&[1, 2, 8, 64], DType::F32);
    let pos = Tensor::new(&[3u32], dev).unwrap();
    let run = |q: &Tensor, gate: &Tensor, keys: &Tensor, vals: &Tensor, pos: &Tensor| {
        attn_decode(q, gate, keys, vals, pos)
            .unwrap_err()
            .to_string()
    };
    let e = run(&z(&[4, 64], DType::F32), &gate, &kv, &kv, &pos);
    assert!(e.contains("expected [B, Nq, Dh]"), "{e}");
    let e = run(&q, &gate, &z(&[2, 8, 64], DType::F32), &kv, &pos);
    assert!(e.contains("expected [B, Nkv, cap, Dh]"), "{e}");
    let e = run(&q, &gate, &z(&[1, 2, 8, 32], DType::F32), &kv, &pos);
    assert!(e.contains("do not match q"), "{e}");
    let e = run(&q, &gate, &kv, &z(&[1, 2, 4, 64], DType::F32), &pos);
    assert!(e.contains("must match keys"), "{e}");
    let strided = z(&[1, 2, 64, 8], DType::F32).transpose(2, 3).unwrap();
    let e = run(&q, &gate, &strided, &strided, &pos);
    assert!(e.contains("contiguous"), "{e}");
    let e = run(&q, &z(&[1, 128], DType::F32), &kv, &kv, &pos);
    assert!(e.contains("gate [1, 128], expected [1, 256]"), "{e}");
    let e = run(&q, &z(&[1, 256], DType::BF16), &kv, &kv, &pos);
    assert!(e.contains("gate is BF16"), "{e}");
    let e = run(
        &z(&[1, 3, 64], DType::F32),
        &z(&[1, 192], DType::F32),
        &kv,
        &kv,
        &pos,
    );
    assert!(e.contains("no kernel"), "{e}");
    let e = run(&q, &gate, &kv, &kv, &Tensor::new(&[3u32, 4], dev).unwrap());
    assert!(e.contains("pos must be a [1] u32"), "{e}");
    let e = run(
        &q,
        &gate,
        &z(&[1, 2, 0, 64], DType::F32),
        &z(&[1, 2, 0, 64], DType::F32),
        &pos,
    );
    assert!(e.contains("empty KV buffers"), "{e}");
}
