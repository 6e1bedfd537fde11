//! The experimental 8-bit-activation CPU mode (`LoadOptions::q8_activations`), measured
//! against mlx-lm's fp32 logits while decoding the teacher-forced text (the mode only changes
//! decode-shaped products).
//!
//! It does NOT meet the quality gate (KL ≤ 0.01, top-1 ≥ 95%) on these random tiny
//! checkpoints, whose logits swing with any activation rounding (mlx-lm's own bf16 run scores
//! KL 0.17–0.37 on them): one step from an exact cache costs KL 0.07–0.12, compounded decoding
//! 0.24–0.46. So the mode is opt-in and off by default, and this test asserts only what holds:
//! the mode is wired (the products change) and stays a usable approximation (top-1 agreement
//! with the reference at least 60% per step, against 1/vocab for noise). The numbers it prints
//! are the ones docs/perf-notes.md reports; the dot product itself is bounded in gdn-ops'
//! `affine_q8` unit tests.

mod common;
use candle_core::Tensor;
use common::*;
use qwen_gdn_model::{LoadOptions, Model};

fn decode_logits(model: &Model, ids: &[u32]) -> Tensor {
    let mut cache = model.new_cache();
    let rows: Vec<Tensor> = ids
        .iter()
        .map(|&id| model.forward_last(&[id], &mut cache).unwrap())
        .collect();
    Tensor::cat(&rows, 0).unwrap()
}

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
        &LoadOptions {
            q8_activations: true,
            ..LoadOptions::default()
        },
    );
    let exact_model = load(name);
    let got = one_step_logits(&exact_model, &q8, &ids);
    let exact = decode_logits(&exact_model, &ids);
    let compounded = decode_logits(&q8, &ids);
    let want = reference.get("tf_logits");
    let (kl, top1) = kl_and_top1(&got, want);
    let moved = rel_max_diff(&got, &exact);
    let (kl_c, _) = kl_and_top1(&compounded, want);
    eprintln!("{name}: q8 activations one-step KL {kl:.2e}, top-1 {top1:.3}, vs exact {moved:.1e}; compounded KL {kl_c:.2e}");
    assert!(moved > 1e-6, "{name}: q8 mode did not change the products");
    assert!(
        kl.is_finite() && top1 >= 0.6,
        "{name}: KL {kl:e}, top-1 {top1}"
    );
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
