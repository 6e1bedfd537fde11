//! The CPU twin of `gated_delta_update_norm` against the two-op path it replaces: the
//! recurrence ([`gdn_ops::gated_delta_update`]) followed by the model's composed
//! `GatedRmsNorm::forward` (crates/qwen-gdn-model/src/layers/norm.rs) in plain candle ops, with
//! either gate (silu; sigmoid, `qwen4_exp`'s), over
//! the op's cases (tests/common/gated_delta_norm.rs) on random inputs, with z as a slice of a merged projection output. The state must come out
//! the same, bit for bit. Plus one test per input check.

mod common;

use candle_core::{DType, Tensor};
use common::gated_delta_norm::{cases, norm_tensors};
use common::{candle_nn_rms_norm, gated_delta, rel_max, values, Rng};
use gdn_ops::ops::gated_delta::{GdnDims, CHUNKED_MIN_STEPS};
use gdn_ops::ops::gated_delta_norm::{gated_delta_update_norm, supports, Gate};

/// `GatedRmsNorm::forward` on the recurrence's output, z made contiguous as
/// `GatedDeltaNet::forward` does.
fn gated_norm(y: &Tensor, z: &Tensor, weight: &Tensor, eps: f32, gate: Gate) -> Tensor {
    let z = z.contiguous().unwrap().reshape(y.dims()).unwrap();
    let n = candle_nn_rms_norm(y, weight, eps)
        .to_dtype(DType::F32)
        .unwrap();
    let z = z.to_dtype(DType::F32).unwrap();
    let gate = match gate {
        Gate::Silu => z.silu(),
        Gate::Sigmoid => candle_nn::ops::sigmoid(&z),
    }
    .unwrap();
    (gate * n).unwrap().to_dtype(y.dtype()).unwrap()
}

fn inputs(d: GdnDims, dtype: DType, state: DType, seed: u64) -> [Tensor; 8] {
    let common = gated_delta::GdnDims::new(
        d.batch,
        d.steps,
        d.key_heads,
        d.value_heads,
        d.key_dim,
        d.value_dim,
    );
    norm_tensors(&mut Rng::new(seed), common, dtype, state)
}

fn dims(b: usize, t: usize, hk: usize, hv: usize, dk: usize, dv: usize) -> GdnDims {
    GdnDims {
        batch: b,
        steps: t,
        key_heads: hk,
        value_heads: hv,
        key_dim: dk,
        value_dim: dv,
    }
}

fn compare(d: GdnDims, dtype: DType, st: DType, gate: Gate, tol: f32, seed: u64) {
    let [q, k, v, g, beta, state, proj, w] = inputs(d, dtype, st, seed);
    let z = proj
        .narrow(
            2,
            d.value_heads * d.value_dim + 5,
            d.value_heads * d.value_dim,
        )
        .unwrap();
    let fused_state = state.copy().unwrap();
    let got =
        gated_delta_update_norm(&q, &k, &v, &g, &beta, &fused_state, &z, &w, 1e-6, gate).unwrap();
    let two_op_state = state.copy().unwrap();
    let y = gdn_ops::gated_delta_update(&q, &k, &v, &g, &beta, &two_op_state).unwrap();
    let want = gated_norm(&y, &z, &w, 1e-6, gate);
    let what = format!("{d:?} {dtype:?}/{st:?} {gate:?}");
    assert_eq!(values(&fused_state), values(&two_op_state), "{what}: state");
    assert_eq!(got.dtype(), dtype);
    let e = rel_max(&got, &want);
    assert!(e <= tol, "{what}: off by {e:e} of max|ref| (tol {tol:e})");
}

/// Every case at f32 activations (f32 and bf16 state) to 1e-5, and at bf16 activations to
/// 2e-2, with each gate; but those of [`CHUNKED_MIN_STEPS`] tokens or more, for which the
/// two-op path takes the chunked form, whose state is not the recurrence's bit for bit.
#[test]
fn twin_matches_the_two_op_path() {
    for (i, c) in cases().iter().enumerate() {
        if c.d.t >= CHUNKED_MIN_STEPS {
            continue;
        }
        let g = c.d;
        let d = dims(g.b, g.t, g.hk, g.hv, g.dk, g.dv);
        for gate in [Gate::Silu, Gate::Sigmoid] {
            let seed = 1 + 4 * i as u64;
            compare(d, DType::F32, DType::F32, gate, 1e-5, seed);
            compare(d, DType::F32, DType::BF16, gate, 1e-5, seed + 1);
            compare(d, DType::BF16, DType::F32, gate, 2e-2, seed + 2);
            compare(d, DType::BF16, DType::BF16, gate, 2e-2, seed + 3);
        }
    }
}

#[test]
fn supports_the_release_shapes_only_where_the_kernels_do() {
    let d = dims(1, 1, 16, 32, 128, 128);
    assert!(supports(&d, DType::BF16, DType::F32));
    assert!(supports(&d, DType::F16, DType::BF16));
    assert!(!supports(&d, DType::BF16, DType::F16));
    assert!(!supports(&d, DType::F64, DType::F32));
    assert!(!supports(
        &dims(1, 1, 16, 32, 100, 128),
        DType::F32,
        DType::F32
    ));
    assert!(!supports(
        &dims(1, 1, 16, 32, 128, 257),
        DType::F32,
        DType::F32
    ));
    assert!(!supports(
        &dims(1, 1, 3, 32, 128, 128),
        DType::F32,
        DType::F32
    ));
}

fn error_with(edit: impl FnOnce(&mut [Tensor; 8])) -> String {
    let d = dims(2, 2, 2, 4, 32, 32);
    let mut t = inputs(d, DType::F32, DType::F32, 9);
    t[6] = t[6].narrow(2, 0, 4 * 32).unwrap();
    edit(&mut t);
    let [q, k, v, g, beta, state, z, w] = &t;
    gated_delta_update_norm(q, k, v, g, beta, state, z, w, 1e-6, Gate::Silu)
        .expect_err("the op must reject this")
        .to_string()
}

fn assert_error(edit: impl FnOnce(&mut [Tensor; 8]), needle: &str) {
    let e = error_with(edit);
    assert!(e.contains(needle), "error `{e}` should mention `{needle}`");
    assert!(!e.contains('\n'), "one-line errors: `{e}`");
}

#[test]
fn rejects_what_the_recurrence_rejects() {
    assert_error(
        |t| t[1] = t[1].narrow(3, 0, 16).unwrap(),
        "k [2, 2, 2, 16] must match q",
    );
    assert_error(
        |t| t[5] = t[5].narrow(1, 0, 2).unwrap(),
        "state [2, 2, 32, 32], expected",
    );
}

#[test]
fn rejects_unsupported_activation_dtypes() {
    assert_error(
        |t| {
            for x in [0, 1, 2, 6, 7] {
                t[x] = t[x].to_dtype(DType::F64).unwrap();
            }
        },
        "activations must be f32, f16 or bf16",
    );
}

#[test]
fn rejects_mixed_activation_dtypes() {
    assert_error(|t| t[2] = t[2].to_dtype(DType::BF16).unwrap(), "v is BF16");
    assert_error(|t| t[6] = t[6].to_dtype(DType::F16).unwrap(), "z is F16");
}

#[test]
fn rejects_gates_that_are_not_f32() {
    assert_error(
        |t| t[3] = t[3].to_dtype(DType::BF16).unwrap(),
        "g must be f32",
    );
}

#[test]
fn rejects_a_state_of_another_dtype_or_strided() {
    assert_error(
        |t| t[5] = t[5].to_dtype(DType::F16).unwrap(),
        "the state must be f32 or bf16",
    );
    assert_error(
        |t| t[5] = t[5].transpose(2, 3).unwrap(),
        "the state must be contiguous",
    );
}

#[test]
fn rejects_a_weight_of_the_wrong_length() {
    assert_error(|t| t[7] = t[7].narrow(0, 0, 16).unwrap(), "weight [16]");
}

#[test]
fn rejects_z_of_another_shape() {
    assert_error(|t| t[6] = t[6].narrow(2, 0, 64).unwrap(), "z [2, 2, 64]");
}

#[test]
fn rejects_a_negative_eps() {
    let d = dims(1, 1, 1, 1, 32, 32);
    let [q, k, v, g, beta, state, proj, w] = inputs(d, DType::F32, DType::F32, 10);
    let z = proj.narrow(2, 0, 32).unwrap();
    let e = gated_delta_update_norm(&q, &k, &v, &g, &beta, &state, &z, &w, f32::NAN, Gate::Silu)
        .expect_err("the op must reject this")
        .to_string();
    assert!(e.contains("eps must be finite"), "{e}");
}
