//! The CPU twin of `gdn_conv_prep` against the composed path it replaces: the device plan's
//! GDN front written with plain candle ops exactly as `GatedDeltaNet::conv`, `forward` and
//! `decay` (crates/qwen-gdn-model/src/layers/gdn.rs) and `ScaledRms` (layers/norm.rs)
//! compute it, on random inputs, with qkv, b and a as slices of one merged projection output
//! (as the model passes them), for decode steps and prefill chunks of S tokens (S < K − 1,
//! K − 1, K, many), from an existing conv state or from zeros (a first chunk): the op's cases
//! (tests/common/gdn_conv_prep.rs). Plus the twin's own consistency (a chunk gives bit for bit
//! what its tokens give one step at a time) and one test per input check.

mod common;

use candle_core::{DType, Device, Tensor, D};
use common::gdn_conv_prep::{assert_chunk_is_its_steps, cases, dims, Case, Tensors};
use common::{candle_nn_rms_norm, rel_max, values, Ty};
use gdn_ops::ops::gdn_conv_prep::{gdn_conv_prep, supports, ConvPrepDims, ConvPrepOut};

/// `x · rsqrt(mean(x²) + eps) · weight` as the model's `RmsNorm::forward`.
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Tensor {
    candle_nn_rms_norm(
        &x.contiguous().unwrap(),
        &weight.to_dtype(x.dtype()).unwrap(),
        eps,
    )
}

fn sigmoid(x: &Tensor) -> Tensor {
    (x.neg().unwrap().exp().unwrap() + 1.0)
        .unwrap()
        .recip()
        .unwrap()
}

/// `g = exp(−exp(A_log) · softplus(a + dt_bias))`: gdn.rs's `decay`.
fn decay(a: &Tensor, dt_bias: &Tensor, neg_a_log_exp: &Tensor) -> Tensor {
    let x = a.broadcast_add(dt_bias).unwrap();
    let softplus = (x.relu().unwrap()
        + (x.abs().unwrap().neg().unwrap().exp().unwrap() + 1.0)
            .unwrap()
            .log()
            .unwrap())
    .unwrap();
    softplus
        .broadcast_mul(neg_a_log_exp)
        .unwrap()
        .exp()
        .unwrap()
}

/// The composed decode front; returns its outputs and the conv state it keeps.
#[allow(clippy::too_many_arguments)]
fn composed(
    qkv: &Tensor,
    b_in: &Tensor,
    a: &Tensor,
    conv_state: &Tensor,
    taps: &Tensor,
    dt_bias: &Tensor,
    neg_a_exp: &Tensor,
    d: ConvPrepDims,
) -> (ConvPrepOut, Tensor) {
    let (hk, hv, dk, dv, k) = (
        d.key_heads,
        d.value_heads,
        d.key_dim,
        d.value_dim,
        d.kernel_size,
    );
    let (b, s, _) = qkv.dims3().unwrap();
    // GatedDeltaNet::conv.
    let padded = Tensor::cat(&[conv_state, qkv], 1).unwrap();
    let kept = padded.narrow(1, s, k - 1).unwrap().contiguous().unwrap();
    let w = taps.to_dtype(qkv.dtype()).unwrap();
    let conv = if s == 1 {
        padded.broadcast_mul(&w).unwrap().sum_keepdim(1).unwrap()
    } else {
        let tap = |m: usize| {
            padded
                .narrow(1, m, s)
                .unwrap()
                .broadcast_mul(&w.narrow(0, m, 1).unwrap())
                .unwrap()
        };
        (1..k).fold(tap(0), |acc, m| (acc + tap(m)).unwrap())
    };
    // GatedDeltaNet::forward.
    let conv = conv.silu().unwrap();
    let head = |start: usize, len: usize, heads: usize, dim: usize| {
        conv.narrow(D::Minus1, start, len)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape((b, s, heads, dim))
            .unwrap()
    };
    let q = head(0, hk * dk, hk, dk);
    let kk = head(hk * dk, hk * dk, hk, dk);
    let v = head(2 * hk * dk, hv * dv, hv, dv);
    // ScaledRms::new: a constant weight, stored in the activation dtype on the device.
    let scaled = |dim: usize, scale: f64| {
        Tensor::full(scale as f32, dim, &Device::Cpu)
            .unwrap()
            .to_dtype(qkv.dtype())
            .unwrap()
    };
    let q = rms_norm(&q, &scaled(dk, 1.0 / dk as f64), 1e-6);
    let kk = rms_norm(&kk, &scaled(dk, (dk as f64).powf(-0.5)), 1e-6);
    let beta = sigmoid(&b_in.to_dtype(DType::F32).unwrap());
    let g = decay(&a.to_dtype(DType::F32).unwrap(), dt_bias, neg_a_exp);
    (
        ConvPrepOut {
            q,
            k: kk,
            v,
            g,
            beta,
            conv_state: kept.clone(),
        },
        kept,
    )
}

/// The twin against the composed ops on case `i` of the op's cases, at `ty`.
fn compare(i: usize, c: &Case, ty: Ty, tol: f32) {
    let (d, batch, tokens, with_state) = (c.dims, c.batch, c.tokens, c.with_state);
    let dtype = ty.dtype();
    let s = Tensors::of_case(i, c, ty);
    let [qkv, b, a] = s.views(&Device::Cpu);
    assert!(
        batch * tokens == 1 || !qkv.is_contiguous(),
        "the test means to pass views"
    );
    let state = s.state.copy().unwrap();
    let got = gdn_conv_prep(&qkv, &b, &a, &state, &s.taps, &s.dt_bias, &s.neg_a_exp, d).unwrap();
    let (want, kept) = composed(&qkv, &b, &a, &s.state, &s.taps, &s.dt_bias, &s.neg_a_exp, d);
    let what = format!("{d:?} B{batch} S{tokens} {dtype:?} state {with_state}");
    // The new state only holds moved values: exact.
    assert_eq!(values(&got.conv_state), values(&kept), "{what}: conv state");
    assert_eq!(got.conv_state.dtype(), dtype);
    if tokens == 1 {
        // A decode step advances the state in place.
        assert_eq!(values(&state), values(&kept), "{what}: state in place");
    } else {
        // A chunk leaves the caller's state as it was.
        assert_eq!(values(&state), values(&s.state), "{what}: old state kept");
    }
    for (name, g, w) in [
        ("q", &got.q, &want.q),
        ("k", &got.k, &want.k),
        ("v", &got.v, &want.v),
        ("g", &got.g, &want.g),
        ("beta", &got.beta, &want.beta),
    ] {
        let e = rel_max(g, w);
        let expected_dtype = if matches!(name, "g" | "beta") {
            DType::F32
        } else {
            dtype
        };
        assert_eq!(g.dtype(), expected_dtype, "{what}: {name} dtype");
        assert!(g.is_contiguous(), "{what}: {name} must be contiguous");
        assert!(
            e <= tol,
            "{what}: {name} off by {e:e} of max|ref| (tol {tol:e})"
        );
    }
}

/// The op's decode steps (S = 1) or prefill chunks.
fn cases_of(chunks: bool) -> impl Iterator<Item = (usize, Case)> {
    cases()
        .into_iter()
        .enumerate()
        .filter(move |(_, c)| (c.tokens > 1) == chunks)
}

#[test]
fn twin_matches_the_composed_path_in_f32() {
    for (i, c) in cases_of(false) {
        compare(i, &c, Ty::F32, 1e-5);
    }
}

#[test]
fn twin_matches_the_composed_path_in_bf16() {
    // The composed path rounds the conv before the SiLU and each tap product; the twin
    // rounds once: bf16 tolerance.
    for (i, c) in cases_of(false) {
        compare(i, &c, Ty::Bf16, 2e-2);
    }
}

#[test]
fn twin_matches_the_composed_path_on_prefill_chunks_in_f32() {
    for (i, c) in cases_of(true) {
        compare(i, &c, Ty::F32, 1e-5);
    }
}

#[test]
fn twin_matches_the_composed_path_on_prefill_chunks_in_bf16_and_f16() {
    for (i, c) in cases_of(true) {
        compare(i, &c, Ty::Bf16, 2e-2);
        compare(i, &c, Ty::F16, 3e-3);
    }
}

/// Runs the twin on `tokens` rows starting at `start` of every batch row of `s`'s views.
fn run_rows(s: &Tensors, start: usize, tokens: usize, state: &Tensor) -> ConvPrepOut {
    s.run(&Device::Cpu, start, tokens, state)
}

#[test]
fn twin_prefill_gives_its_decode_steps_bit_for_bit() {
    for (d, ty) in [
        (dims(2, 32, 4, 64, 4), Ty::F32),
        (dims(2, 32, 4, 64, 4), Ty::Bf16),
        (dims(1, 64, 2, 32, 8), Ty::F16),
    ] {
        let tokens = 11;
        let s = Tensors::random(d, 2, tokens, ty, 600);
        let what = format!("{d:?} {ty:?}");
        let chunk = run_rows(&s, 0, tokens, &s.state.copy().unwrap());
        // One token at a time, the state advanced in place.
        let state = s.state.copy().unwrap();
        let steps: Vec<ConvPrepOut> = (0..tokens).map(|t| run_rows(&s, t, 1, &state)).collect();
        assert_chunk_is_its_steps(&what, &chunk, &steps, &state);
        // And a chunk split in two (the second continuing from the first's state).
        let first = run_rows(&s, 0, 4, &s.state.copy().unwrap());
        let second = run_rows(&s, 4, tokens - 4, &first.conv_state);
        let joined = Tensor::cat(&[&first.q, &second.q], 1).unwrap();
        assert_eq!(values(&joined), values(&chunk.q), "{what}: split q");
        assert_eq!(
            values(&second.conv_state),
            values(&chunk.conv_state),
            "{what}: split state"
        );
    }
}

#[test]
fn an_empty_chunk_returns_empty_outputs_and_keeps_the_state() {
    let d = dims(2, 32, 4, 32, 4);
    let s = Tensors::random(d, 2, 3, Ty::F32, 700);
    let state = s.state.copy().unwrap();
    let before = values(&state);
    let launches = gdn_ops::launches::count();
    let out = run_rows(&s, 1, 0, &state);
    assert_eq!(gdn_ops::launches::count(), launches, "nothing launched");
    assert_eq!(out.q.dims(), [2, 0, 2, 32]);
    assert_eq!(out.k.dims(), [2, 0, 2, 32]);
    assert_eq!(out.v.dims(), [2, 0, 4, 32]);
    assert_eq!(out.g.dims(), [2, 0, 4]);
    assert_eq!(out.beta.dims(), [2, 0, 4]);
    assert_eq!(values(&out.conv_state), before);
    assert_eq!(values(&state), before);
}

#[test]
fn twin_takes_contiguous_and_three_dim_inputs_alike() {
    let d = dims(2, 32, 4, 32, 4);
    let s = Tensors::random(d, 2, 1, Ty::F32, 7);
    let [qkv, b, a] = s.views(&Device::Cpu);
    let run = |qkv: &Tensor, b: &Tensor, a: &Tensor| {
        let st = s.state.copy().unwrap();
        let o = gdn_conv_prep(qkv, b, a, &st, &s.taps, &s.dt_bias, &s.neg_a_exp, d).unwrap();
        [o.q, o.k, o.v, o.g, o.beta, o.conv_state, st].map(|t| values(&t))
    };
    let flat = |t: &Tensor| t.contiguous().unwrap().squeeze(1).unwrap();
    assert_eq!(run(&qkv, &b, &a), run(&flat(&qkv), &flat(&b), &flat(&a)));
}

#[test]
fn supports_the_release_shapes_only_where_the_kernels_do() {
    assert!(supports(&dims(16, 128, 32, 128, 4), DType::BF16));
    assert!(supports(&dims(16, 128, 64, 128, 4), DType::F16));
    assert!(supports(&dims(1, 256, 1, 32, 2), DType::F32));
    assert!(supports(&dims(1, 32, 1, 32, 8), DType::F32));
    assert!(!supports(&dims(16, 128, 32, 128, 4), DType::F64));
    assert!(!supports(&dims(16, 100, 32, 128, 4), DType::F32));
    assert!(!supports(&dims(16, 128, 32, 288, 4), DType::F32));
    assert!(!supports(&dims(16, 128, 32, 128, 9), DType::F32));
    assert!(!supports(&dims(16, 128, 32, 128, 1), DType::F32));
    assert!(!supports(&dims(3, 128, 32, 128, 4), DType::F32));
    assert!(!supports(&dims(0, 128, 32, 128, 4), DType::F32));
}

/// Runs the op on random inputs changed by `edit`, and returns its error.
fn error_with(edit: impl FnOnce(&mut [Tensor; 7], &mut ConvPrepDims)) -> String {
    let mut d = dims(2, 32, 4, 32, 4);
    let s = Tensors::random(d, 2, 1, Ty::F32, 9);
    let [qkv, b, a] = s.views(&Device::Cpu);
    let mut t = [
        qkv,
        b,
        a,
        s.state.clone(),
        s.taps.clone(),
        s.dt_bias.clone(),
        s.neg_a_exp.clone(),
    ];
    edit(&mut t, &mut d);
    let [qkv, b, a, state, taps, dt_bias, neg_a_exp] = &t;
    gdn_conv_prep(qkv, b, a, state, taps, dt_bias, neg_a_exp, d)
        .expect_err("the op must reject this")
        .to_string()
}

fn assert_error(edit: impl FnOnce(&mut [Tensor; 7], &mut ConvPrepDims), needle: &str) {
    let e = error_with(edit);
    assert!(e.contains(needle), "error `{e}` should mention `{needle}`");
    assert!(!e.contains('\n'), "one-line errors: `{e}`");
}

#[test]
fn rejects_value_heads_not_a_multiple_of_key_heads() {
    assert_error(|_, d| d.key_heads = 3, "not a multiple of 3 key heads");
}

#[test]
fn rejects_zero_dims() {
    assert_error(|_, d| d.key_dim = 0, "must be positive");
}

#[test]
fn rejects_fewer_than_two_taps() {
    assert_error(|_, d| d.kernel_size = 1, "at least 2 taps");
}

#[test]
fn rejects_unsupported_activation_dtypes() {
    assert_error(
        |t, _| t[0] = t[0].to_dtype(DType::F64).unwrap(),
        "must be f32, f16 or bf16",
    );
}

#[test]
fn rejects_a_conv_state_of_the_wrong_shape() {
    assert_error(|t, _| t[3] = t[3].narrow(1, 0, 2).unwrap(), "conv_state");
    assert_error(
        |t, _| t[3] = t[3].flatten_all().unwrap(),
        "must be [B, K-1, C]",
    );
}

#[test]
fn rejects_a_strided_conv_state() {
    assert_error(
        |t, _| {
            let s = &t[3];
            t[3] = Tensor::cat(&[s, s], 2)
                .unwrap()
                .narrow(2, 0, s.dim(2).unwrap())
                .unwrap();
        },
        "conv_state must be contiguous",
    );
}

#[test]
fn rejects_taps_of_the_wrong_shape() {
    assert_error(|t, _| t[4] = t[4].narrow(0, 0, 3).unwrap(), "taps");
}

#[test]
fn rejects_mixed_activation_dtypes() {
    assert_error(
        |t, _| t[1] = t[1].to_dtype(DType::BF16).unwrap(),
        "b is BF16",
    );
    assert_error(
        |t, _| t[3] = t[3].to_dtype(DType::F16).unwrap(),
        "conv_state is F16",
    );
}

#[test]
fn rejects_decay_parameters_not_f32_hv() {
    assert_error(
        |t, _| t[5] = t[5].to_dtype(DType::BF16).unwrap(),
        "dt_bias must be a contiguous f32",
    );
    assert_error(
        |t, _| t[6] = t[6].narrow(0, 0, 3).unwrap(),
        "neg_a_exp must be a contiguous f32",
    );
}

#[test]
fn rejects_qkv_rows_that_are_not_contiguous() {
    // [B, 1, C] read with a stride of 2 inside each row.
    assert_error(
        |t, d| {
            let c = d.channels();
            let wide = Tensor::zeros((2, 1, c, 2), DType::F32, &Device::Cpu).unwrap();
            t[0] = wide.narrow(3, 0, 1).unwrap().squeeze(3).unwrap();
        },
        "must be contiguous",
    );
}

#[test]
fn rejects_inputs_of_another_batch_or_width() {
    assert_error(
        |t, _| t[0] = t[0].narrow(0, 0, 1).unwrap(),
        "qkv [1, 1, 256], expected [2, S, 256]",
    );
    assert_error(|t, _| t[2] = t[2].narrow(2, 0, 3).unwrap(), "a [2, 1, 3]");
}

#[test]
fn rejects_b_or_a_of_another_chunk_length() {
    // qkv of 2 tokens, b of 1.
    assert_error(
        |t, _| t[0] = Tensor::cat(&[&t[0], &t[0]], 1).unwrap(),
        "b [2, 1, 4]: expected dims [2, 2]",
    );
}
