//! `--dtype bf16` on the CPU runs the device plan (the code path Metal uses) from the CLI:
//! same tokens scored, perplexity close to the f32 reference path's but not bit-identical.

mod common;

use common::*;
use serde_json::Value as Json;

fn eval_json(extra: &[&str]) -> Json {
    let model = fixture("qwen3.5-moe-tiny-4bit");
    let mut args = vec![
        "--text",
        "The quick brown fox jumps over the lazy dog. It was a sunny day.",
        "--json",
    ];
    args.extend(extra);
    let out = run_model("eval", &model, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn bf16_device_plan_scores_like_f32() {
    let f32_run = eval_json(&["--device", "cpu"]);
    let bf16_run = eval_json(&["--device", "auto", "--dtype", "bf16"]);
    assert_eq!(f32_run["tokens"], bf16_run["tokens"]);
    let (a, b) = (
        f32_run["ppl"].as_f64().unwrap(),
        bf16_run["ppl"].as_f64().unwrap(),
    );
    assert!(a.is_finite() && b.is_finite());
    assert!((a - b).abs() / a < 0.1, "ppl f32 {a} vs bf16 {b}");
    assert_ne!(
        f32_run["logprobs"], bf16_run["logprobs"],
        "bf16 run used the f32 path"
    );
}
