//! `AffineTensor::gather_swiglu`'s CPU twin against the composed path of the model's device
//! plan (moe.rs `routed_on_device`): `gather_matmul_t` of separate gate and up stacks, then
//! `silu(gate) · up` with candle ops, over the affine family's SwiGLU cases
//! (tests/common/affine.rs); plus one test per input check.

mod common;

use candle_core::{DType, Device, Tensor};
use common::affine::{self, Kind};
use common::{max_rel, random_matrix, Rng};
use gdn_ops::ops::affine::{AffineMatrix, AffineTensor, GATHER_MAX_TOKENS};

/// `(gate_up [E, 2·Im, H], gate [E, Im, H], up [E, Im, H])` on the CPU: a stacked matrix and
/// its gate and up rows apart.
fn split(m: &AffineMatrix, im: usize) -> [AffineTensor; 3] {
    let gate = m.select_rows(&(0..im).collect::<Vec<_>>());
    let up = m.select_rows(&(im..2 * im).collect::<Vec<_>>());
    [m, &gate, &up].map(|m| AffineTensor::upload(m, &Device::Cpu).unwrap())
}

/// [`split`] of a random `[experts, 2·im, h]` matrix with bf16 scales.
fn stacks(
    experts: usize,
    im: usize,
    h: usize,
    bits: usize,
    gs: usize,
    seed: u64,
) -> [AffineTensor; 3] {
    let m = random_matrix(
        &mut Rng::new(seed),
        bits,
        gs,
        [experts, 2 * im, h],
        DType::BF16,
    );
    split(&m, im)
}

/// The family's SwiGLU cases (tests/common/affine.rs).
#[test]
fn twin_matches_the_composed_products() {
    for (i, c) in affine::cases_of(Kind::Swiglu) {
        let dtype = c.x.dtype();
        let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
        let (experts, im, h, bits, tokens) = (c.experts, c.rows / 2, c.cols, c.bits, c.tokens);
        let inputs = affine::inputs(&c, affine::seed(i));
        let [gate_up, gate, up] = split(&inputs.m, im);
        let x = inputs.x_tensor(&c);
        let slots = c.slots();
        let ids = Tensor::from_vec(inputs.ids.clone(), (tokens, slots), &Device::Cpu).unwrap();
        assert!(gate_up.supports_gather_swiglu(tokens, dtype));
        let act = gate_up.gather_swiglu(&x, &ids).unwrap();
        assert_eq!(
            (act.dims(), act.dtype()),
            ([tokens, slots, im].as_slice(), dtype)
        );
        // The composed path of moe.rs.
        let g = gate.gather_matmul_t(&x, &ids).unwrap();
        let u = up.gather_matmul_t(&x, &ids).unwrap();
        let want = (g.silu().unwrap() * u).unwrap();
        let err = max_rel(&act, &want);
        assert!(
            err <= tol,
            "{dtype:?} E={experts} Im={im} H={h} bits={bits}: {err:e}"
        );
    }
}

/// A batched step's rows (issue 29): each token's slots over 16 and 64 tokens equal what that
/// token gets alone, bit for bit (every pair is its own output row).
#[test]
fn batched_rows_equal_each_row_alone() {
    let [gate_up, ..] = stacks(8, 16, 128, 4, 32, 7);
    let mut rng = Rng::new(11);
    for tokens in [16, GATHER_MAX_TOKENS] {
        let slots = 3;
        let xs: Vec<f32> = (0..tokens * 128).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let ids: Vec<u32> = (0..tokens * slots).map(|_| rng.below(8) as u32).collect();
        let x = Tensor::from_vec(xs, (tokens, 128), &Device::Cpu).unwrap();
        let ids = Tensor::from_vec(ids, (tokens, slots), &Device::Cpu).unwrap();
        assert!(gate_up.supports_gather_swiglu(tokens, DType::F32));
        let all = gate_up.gather_swiglu(&x, &ids).unwrap();
        for t in 0..tokens {
            let one = gate_up
                .gather_swiglu(&x.narrow(0, t, 1).unwrap(), &ids.narrow(0, t, 1).unwrap())
                .unwrap();
            let got = all.narrow(0, t, 1).unwrap().flatten_all().unwrap();
            let want = one.flatten_all().unwrap();
            assert_eq!(
                got.to_vec1::<f32>().unwrap(),
                want.to_vec1::<f32>().unwrap(),
                "token {t} of {tokens}"
            );
        }
    }
}

#[test]
fn supports_decode_rows_of_a_stacked_gate_and_up_matrix() {
    let [gate_up, gate, _] = stacks(2, 3, 64, 4, 32, 1);
    assert!(gate_up.supports_gather_swiglu(GATHER_MAX_TOKENS, DType::BF16));
    assert!(!gate_up.supports_gather_swiglu(GATHER_MAX_TOKENS + 1, DType::BF16));
    assert!(!gate_up.supports_gather_swiglu(0, DType::BF16));
    assert!(!gate_up.supports_gather_swiglu(1, DType::U32));
    // 3 rows per expert: not gate rows then as many up rows.
    assert!(!gate.supports_gather_swiglu(1, DType::BF16));
}

fn inputs(tokens: usize, slots: usize) -> (Tensor, Tensor) {
    (
        Tensor::zeros((tokens, 64), DType::F32, &Device::Cpu).unwrap(),
        Tensor::zeros((tokens, slots), DType::U32, &Device::Cpu).unwrap(),
    )
}

fn err(r: anyhow::Result<Tensor>) -> String {
    r.expect_err("an error").to_string()
}

#[test]
fn rejects_ids_that_are_not_u32() {
    let [gate_up, ..] = stacks(2, 3, 64, 4, 32, 1);
    let (x, ids) = inputs(1, 2);
    assert!(err(gate_up.gather_swiglu(&x, &ids.to_dtype(DType::F32).unwrap())).contains("u32"));
}

#[test]
fn rejects_an_odd_number_of_rows() {
    let [_, gate, _] = stacks(2, 3, 64, 4, 32, 1);
    let (x, ids) = inputs(1, 2);
    assert!(err(gate.gather_swiglu(&x, &ids)).contains("gate rows then"));
}

#[test]
fn rejects_x_of_another_width_or_rows() {
    let [gate_up, ..] = stacks(2, 3, 64, 4, 32, 1);
    let (_, ids) = inputs(2, 2);
    let narrow = Tensor::zeros((2, 32), DType::F32, &Device::Cpu).unwrap();
    assert!(err(gate_up.gather_swiglu(&narrow, &ids)).contains("does not end in"));
    let three = Tensor::zeros((3, 64), DType::F32, &Device::Cpu).unwrap();
    assert!(err(gate_up.gather_swiglu(&three, &ids)).contains("must be [2, 64]"));
}

#[test]
fn rejects_more_than_decode_rows() {
    let [gate_up, ..] = stacks(2, 3, 64, 4, 32, 1);
    let (x, ids) = inputs(GATHER_MAX_TOKENS + 1, 2);
    assert!(err(gate_up.gather_swiglu(&x, &ids)).contains("at most"));
}

#[test]
fn rejects_an_expert_id_out_of_range() {
    let [gate_up, ..] = stacks(2, 3, 64, 4, 32, 1);
    let (x, _) = inputs(1, 2);
    let ids = Tensor::new(&[[0u32, 2]], &Device::Cpu).unwrap();
    assert!(err(gate_up.gather_swiglu(&x, &ids)).contains("out of range"));
}
