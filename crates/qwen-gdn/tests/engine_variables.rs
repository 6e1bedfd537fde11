//! The engine's environment switches through the binary (`RunOptions::from_env`, README
//! "Environment variables"): a bad value ends in one `error:` line naming the variable and the
//! values it takes, before any weight is read (the checkpoint's weights here are an empty
//! file, which would fail the load otherwise); an unknown `QWEN_GDN_*` variable is named in one
//! notice and the run goes on.

mod common;

use common::*;

const MODEL: &str = "qwen3.5-tiny-4bit";

#[test]
fn a_bad_engine_value_stops_before_the_weights() {
    let (_tmp, dir) = copy_fixture(MODEL);
    std::fs::write(dir.join("model.safetensors"), b"").unwrap();
    let cases: [(&str, &str, &[&str]); 9] = [
        ("QWEN_GDN_GDN_PREFILL", "chunk", &["recurrent", "chunked"]),
        ("QWEN_GDN_CPU_LEVEL", "sse", &["portable", "avx2", "best"]),
        ("QWEN_GDN_Q8_LAYOUT", "packed", &["interleaved", "plain"]),
        ("QWEN_GDN_SPIN_US", "soon", &["whole number"]),
        ("QWEN_GDN_CONV_FRONT", "Fused", &["composed", "fused"]),
        ("QWEN_GDN_ATTN_PREFILL", "flash", &["kernel", "composed"]),
        ("QWEN_GDN_ATTN_SCORE_BYTES", "2", &["whole number ≥ 4"]),
        (
            "QWEN_GDN_MOE_PREFILL",
            "groups",
            &["pairs", "gemm", "grouped"],
        ),
        ("QWEN_GDN_CUDA_GRAPH", "off", &["0", "1"]),
    ];
    let generate = |env: &[(&str, &str)]| {
        let model = dir.to_str().unwrap();
        let mut cmd = command(&["generate", "--model", model, "--prompt", "Hi"]);
        cmd.envs(env.iter().copied()).output().unwrap()
    };
    for (var, value, accepted) in cases {
        let mut needles = vec![var, value];
        needles.extend(accepted);
        assert_error(&generate(&[(var, value)]), &needles);
    }
    // Without a bad value the same run fails on the weights: the checks above came first.
    assert_error(&generate(&[]), &["model.safetensors"]);
}

#[test]
fn an_unknown_qwen_gdn_variable_gets_one_notice() {
    let dir = fixture(MODEL);
    let out = model_command("eval", &dir, &["--text", "One two three.", "--json"])
        .env("QWEN_GDN_GDN_PREFIL", "chunked")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let notices: Vec<String> = stderr(&out)
        .lines()
        .filter(|l| l.contains("QWEN_GDN_GDN_PREFIL"))
        .map(str::to_string)
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(notices[0].contains("ignoring"), "{notices:?}");
}
