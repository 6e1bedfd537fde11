//! Grouped expert products for prefill (issue 17), per expert (`grouped`) and as one grouped
//! GEMM per projection (`gemm`), against the per-pair products, the reference: on random
//! quantized MoE blocks (4- and 8-bit, with a shared expert), on the edge cases of routing,
//! and on every fixture end to end; and the launches of the grouped GEMM's prefill, which must
//! not depend on the number of experts in use.
//!
//! Gates: f32 within 1e-5 of max|value| (the MoE block) and of max|logit| (the fixtures);
//! bf16 within 2e-2 of max|value|: the grouped products dequantize the weights into bf16 and
//! multiply in bf16, where the per-pair kernel reads the packed weights and sums in f32.
//!
//! With `QWEN_GDN_TEST_DEVICE=cuda` the same tests run on CUDA.

mod common;
use candle_core::{DType, Device, Tensor};
use common::*;
use qwen_gdn_model::layers::linear::Linear;
use qwen_gdn_model::layers::mlp::Mlp;
use qwen_gdn_model::layers::moe::{MoePrefill, StackedExperts};
use qwen_gdn_model::weights::affine::pack_row;
use qwen_gdn_model::weights::{AffineMatrix, FloatData, FloatMatrix, Matrix, Weight};
use qwen_gdn_model::{Plan, RunOptions};

const HIDDEN: usize = 64;
const INNER: usize = 32;
const EXPERTS: usize = 6;
const TOP_K: usize = 2;

/// Deterministic values in [-1, 1).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A random `[experts, rows, cols]` affine matrix, groups of 32.
fn affine(bits: usize, [experts, rows, cols]: [usize; 3], seed: u64) -> Matrix {
    let n = experts * rows;
    let levels = (1u32 << bits) as f32;
    let q: Vec<u32> = noise(n * cols, seed)
        .iter()
        .map(|v| (((v + 1.0) / 2.0 * levels) as u32).min((1 << bits) - 1))
        .collect();
    let packed: Vec<u32> = q.chunks(cols).flat_map(|r| pack_row(r, bits)).collect();
    let groups = n * cols / 32;
    let scales: Vec<f32> = noise(groups, seed + 1)
        .iter()
        .map(|v| 0.05 * v / levels * 16.0)
        .collect();
    let biases: Vec<f32> = noise(groups, seed + 2).iter().map(|v| 0.1 * v).collect();
    Matrix::Affine(
        AffineMatrix::new(bits, 32, [experts, rows, cols], packed, scales, biases).unwrap(),
    )
}

fn float(rows: usize, cols: usize, values: Vec<f32>) -> Linear {
    Linear::from_matrix(Matrix::Float(
        FloatMatrix::new(1, rows, cols, FloatData::F32(values)).unwrap(),
    ))
}

/// A stacked MoE block with `bits`-bit experts and a shared expert; `router` `[E, H]`.
fn block(bits: usize, router: Vec<f32>, device: &Device, dtype: DType) -> StackedExperts {
    let experts = |rows, cols, seed| Weight::Host(affine(bits, [EXPERTS, rows, cols], seed));
    let single = |rows, cols, seed| Linear::from_matrix(affine(bits, [1, rows, cols], seed));
    let shared = (
        Mlp::from_parts(
            single(INNER, HIDDEN, 40),
            single(INNER, HIDDEN, 50),
            single(HIDDEN, INNER, 60),
        ),
        float(1, HIDDEN, noise(HIDDEN, 70)),
    );
    StackedExperts::from_host(
        &float(EXPERTS, HIDDEN, router),
        [
            &experts(INNER, HIDDEN, 10),
            &experts(INNER, HIDDEN, 20),
            &experts(HIDDEN, INNER, 30),
        ],
        Some(&shared),
        device,
        dtype,
    )
    .unwrap()
    .expect("one quantized format: the stacked form")
}

fn tokens(n: usize, seed: u64, device: &Device, dtype: DType) -> Tensor {
    Tensor::from_vec(noise(n * HIDDEN, seed), (n, HIDDEN), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .to_device(device)
        .unwrap()
}

/// bf16 end to end: the two modes round differently (grouped products dequantize the
/// weights into bf16), and the random tiny fixtures' sharp logits amplify a bf16 rounding
/// over their layers, so their teacher-forced distributions are compared: the two bf16 runs
/// must be closer to each other than mlx-lm's own bf16 run is to its fp32 run (the fixture's
/// recorded `bf16_activations`; where mlx cannot run bf16, KL ≤ 0.05 and top-1 ≥ 90%).
fn bf16_gate(name: &str) -> (f32, f32) {
    let path = models_dir().join(format!("reference/{name}.json"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mlx = &json["bf16_activations"];
    match (mlx["kl_mean"].as_f64(), mlx["top1_match"].as_f64()) {
        (Some(k), Some(t)) => (k as f32, t as f32),
        _ => (0.05, 0.90),
    }
}

fn gate(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 1e-5,
        _ => 2e-2,
    }
}

/// The grouped block at several thresholds, and the grouped GEMM, against the per-pair block.
fn check_against_pairs(moe: &StackedExperts, x: &Tensor, what: &str) {
    let want = moe.forward_composed(x, TOP_K, true).unwrap();
    let got = moe.forward_gemm(x, TOP_K, true).unwrap();
    let diff = rel_max_diff(&got, &want);
    eprintln!("{what}, gemm: rel diff {diff:e}");
    assert!(
        diff <= gate(x.dtype()),
        "{what}, gemm: the grouped GEMM differs from the pairs by {diff:e}"
    );
    for min_tokens in [1, 3, 8, usize::MAX] {
        let got = moe.forward_grouped(x, TOP_K, true, min_tokens).unwrap();
        let diff = rel_max_diff(&got, &want);
        eprintln!("{what}, min_tokens {min_tokens}: rel diff {diff:e}");
        assert!(
            diff <= gate(x.dtype()),
            "{what}, min_tokens {min_tokens}: grouped differs from the pairs by {diff:e}"
        );
    }
}

#[test]
fn grouped_matches_pairs_on_random_blocks() {
    let device = device_under_test();
    for dtype in [DType::F32, DType::BF16] {
        for bits in [4, 8] {
            let moe = block(bits, noise(EXPERTS * HIDDEN, 3), &device, dtype);
            for n in [1, 5, 37] {
                let x = tokens(n, 100 + n as u64, &device, dtype);
                check_against_pairs(&moe, &x, &format!("{dtype:?}, {bits}-bit, {n} tokens"));
            }
        }
    }
}

/// Every token's top expert is expert 0 and experts 4 and 5 are never chosen (the router
/// reads a constant first component): one expert holds all tokens, two hold none.
#[test]
fn all_tokens_on_one_expert_and_experts_without_tokens() {
    let device = device_under_test();
    let mut router = noise(EXPERTS * HIDDEN, 5);
    router[..HIDDEN].fill(0.0);
    router[0] = 50.0;
    router[4 * HIDDEN] = -50.0;
    router[5 * HIDDEN] = -50.0;
    let n = 24;
    let mut x = noise(n * HIDDEN, 9);
    x.chunks_exact_mut(HIDDEN).for_each(|row| row[0] = 1.0);
    for dtype in [DType::F32, DType::BF16] {
        let moe = block(4, router.clone(), &device, dtype);
        let x = Tensor::from_vec(x.clone(), (n, HIDDEN), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .to_device(&device)
            .unwrap();
        let logits = moe.router.forward(&x).unwrap();
        let (ids, _) = moe.route_composed(&logits, TOP_K, true).unwrap();
        let ids: Vec<Vec<u32>> = ids.to_device(&Device::Cpu).unwrap().to_vec2().unwrap();
        assert!(ids.iter().all(|slots| slots[0] == 0), "expert 0 first");
        assert!(
            ids.iter().flatten().all(|&e| e != 4 && e != 5),
            "experts 4 and 5 unused"
        );
        check_against_pairs(&moe, &x, &format!("{dtype:?}, one expert for all"));
    }
}

/// A zero router: every routing probability equal, so the top-k is decided by ties alone
/// and the renormalised weights are all 1/k.
#[test]
fn ties_in_the_routing_weights() {
    let device = device_under_test();
    for dtype in [DType::F32, DType::BF16] {
        let moe = block(4, vec![0.0; EXPERTS * HIDDEN], &device, dtype);
        let x = tokens(19, 11, &device, dtype);
        check_against_pairs(&moe, &x, &format!("{dtype:?}, tied routing"));
    }
}

/// Every fixture, teacher-forced, with the prefill's expert products grouped (at every
/// threshold) and per pair. The unquantized fixtures keep their float experts separate
/// (grouped in both modes): their logits must not move at all.
fn check_fixture(name: &str, dtype: DType) {
    let opts = RunOptions {
        dtype,
        plan: Some(Plan::Device),
        ..common::run_options()
    };
    let mut model = load_on(name, &opts, &device_under_test());
    let ids = Reference::load(name).ids("tf_ids");
    assert!(ids.len() > 4, "{name}: a prefill-shaped chunk");
    let run = |model: &qwen_gdn_model::Model| {
        model
            .forward(&ids, &mut model.new_cache())
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    model.set_moe_prefill(MoePrefill::Pairs);
    let want = run(&model);
    let modes = [1, 4, 16]
        .map(|min_tokens| MoePrefill::Grouped { min_tokens })
        .into_iter()
        .chain([MoePrefill::Gemm]);
    for mode in modes {
        model.set_moe_prefill(mode);
        let got = run(&model);
        let what = format!("{name} {dtype:?}, {mode:?}");
        let diff = rel_max_diff(&got, &want);
        let (kl, top1) = kl_and_top1(&got, &want);
        eprintln!("{what}: logits rel diff {diff:e}, KL {kl:e}, top-1 {top1}");
        if dtype == DType::F32 {
            assert!(diff <= 1e-5, "{what}: logits differ by {diff:e}");
        } else {
            let (max_kl, min_top1) = bf16_gate(name);
            assert!(
                kl <= max_kl && top1 >= min_top1,
                "{what}: KL {kl:e}, top-1 {top1} (gate: KL ≤ {max_kl:e}, top-1 ≥ {min_top1})"
            );
        }
    }
}

/// The launches of one MoE layer's prefill chunk (`gdn_ops::launches`: on the CPU each CPU
/// twin counts as the kernel it stands in for), on a chunk whose tokens all choose the same
/// experts and on one spread over every expert: equal with the grouped GEMM; with the products
/// grouped per expert they grow with the experts in use (what the GEMM removes). The bound,
/// 30, is the routing (~12), the gather, the two products, the SwiGLU (2), the scatter and the
/// weighted sum (~4), with room.
#[test]
fn gemm_launches_do_not_depend_on_the_experts_in_use() {
    let device = device_under_test();
    let dtype = DType::BF16;
    let moe = block(4, noise(EXPERTS * HIDDEN, 3), &device, dtype);
    let n = 48;
    let spread = tokens(n, 21, &device, dtype);
    // Every token the same: the same two routed experts (and the shared one) for all.
    let same = tokens(1, 21, &device, dtype)
        .broadcast_as((n, HIDDEN))
        .unwrap()
        .contiguous()
        .unwrap();
    let experts_in_use = |x: &Tensor| {
        let logits = moe.router.forward(x).unwrap();
        let (ids, _) = moe.route_composed(&logits, TOP_K, true).unwrap();
        let mut ids: Vec<u32> = ids
            .to_device(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        ids.sort();
        ids.dedup();
        ids.len()
    };
    let (few, many) = (experts_in_use(&same), experts_in_use(&spread));
    assert_eq!(few, TOP_K + 1, "identical tokens choose the same experts");
    assert!(
        many >= EXPERTS,
        "{many} experts in use: the chunk must spread"
    );
    let launches = |f: &dyn Fn() -> Tensor| {
        gdn_ops::launches::take();
        let _ = f();
        gdn_ops::launches::take()
    };
    let gemm_few = launches(&|| moe.forward_gemm(&same, TOP_K, true).unwrap());
    let gemm_many = launches(&|| moe.forward_gemm(&spread, TOP_K, true).unwrap());
    let grouped_few = launches(&|| moe.forward_grouped(&same, TOP_K, true, 1).unwrap());
    let grouped_many = launches(&|| moe.forward_grouped(&spread, TOP_K, true, 1).unwrap());
    eprintln!(
        "launches with {few} / {many} experts in use: gemm {gemm_few} / {gemm_many}, grouped {grouped_few} / {grouped_many}"
    );
    assert_eq!(
        gemm_few, gemm_many,
        "the grouped GEMM's launches must not depend on the experts in use"
    );
    assert!(
        gemm_many <= 30,
        "{gemm_many} launches for one MoE layer's prefill"
    );
    assert!(
        grouped_many > grouped_few,
        "the per-expert products launch more with more experts"
    );
}

macro_rules! fixtures {
    ($($test:ident => $name:literal),* $(,)?) => {
        mod f32_grouped_matches_pairs { $( #[test] fn $test() { super::check_fixture($name, candle_core::DType::F32) } )* }
        mod bf16_grouped_matches_pairs { $( #[test] fn $test() { super::check_fixture($name, candle_core::DType::BF16) } )* }
    };
}

fixtures! {
    qwen3_next_tiny_4bit => "qwen3-next-tiny-4bit",
    qwen3_5_tiny_4bit => "qwen3.5-tiny-4bit",
    qwen3_5_moe_tiny_4bit => "qwen3.5-moe-tiny-4bit",
    qwen3_next_tiny_bf16 => "qwen3-next-tiny-bf16",
    qwen3_5_moe_tiny_hf => "qwen3.5-moe-tiny-hf",
}

const _: () = assert!(TOP_K < EXPERTS);
