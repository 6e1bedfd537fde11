//! The 8-bit-activation CPU mode (`RunOptions::q8_activations`, `--q8-activations`),
//! measured against mlx-lm's fp32 logits while decoding the teacher-forced text (the mode
//! only changes decode-shaped products).
//!
//! Gate: the precision tier mlx-lm itself runs at on Metal. One q8 step from an exact cache
//! (the distortion of one forward, as mlx-lm's recorded `bf16_activations` number is the
//! distortion of one bf16 forward) must have a KL to mlx-lm's fp32 logits no larger than
//! mlx-lm's own bf16 run of the same checkpoint, and a top-1 agreement no more than 5 points
//! below it (two positions of the 99). Random tiny checkpoints have sharp logits, so any
//! activation rounding costs far more KL on them than on real models: KL 0.06–0.12 here
//! against mlx-lm's bf16 0.17–0.37. The error compounded through the recurrent state over a
//! whole decode is printed, not gated (0.26–0.46). The dot product itself is bounded in
//! gdn-ops' `affine_q8` unit tests.

mod common;
use candle_core::Tensor;
use common::*;
use qwen_gdn_model::{Model, RunOptions};

/// Per-token distortion: at every position, one q8 step from the exact path's cache (the
/// error of one token, not compounded through the recurrent state).
fn one_step_logits(exact: &Model, q8: &Model, ids: &[u32]) -> Tensor {
    let mut cache = exact.new_cache();
    let rows: Vec<Tensor> = ids
        .iter()
        .map(|&id| {
            let mut branch = cache.deep_clone().unwrap();
            let row = q8.forward_last(&[id], &mut branch).unwrap();
            exact.forward_last(&[id], &mut cache).unwrap();
            row
        })
        .collect();
    Tensor::cat(&rows, 0).unwrap()
}

fn check(name: &str) {
    let reference = Reference::load(name);
    let ids = reference.ids("tf_ids");
    let q8 = load_with(
        name,
        &RunOptions {
            q8_activations: true,
            ..common::run_options()
        },
    );
    let exact_model = load(name);
    let got = one_step_logits(&exact_model, &q8, &ids);
    let exact = step_by_step(&exact_model, &ids);
    let compounded = step_by_step(&q8, &ids);
    let want = reference.get("tf_logits");
    let (kl, top1) = kl_and_top1(&got, want);
    let moved = rel_max_diff(&got, &exact);
    let (kl_c, _) = kl_and_top1(&compounded, want);
    let (max_kl, mlx_top1) = mlx_bf16_record(name);
    let min_top1 = mlx_top1 - 0.05;
    eprintln!("{name}: q8 activations one-step KL {kl:.2e}, top-1 {top1:.3}, vs exact {moved:.1e}; compounded KL {kl_c:.2e} (gate: KL ≤ {max_kl:.2e}, top-1 ≥ {min_top1:.3})");
    assert!(moved > 1e-6, "{name}: q8 mode did not change the products");
    assert!(
        kl <= max_kl && top1 >= min_top1,
        "{name}: q8 one-step KL {kl:e}, top-1 {top1}"
    );
}

/// mlx-lm's own bf16-activation KL and top-1 for `name`, recorded by scripts/gen_fixtures.py.
fn mlx_bf16_record(name: &str) -> (f32, f32) {
    let path = models_dir().join(format!("reference/{name}.json"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mlx = &json["bf16_activations"];
    match (mlx["kl_mean"].as_f64(), mlx["top1_match"].as_f64()) {
        (Some(k), Some(t)) => (k as f32, t as f32),
        _ => panic!("{}: no bf16_activations record", path.display()),
    }
}

#[test]
fn qwen3_next_4bit() {
    check("qwen3-next-tiny-4bit");
}

#[test]
fn qwen35_dense_4bit() {
    check("qwen3.5-tiny-4bit");
}

#[test]
fn qwen35_moe_4bit() {
    check("qwen3.5-moe-tiny-4bit");
}
