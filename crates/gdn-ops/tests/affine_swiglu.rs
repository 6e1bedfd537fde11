//! `AffineTensor::gather_swiglu`'s CPU twin against the composed path of the model's device
//! plan (moe.rs `routed_on_device`): `gather_matmul_t` of separate gate and up stacks, then
//! `silu(gate) · up` with candle ops; plus one test per input check.

mod common;

use candle_core::{DType, Device, Tensor};
use common::max_rel;
use gdn_ops::ops::affine::{pack_row, AffineMatrix};
use gdn_ops::ops::affine::{AffineTensor, MATVEC_MAX_ROWS};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 16
    }
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 24) as f32 / (1u64 << 24) as f32)
    }
}

/// Random quantized rows: `[rows]` of (q values, scale and bias per group).
type Rows = Vec<(Vec<u32>, Vec<f32>, Vec<f32>)>;

fn random_rows(rng: &mut Rng, rows: usize, cols: usize, bits: usize, gs: usize) -> Rows {
    let levels = (1u64 << bits) - 1;
    (0..rows)
        .map(|_| {
            let q = (0..cols)
                .map(|_| (rng.next() % (levels + 1)) as u32)
                .collect();
            let scales: Vec<f32> = (0..cols / gs)
                .map(|_| half::bf16::from_f32(rng.uniform(0.5, 1.0) * 0.2 / levels as f32).to_f32())
                .collect();
            let biases = scales
                .iter()
                .map(|s| half::bf16::from_f32(-s * levels as f32 * 0.5).to_f32())
                .collect();
            (q, scales, biases)
        })
        .collect()
}

/// A stacked matrix of `experts` blocks of the given rows.
fn stack(blocks: &[Rows], cols: usize, bits: usize, gs: usize) -> AffineTensor {
    let rows = blocks[0].len();
    let (mut packed, mut scales, mut biases) =
        (Vec::<u32>::new(), Vec::<f32>::new(), Vec::<f32>::new());
    for block in blocks {
        for (q, s, b) in block.iter() {
            packed.extend(pack_row(q, bits));
            scales.extend(s);
            biases.extend(b);
        }
    }
    let m =
        AffineMatrix::new(bits, gs, [blocks.len(), rows, cols], packed, scales, biases).unwrap();
    AffineTensor::upload(&m, &Device::Cpu).unwrap()
}

/// `(gate_up [E, 2·Im, H], gate [E, Im, H], up [E, Im, H])` from the same random rows.
fn stacks(
    experts: usize,
    im: usize,
    h: usize,
    bits: usize,
    gs: usize,
    seed: u64,
) -> [AffineTensor; 3] {
    let mut rng = Rng(seed);
    let gates: Vec<Rows> = (0..experts)
        .map(|_| random_rows(&mut rng, im, h, bits, gs))
        .collect();
    let ups: Vec<Rows> = (0..experts)
        .map(|_| random_rows(&mut rng, im, h, bits, gs))
        .collect();
    let both: Vec<Rows> = gates
        .iter()
        .zip(&ups)
        .map(|(g, u)| g.iter().chain(u).cloned().collect())
        .collect();
    [
        stack(&both, h, bits, gs),
        stack(&gates, h, bits, gs),
        stack(&ups, h, bits, gs),
    ]
}

#[test]
fn twin_matches_the_composed_products() {
    for dtype in [DType::F32, DType::BF16] {
        let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
        for (experts, im, h, bits, gs, tokens, slots) in [
            (5, 24, 256, 4, 64, 1, 3),
            (3, 16, 192, 8, 32, 4, 2),
            (4, 8, 384, 3, 128, 2, 4),
            (2, 12, 128, 6, 64, 3, 1),
        ] {
            let [gate_up, gate, up] = stacks(experts, im, h, bits, gs, (im * h + bits) as u64);
            let mut rng = Rng(7 + tokens as u64);
            let x: Vec<f32> = (0..tokens * h).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let x = Tensor::from_vec(x, (tokens, h), &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let ids: Vec<u32> = (0..tokens * slots)
                .map(|_| (rng.next() % experts as u64) as u32)
                .collect();
            let ids = Tensor::from_vec(ids, (tokens, slots), &Device::Cpu).unwrap();
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
}

#[test]
fn supports_decode_rows_of_a_stacked_gate_and_up_matrix() {
    let [gate_up, gate, _] = stacks(2, 3, 64, 4, 32, 1);
    assert!(gate_up.supports_gather_swiglu(MATVEC_MAX_ROWS, DType::BF16));
    assert!(!gate_up.supports_gather_swiglu(MATVEC_MAX_ROWS + 1, DType::BF16));
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
    let (x, ids) = inputs(MATVEC_MAX_ROWS + 1, 2);
    assert!(err(gate_up.gather_swiglu(&x, &ids)).contains("at most"));
}

#[test]
fn rejects_an_expert_id_out_of_range() {
    let [gate_up, ..] = stacks(2, 3, 64, 4, 32, 1);
    let (x, _) = inputs(1, 2);
    let ids = Tensor::new(&[[0u32, 2]], &Device::Cpu).unwrap();
    assert!(err(gate_up.gather_swiglu(&x, &ids)).contains("out of range"));
}
