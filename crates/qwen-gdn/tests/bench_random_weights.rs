//! `qwen-gdn bench --config <config.json> --random-weights`: every fixture's config runs
//! pp/tg with finite, positive speeds and no tokenizer; bad input is one line and a non-zero
//! exit.

use std::path::PathBuf;
use std::process::Command;

fn models() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_qwen-gdn"))
        .arg("bench")
        .args(args)
        .args(["--device", "cpu"])
        .output()
        .unwrap()
}

#[test]
fn every_fixture_config_benches_with_random_weights() {
    for name in [
        "qwen3-next-tiny-4bit",
        "qwen3-next-tiny-bf16",
        "qwen3.5-tiny-4bit",
        "qwen3.5-moe-tiny-4bit",
        "qwen4-exp-tiny-4bit",
    ] {
        let config = models().join(name).join("config.json");
        let out = bench(&[
            "--config",
            config.to_str().unwrap(),
            "--random-weights",
            "-p",
            "8",
            "-g",
            "4",
            "-r",
            "1",
            "--json",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for key in ["prompt_tps", "generation_tps"] {
            let v = report[key]["median"].as_f64().unwrap();
            assert!(v.is_finite() && v > 0.0, "{name}: {key} {v}");
        }
        assert_eq!(report["size_bytes"], 0, "{name}");
        assert!(
            stderr.contains("random weights (seed 0)"),
            "{name}: {stderr}"
        );
    }
}

#[test]
fn bad_random_weight_runs_are_one_line_errors() {
    let config = models().join("qwen3.5-tiny-4bit/config.json");
    let config = config.to_str().unwrap();
    let dir = models().join("qwen3.5-tiny-4bit");
    let unknown = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        unknown.path(),
        r#"{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "vocab_size": 8}"#,
    )
    .unwrap();
    for (args, says) in [
        (vec!["--random-weights"], "--config"),
        (
            vec!["--config", "/nonexistent.json", "--random-weights"],
            "not found",
        ),
        (
            vec![
                "--config",
                config,
                "--random-weights",
                "--model",
                dir.to_str().unwrap(),
            ],
            "leave out --model",
        ),
        (
            vec!["--config", "Cargo.toml", "--random-weights"],
            "invalid JSON",
        ),
        (
            vec![
                "--config",
                unknown.path().to_str().unwrap(),
                "--random-weights",
            ],
            "llama",
        ),
        (vec![], "--model"),
    ] {
        let out = bench(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
