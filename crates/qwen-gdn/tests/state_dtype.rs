//! The GDN state dtype switches (MLX_LM_GDN_STATE_BF16, --gdn-state-dtype) and the bf16
//! quality gate (`eval --compare-state-dtype bf16`) against mlx-lm's own numbers.

mod common;
use common::*;
use serde_json::Value;

fn reference_json(name: &str) -> Value {
    let path = repo_root()
        .join("models/reference")
        .join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `eval --json` in decode mode (one token per call, so the state is stored every token).
fn eval_logprobs(model: &str, extra: &[&str], env: Option<&str>) -> Vec<f64> {
    let text = reference_json(model)["text"].as_str().unwrap().to_string();
    let env: Vec<_> = env
        .map(|v| ("MLX_LM_GDN_STATE_BF16", v))
        .into_iter()
        .collect();
    eval_logprobs_per_token(&fixture(model), &text, extra, &env)
}

#[test]
fn environment_and_flag_select_the_state_dtype() {
    let model = "qwen3.5-tiny-4bit";
    let f32_run = eval_logprobs(model, &[], None);
    let bf16_env = eval_logprobs(model, &[], Some("1"));
    assert_ne!(
        f32_run, bf16_env,
        "MLX_LM_GDN_STATE_BF16=1 must store the state in bf16"
    );
    let max_diff = f32_run
        .iter()
        .zip(&bf16_env)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(max_diff < 0.5, "bf16 state moved log-probs by {max_diff}");
    // Only the exact value "1" opts in.
    assert_eq!(eval_logprobs(model, &[], Some("true")), f32_run);
    assert_eq!(eval_logprobs(model, &[], Some("0")), f32_run);
    // The flag overrides the environment, both ways.
    assert_eq!(
        eval_logprobs(model, &["--gdn-state-dtype", "f32"], Some("1")),
        f32_run
    );
    assert_eq!(
        eval_logprobs(model, &["--gdn-state-dtype", "bf16"], None),
        bf16_env
    );
}

#[test]
fn bf16_quality_gate_matches_mlx_lm_on_every_tiny_checkpoint() {
    for name in CHECKPOINTS {
        let reference = reference_json(name);
        let want = &reference["bf16_state"];
        let got = bf16_compare(name, reference["text"].as_str().unwrap());
        let (kl, mlx_kl) = (
            got["kl_mean"].as_f64().unwrap(),
            want["kl_mean"].as_f64().unwrap(),
        );
        let (top1, mlx_top1) = (
            got["top1_match"].as_f64().unwrap(),
            want["top1_match"].as_f64().unwrap(),
        );
        let n = got["n"].as_u64().unwrap();
        eprintln!("{name}: kl_mean {kl:.3e} (mlx-lm {mlx_kl:.3e}), top-1 {top1:.3} (mlx-lm {mlx_top1:.3}), n {n}");
        assert!(n >= 96, "{name}: only {n} positions");
        assert!(kl > 0.0, "{name}: KL is 0: the bf16 state was not used");
        assert!(
            kl <= 3.0 * mlx_kl && kl >= mlx_kl / 3.0,
            "{name}: KL {kl:e} not within 3x of mlx-lm's {mlx_kl:e}"
        );
        assert!(
            top1 >= mlx_top1 - 0.03,
            "{name}: top-1 {top1} more than 3 points below mlx-lm's {mlx_top1}"
        );
        let pass = kl <= 0.01 && top1 >= 0.95;
        assert_eq!(
            got["pass"].as_bool(),
            Some(pass),
            "{name}: PASS/FAIL verdict"
        );
    }
}

#[test]
fn human_output_prints_the_verdict() {
    let dir = fixture("qwen3.5-tiny-4bit");
    let out = run_model(
        "eval",
        &dir,
        &[
            "--text",
            "The old lighthouse keeper climbed the stairs.",
            "--compare-state-dtype",
            "bf16",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("GDN state bf16 vs f32") && (text.contains("PASS") || text.contains("FAIL")),
        "{text}"
    );
}

/// qwen4_exp (transformers' reference records no bf16-state run): the compare runs on both
/// its fixtures, the bf16 states change the distribution a little, and the gate passes.
#[test]
fn bf16_quality_gate_runs_on_qwen4_exp() {
    for name in QWEN4_EXP {
        bf16_quality_gate_passes(name);
    }
}

/// `eval --compare-state-dtype bf16` of `text` on the fixture `name`: its JSON `compare`.
fn bf16_compare(name: &str, text: &str) -> Value {
    let out = run_model(
        "eval",
        &fixture(name),
        &["--text", text, "--json", "--compare-state-dtype", "bf16"],
    );
    assert!(out.status.success(), "{name}: {}", stderr(&out));
    let mut json: Value = serde_json::from_slice(&out.stdout).unwrap();
    json["compare"].take()
}

fn bf16_quality_gate_passes(name: &str) {
    let got = &bf16_compare(name, reference_json(name)["text"].as_str().unwrap());
    let (kl, top1) = (
        got["kl_mean"].as_f64().unwrap(),
        got["top1_match"].as_f64().unwrap(),
    );
    eprintln!("{name}: bf16 state vs f32: KL mean {kl:.3e}, top-1 {top1:.3}");
    assert!(got["n"].as_u64().unwrap() >= 96, "{name}: {got}");
    assert!(kl > 0.0, "{name}: KL is 0: the bf16 state was not used");
    assert!(kl <= 0.01 && top1 >= 0.95, "{name}: {got}");
    assert_eq!(got["pass"].as_bool(), Some(true));
}
