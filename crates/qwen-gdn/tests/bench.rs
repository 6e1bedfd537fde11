//! `qwen-gdn bench`: the shape of its `--json` object and its errors. No timing assertions:
//! only that the speeds are positive, finite numbers.

mod common;

use common::*;
use serde_json::Value as Json;

fn bench(extra: &[&str]) -> std::process::Output {
    let model = fixture("qwen3.5-moe-tiny-4bit");
    let mut args = vec!["bench", "--model", model.to_str().unwrap()];
    args.extend(extra);
    run(&args)
}

fn positive_finite(v: &Json, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    x
}

#[test]
fn json_report() {
    let out = bench(&["-p", "16", "-g", "8", "-r", "2", "--json"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "not one line: {stdout}");
    let report: Json = serde_json::from_str(&stdout).unwrap();
    let keys: Vec<&str> = report
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "model",
            "model_type",
            "size_bytes",
            "backend",
            "prompt_tokens",
            "gen_tokens",
            "repetitions",
            "prefill_chunk_size",
            "gdn_state_dtype",
            "prompt_tps",
            "generation_tps",
            "peak_memory_bytes",
            "peak_memory_source",
        ]
    );
    assert!(report["model"]
        .as_str()
        .unwrap()
        .ends_with("qwen3.5-moe-tiny-4bit"));
    assert_eq!(report["model_type"], "qwen3_5_moe");
    assert_eq!(report["backend"], "cpu");
    assert_eq!(report["peak_memory_source"], "rss");
    assert_eq!(report["prompt_tokens"], 16);
    assert_eq!(report["gen_tokens"], 8);
    assert_eq!(report["repetitions"], 2);
    assert_eq!(report["prefill_chunk_size"], 2048);
    assert_eq!(report["gdn_state_dtype"], "f32");
    positive_finite(&report["size_bytes"], "size_bytes");
    positive_finite(&report["peak_memory_bytes"], "peak_memory_bytes");
    for key in ["prompt_tps", "generation_tps"] {
        let s = &report[key];
        let samples: Vec<f64> = s["samples"]
            .as_array()
            .unwrap_or_else(|| panic!("{key}.samples: {s}"))
            .iter()
            .map(|v| positive_finite(v, key))
            .collect();
        assert_eq!(samples.len(), 2, "{key}: {s}");
        let (min, max) = (
            positive_finite(&s["min"], key),
            positive_finite(&s["max"], key),
        );
        let median = positive_finite(&s["median"], key);
        let stddev = s["stddev"].as_f64().unwrap();
        assert!(stddev.is_finite() && stddev >= 0.0, "{key}: {s}");
        assert!(min <= median && median <= max, "{key}: {s}");
        assert_eq!(min, samples.iter().copied().fold(f64::INFINITY, f64::min));
        assert_eq!(max, samples.iter().copied().fold(0.0, f64::max));
    }
}

#[test]
fn table_report() {
    let out = bench(&["-p", "4", "-g", "2", "-r", "1", "--prefill-chunk-size", "3"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(rows.len(), 4, "{stdout}"); // header, separator, pp4, tg2
    assert!(
        rows[2].contains("| pp4 ") && rows[3].contains("| tg2 "),
        "{stdout}"
    );
    assert!(stdout.contains("peak memory: "), "{stdout}");
}

#[test]
fn errors() {
    for (flag, long) in [
        ("-p", "--prompt-tokens"),
        ("-g", "--gen-tokens"),
        ("-r", "--repetitions"),
    ] {
        assert_error(&bench(&[flag, "0"]), &[long, "'0'"]);
    }
    // The prompt and the generated tokens must fit the context (4096 in the tiny models).
    assert_error(
        &bench(&["-p", "4000", "-g", "100"]),
        &["-p 4000 plus -g 100", "max_position_embeddings"],
    );
}

/// The prompt-cache scenario: the cached request prefills exactly its own tokens (the bench
/// itself refuses to report otherwise), and both times are positive.
#[test]
fn prompt_cache_scenario() {
    let out = bench(&["-p", "40", "--prompt-cache", "29", "-r", "2", "--json"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["prompt_tokens"], 40);
    assert_eq!(report["shared_tokens"], 29);
    assert_eq!(report["cold"]["cached_tokens"], 0);
    assert_eq!(report["cold"]["prefilled_tokens"], 40);
    assert_eq!(report["cached"]["cached_tokens"], 29);
    assert_eq!(report["cached"]["prefilled_tokens"], 11);
    for key in ["cold", "cached"] {
        let samples = report[key]["ttft_seconds"]["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 2, "{report}");
        for s in samples {
            positive_finite(s, key);
        }
    }
    let speedup = positive_finite(&report["speedup"], "speedup");
    let ratio = report["cold"]["ttft_seconds"]["median"].as_f64().unwrap()
        / report["cached"]["ttft_seconds"]["median"].as_f64().unwrap();
    assert!((speedup - ratio).abs() <= 1e-9 * ratio, "{report}");

    let table = bench(&["-p", "8", "--prompt-cache", "5", "-r", "1"]);
    assert!(table.status.success(), "stderr: {}", stderr(&table));
    let text = String::from_utf8(table.stdout).unwrap();
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(rows.len(), 4, "{text}");
    assert!(
        rows[2].contains("ttft p8 cold") && rows[2].contains("|         8 |"),
        "{text}"
    );
    assert!(
        rows[3].contains("ttft p8 cached 5") && rows[3].contains("|         3 |"),
        "{text}"
    );
    assert!(text.contains("speed-up of the cached request: "), "{text}");

    assert_error(
        &bench(&["-p", "8", "--prompt-cache", "8"]),
        &["--prompt-cache 8", "-p 8"],
    );
    assert_error(&bench(&["--prompt-cache", "0"]), &["--prompt-cache", "'0'"]);
}

/// qwen4_exp runs the same benchmark (reference plan on the CPU), in both layouts.
#[test]
fn qwen4_exp_json_report() {
    for name in QWEN4_EXP {
        qwen4_exp_report(name);
    }
}

fn qwen4_exp_report(name: &str) {
    let model = fixture(name);
    let out = run(&[
        "bench",
        "--model",
        model.to_str().unwrap(),
        "-p",
        "16",
        "-g",
        "8",
        "-r",
        "1",
        "--json",
    ]);
    assert!(out.status.success(), "{name}: stderr: {}", stderr(&out));
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["model_type"], "qwen4_exp", "{name}");
    assert_eq!(
        (
            report["prompt_tokens"].as_u64(),
            report["gen_tokens"].as_u64()
        ),
        (Some(16), Some(8))
    );
    positive_finite(&report["prompt_tps"]["median"], "prompt_tps");
    positive_finite(&report["generation_tps"]["median"], "generation_tps");
}

/// `--profile` on the device plan with the grouped GEMM: every phase of the fixture's 4 GDN
/// and 2 attention layers (and their MoE blocks) is timed once per prefill chunk, children
/// inside their parents, and the phases inside the profiled prefill's own time.
#[test]
fn prefill_profile() {
    let model = fixture("qwen3.5-moe-tiny-4bit");
    let args = [
        "bench",
        "--model",
        model.to_str().unwrap(),
        "--dtype",
        "bf16",
        "-p",
        "21",
        "-g",
        "1",
        "-r",
        "1",
        "--prefill-chunk-size",
        "7",
        "--profile",
        "--json",
    ];
    let out = command(&args)
        .env("QWEN_GDN_MOE_PREFILL", "gemm")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("prefill profile: 21 tokens"), "{err}");
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    let profile = &report["prefill_profile"];
    assert_eq!(profile["tokens"], 21);
    let wall = positive_finite(&profile["wall_seconds"], "wall_seconds");
    let phases: Vec<(String, f64, u64)> = profile["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let name = p["phase"].as_str().unwrap().to_string();
            let secs = p["seconds"].as_f64().unwrap();
            assert!(secs.is_finite() && secs >= 0.0, "{p}");
            (name, secs, p["calls"].as_u64().unwrap())
        })
        .collect();
    let calls = |name: &str| -> u64 {
        phases
            .iter()
            .find(|p| p.0 == name)
            .unwrap_or_else(|| panic!("no phase {name} in {profile}"))
            .2
    };
    // 21 tokens in 3 chunks of 7 (a chunk of at most 4 tokens would run the MoE per pair).
    let chunks = 3;
    assert_eq!(calls("embed"), chunks);
    // Per chunk: 4 GDN layers, 2 attention layers, a MoE block in each of the 6.
    let per_chunk: [(u64, &[&str]); 3] = [
        (
            4,
            &[
                "gdn",
                "gdn/in_proj",
                "gdn/conv_prep",
                "gdn/recurrence",
                "gdn/norm_out",
            ],
        ),
        (
            2,
            &[
                "attention",
                "attention/qkv_prep",
                "attention/qkv_prep/proj",
                "attention/qkv_prep/norm",
                "attention/qkv_prep/rope",
                "attention/qkv_prep/append",
                "attention/core",
                "attention/out",
            ],
        ),
        (
            6,
            &[
                "moe",
                "moe/route",
                "moe/group",
                "moe/gate_up",
                "moe/swiglu",
                "moe/down",
                "moe/combine",
            ],
        ),
    ];
    for (layers, names) in per_chunk {
        for phase in names {
            assert_eq!(calls(phase), layers * chunks, "{phase}");
        }
    }
    // Only the last chunk runs the output head.
    assert_eq!(calls("lm_head"), 1);
    let secs = |name: &str| phases.iter().find(|p| p.0 == name).unwrap().1;
    // Each parent's direct children (one more path level) fit in it.
    for parent in ["gdn", "attention", "moe", "attention/qkv_prep"] {
        let children: f64 = phases
            .iter()
            .filter(|p| {
                p.0.strip_prefix(&format!("{parent}/"))
                    .is_some_and(|rest| !rest.contains('/'))
                    && p.2 > 0
            })
            .map(|p| p.1)
            .sum();
        assert!(
            children <= secs(parent),
            "{parent}: {children} > {}",
            secs(parent)
        );
    }
    let top: f64 = phases
        .iter()
        .filter(|p| !p.0.contains('/'))
        .map(|p| p.1)
        .sum();
    assert!(top <= wall, "phases {top} s outside the prefill's {wall} s");
}
