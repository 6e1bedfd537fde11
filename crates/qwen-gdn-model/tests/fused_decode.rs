//! The fused decode step (`Model::forward_last` for one token on the device plan) against
//! the composed ops it replaces, and against mlx-lm, on every fixture.
//!
//! - f32: token by token over the teacher-forcing ids, the fused logits within 1e-4 of the
//!   composed step's (relative to max|logit|) and within the model gate (1e-3) of mlx-lm's,
//!   with every argmax;
//! - bf16: the fused steps' KL to mlx-lm's fp32 logits within the gate of the device plan's
//!   bf16 test (mlx-lm's own bf16 run), and close to the composed bf16 steps;
//! - the fused kernels cover every layer of the quantized MoE fixtures (so the tests above
//!   exercise them), and a decode step costs at most 11 launches per layer there.

mod common;
use candle_core::DType;
use common::*;

fn check_f32(name: &str) {
    let mut model = load_device_plan(name, DType::F32);
    assert!(model.fused_decode());
    let reference = Reference::load(name);
    let ids = reference.ids("tf_ids");
    let fused = step_by_step(&model, &ids);
    model.set_fused_decode(false);
    let composed = step_by_step(&model, &ids);
    let d = rel_max_diff(&fused, &composed);
    eprintln!("{name}: fused vs composed decode, f32: {d:e}");
    assert!(
        d <= 1e-4,
        "{name}: fused decode differs from composed by {d:e}"
    );
    let want = reference.get("tf_logits");
    let d = rel_max_diff(&fused, want);
    assert!(
        d <= 1e-3,
        "{name}: fused decode differs from mlx-lm by {d:e}"
    );
    assert_eq!(argmax_rows(&fused), argmax_rows(want), "{name}: argmax");
}

fn check_bf16(name: &str) {
    let mut model = load_device_plan(name, DType::BF16);
    let reference = Reference::load(name);
    let ids = reference.ids("tf_ids");
    let fused = step_by_step(&model, &ids);
    model.set_fused_decode(false);
    let composed = step_by_step(&model, &ids);
    let want = reference.get("tf_logits");
    let (kl_fused, top1_fused) = kl_and_top1(&fused, want);
    let (kl_composed, top1_composed) = kl_and_top1(&composed, want);
    let (kl_between, _) = kl_and_top1(&fused, &composed);
    eprintln!(
        "{name}: bf16 decode KL to mlx-lm fp32: fused {kl_fused:.2e} (top-1 {top1_fused:.3}), composed {kl_composed:.2e} (top-1 {top1_composed:.3}); fused vs composed {kl_between:.2e}"
    );
    let (max_kl, min_top1) = bf16_gate(name);
    assert!(
        kl_fused <= max_kl && top1_fused >= min_top1,
        "{name}: fused bf16 KL {kl_fused:e}, top-1 {top1_fused} (gate {max_kl:e}, {min_top1})"
    );
    // Rounding order differs from the composed ops (f32 inside each kernel), never more.
    assert!(
        kl_between <= max_kl,
        "{name}: fused vs composed KL {kl_between:e}"
    );
}

/// The device plan's bf16 gate (tests/device_plan.rs): mlx-lm's own bf16 run, or our bound
/// where mlx cannot run it.
fn bf16_gate(name: &str) -> (f32, f32) {
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(models_dir().join(format!("reference/{name}.json"))).unwrap(),
    )
    .unwrap();
    let mlx = &json["bf16_activations"];
    match (mlx["kl_mean"].as_f64(), mlx["top1_match"].as_f64()) {
        (Some(k), Some(t)) => (k as f32, t as f32),
        _ => (0.05, 0.90),
    }
}

common::per_checkpoint! {
    f32_fused_matches_composed_and_mlx_lm => check_f32,
    bf16_fused_within_kl_gate => check_bf16,
}

/// The quantized MoE fixtures run every layer on the fused kernels, in each dtype, at a
/// handful of launches per layer (counted where the kernels are launched).
#[test]
fn fused_kernels_cover_the_quantized_moe_fixtures() {
    for name in ["qwen3-next-tiny-4bit", "qwen3.5-moe-tiny-4bit"] {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let model = load_device_plan(name, dtype);
            let coverage = model.fused_coverage_per_layer();
            assert!(
                coverage.iter().all(|c| c.mixer && c.feed_forward),
                "{name} {dtype:?}: {coverage:?}"
            );
            let mut cache = model.new_cache();
            model.prefill(&[1, 2, 3], &mut cache, 16).unwrap();
            let (_, per_layer) = model.decode_step_with_launches(4, &mut cache).unwrap();
            assert!(
                per_layer.iter().all(|&n| (4..=11).contains(&n)),
                "{name} {dtype:?}: launches per layer {per_layer:?}"
            );
        }
    }
}
