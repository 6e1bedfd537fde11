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
    let out = run_model(
        "bench",
        &model,
        &["-p", "16", "-g", "8", "-r", "1", "--json"],
    );
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
    let out = output(model_command("bench", &model, &args).env("QWEN_GDN_MOE_PREFILL", "gemm"));
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

/// Payload bytes of the tensors `name.{weight,scales,biases}` of a fixture's checkpoint.
fn quantized_payload(model: &std::path::Path, name: &str) -> u64 {
    let bytes = std::fs::read(model.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    ["weight", "scales", "biases"]
        .iter()
        .map(|part| st.tensor(&format!("{name}.{part}")).unwrap().data().len() as u64)
        .sum()
}

/// `--profile-decode` on the device plan (bf16 on the CPU): one row per kernel of the fused
/// step, in each layer the ops of its kind in order, every row timed and moving bytes, the
/// sums per op and per layer kind equal to the rows', the launches of the rows and candle's
/// equal to the step's, and the bytes of the rows computed from the checkpoint's shapes: the
/// output head reads its whole matrix, the gathered expert products only the top-k and shared
/// experts' rows (not the stack), the GDN recurrence its state once each way.
/// A profiling bench run on tiny Qwen3-Next (bf16 on the CPU, `-p 9 -g 1 -r 1 --json`) with
/// `flags`: its `key` report, after checking that stderr's table names `what`.
fn profile_report(flags: &[&str], what: &str, key: &str) -> Json {
    profile_reports(flags, &[what])[key].clone()
}

/// The whole `--json` report of a bench on the tiny Qwen3-Next (bf16, fused) with `flags`,
/// whose stderr holds a profile table for each of `whats`.
fn profile_reports(flags: &[&str], whats: &[&str]) -> Json {
    let model = fixture("qwen3-next-tiny-4bit");
    let mut args = vec!["--dtype", "bf16", "-p", "9", "-g", "1", "-r", "1", "--json"];
    args.extend(flags);
    let out = run_model("bench", &model, &args);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let err = stderr(&out);
    for what in whats {
        assert!(
            err.contains(&format!("decode profile (cpu): {what} at position")),
            "{err}"
        );
    }
    assert!(err.contains("by layer kind"), "{err}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn decode_profile() {
    let model = fixture("qwen3-next-tiny-4bit");
    let p = &profile_report(
        &["--profile-decode"],
        "one fused decode step",
        "decode_profile",
    );
    assert_eq!(p["backend"], "cpu");
    // 9 prompt tokens, a warm-up and 5 timed steps before the profiled one.
    assert_eq!(p["position"], 9 + 1 + 5);
    positive_finite(&p["copy_bandwidth"]["bytes_per_second"], "copy bandwidth");
    let rows = p["kernels"].as_array().unwrap();

    // Tiny Qwen3-Next: layers 2 and 5 attention, the rest GDN, a MoE block (top-2 of 8 and
    // a shared expert) in each.
    let moe = [
        ("affine_products", "moe.router"),
        ("moe_route", ""),
        ("affine_products_swiglu", "moe.gate_up"),
        ("affine_products_gathered", "moe.down"),
        ("moe_combine", ""),
    ];
    let gdn = [
        ("affine_products", "gdn.in_proj"),
        ("gdn_conv_prep", ""),
        ("gated_delta_norm", ""),
        ("affine_products", "gdn.out_proj"),
        ("add_rms_norm", ""),
    ];
    let attention = [
        ("affine_products", "attn.qkv"),
        ("attn_prep", ""),
        ("attn_decode", ""),
        ("affine_products", "attn.o_proj"),
        ("add_rms_norm", ""),
    ];
    let mut want: Vec<(Option<u64>, &str, &str, &str)> = vec![
        (None, "outside", "affine_dequantize", "embed"),
        (None, "outside", "add_rms_norm", ""),
    ];
    for layer in 0..6u64 {
        let (kind, mixer) = if layer % 3 == 2 {
            ("attention", &attention)
        } else {
            ("gdn", &gdn)
        };
        for (op, label) in mixer.iter().chain(&moe) {
            want.push((Some(layer), kind, op, label));
        }
    }
    want.push((None, "outside", "affine_products", "lm_head"));
    let got: Vec<(Option<u64>, &str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["layer"].as_u64(),
                r["layer_kind"].as_str().unwrap(),
                r["op"].as_str().unwrap(),
                r["label"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(got, want);

    // Launches: one per row on the CPU, plus the logits' cast (candle), the whole step.
    let launches = &p["launches"];
    assert_eq!(launches["kernels"].as_u64().unwrap(), rows.len() as u64);
    assert_eq!(launches["candle"], 1);
    assert_eq!(
        launches["total"].as_u64().unwrap(),
        rows.len() as u64 + 1,
        "{launches}"
    );

    let (mut seconds, mut read, mut written) = (0.0, 0u64, 0u64);
    for r in rows {
        seconds += positive_finite(&r["seconds"], "seconds");
        read += positive_finite(&r["bytes_read"], "bytes_read") as u64;
        written += positive_finite(&r["bytes_written"], "bytes_written") as u64;
        positive_finite(&r["bytes_per_second"], "bytes_per_second");
        assert_eq!(r["launches"], 1, "{r}");
        assert_eq!(
            r["grids"].as_array().unwrap().len(),
            0,
            "no grid on the CPU: {r}"
        );
    }
    for key in ["by_op", "by_layer_kind"] {
        let sums = p[key].as_array().unwrap();
        let total = |field: &str| -> f64 { sums.iter().map(|s| s[field].as_f64().unwrap()).sum() };
        assert!(
            (total("seconds") - seconds).abs() <= 1e-9 * rows.len() as f64,
            "{key}"
        );
        assert_eq!(total("bytes_read") as u64, read, "{key}");
        assert_eq!(total("bytes_written") as u64, written, "{key}");
        assert_eq!(total("calls") as usize, rows.len(), "{key}");
    }
    let kinds: Vec<(&str, u64, u64)> = p["by_layer_kind"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["key"].as_str().unwrap(),
                s["layers"].as_u64().unwrap(),
                s["calls"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [("gdn", 4, 40), ("attention", 2, 20), ("outside", 0, 3)]
    );
    let rows_seconds = p["rows_seconds"].as_f64().unwrap();
    assert!((rows_seconds - seconds).abs() <= 1e-9 * rows.len() as f64);
    let wall = positive_finite(&p["wall_seconds"], "wall_seconds");
    let remainder = p["remainder_seconds"].as_f64().unwrap();
    assert!((remainder - (wall - rows_seconds)).abs() < 1e-9);

    // Bytes from the checkpoint's shapes (bf16 activations: 2 bytes).
    let (hidden, vocab, bits, group) = (128u64, 2048u64, 4u64, 64u64);
    let (top_k, experts, moe_inter) = (2u64, 8u64, 64u64);
    // A 4-bit g64 matrix: packed values and a bf16 scale and bias per group.
    let matrix =
        |rows: u64, cols: u64, bits: u64| rows * cols * bits / 8 + 2 * rows * (cols / group) * 2;
    let row = |label: &str, layer: Option<u64>| {
        rows.iter()
            .find(|r| r["label"] == label && r["layer"].as_u64() == layer)
            .unwrap_or_else(|| panic!("no {label} row"))
    };
    let bytes = |r: &Json| {
        (
            r["bytes_read"].as_u64().unwrap(),
            r["bytes_written"].as_u64().unwrap(),
        )
    };
    // The output head: its whole matrix and the normed hidden state; the logits in bf16.
    let head = matrix(vocab, hidden, bits);
    assert_eq!(head, quantized_payload(&model, "lm_head"));
    assert_eq!(bytes(row("lm_head", None)), (head + 2 * hidden, 2 * vocab));
    // The GDN in-projection (qkvz and ba merged) of layer 0.
    let in_proj = quantized_payload(&model, "model.layers.0.linear_attn.in_proj_qkvz")
        + quantized_payload(&model, "model.layers.0.linear_attn.in_proj_ba");
    let (qkvz, ba) = (384u64, 8u64);
    assert_eq!(in_proj, matrix(qkvz + ba, hidden, bits));
    assert_eq!(
        bytes(row("gdn.in_proj", Some(0))),
        (in_proj + 2 * hidden, 2 * (qkvz + ba))
    );
    // The gathered down product reads the matrices of its 3 slots (top-2 and the shared
    // expert), not of the 9 stacked experts, and the slots' activations and ids.
    let slots = top_k + 1;
    let down = matrix(hidden, moe_inter, bits);
    assert_eq!(
        experts * down,
        quantized_payload(&model, "model.layers.0.mlp.switch_mlp.down_proj")
    );
    let (down_read, down_written) = bytes(row("moe.down", Some(0)));
    assert_eq!(down_read, slots * down + slots * moe_inter * 2 + slots * 4);
    assert!(down_read < (experts + 1) * down / 2);
    assert_eq!(down_written, slots * hidden * 2);
    // Gate and up with the SwiGLU: each slot's gate and up rows.
    let gate_up = 2 * matrix(moe_inter, hidden, bits);
    assert_eq!(
        bytes(row("moe.gate_up", Some(0))),
        (
            slots * gate_up + hidden * 2 + slots * 4,
            slots * moe_inter * 2
        )
    );
    // The recurrence and its norm: the f32 state [Hv, Dv, Dk] read and written once.
    let state = 4 * 32 * 32 * 4;
    let norm = rows
        .iter()
        .find(|r| r["op"] == "gated_delta_norm" && r["layer"] == 0)
        .unwrap();
    let (hv_dv, dk_heads) = (4 * 32u64, 2 * 32u64);
    // q, k (bf16), v (bf16), g and beta (f32), z (bf16), the norm weight [Dv] (bf16).
    let inputs = 2 * dk_heads * 2 + hv_dv * 2 + 2 * 4 * 4 + hv_dv * 2 + 32 * 2;
    assert_eq!(bytes(norm), (state + inputs, state + hv_dv * 2));
    // The conv front: qkv (C = 256 channels), b and a (Hv each), the conv state [K-1, C] and
    // the taps [K, C] in bf16, dt_bias and neg_a_exp in f32; q, k, v, g, beta (f32) and the
    // state written.
    let conv = rows
        .iter()
        .find(|r| r["op"] == "gdn_conv_prep" && r["layer"] == 0)
        .unwrap();
    let (channels, conv_state) = (256u64, 3 * 256 * 2u64);
    assert_eq!(
        bytes(conv),
        (
            channels * 2 + 2 * 4 * 2 + conv_state + 4 * channels * 2 + 2 * 4 * 4,
            channels * 2 + 2 * 4 * 4 + conv_state
        )
    );
    // Attention reads the keys and values of the positions so far, its own included (2 KV
    // heads of 64), not the buffers' capacity; q, gate and the position.
    let position = p["position"].as_u64().unwrap();
    let attn = rows
        .iter()
        .find(|r| r["op"] == "attn_decode" && r["layer"] == 2)
        .unwrap();
    let kv = 2 * 2 * (position + 1) * 64 * 2;
    assert_eq!(bytes(attn), (2 * 4 * 64 * 2 + 4 + kv, 4 * 64 * 2));
}

/// `--profile-verify T` profiles one fused verify pass of T tokens: every product, norm, the
/// conv front, the GDN recurrence (the window kernel) and attention (the slot kernel) once per
/// layer over the T rows, each row placed in its layer and timed; the pass keeps
/// one token, so the profiled one runs after the prompt, a warm-up and 5 timed passes.
#[test]
fn verify_profile() {
    let t = 3;
    let p = &profile_report(
        &["--profile-verify", "3"],
        "one fused verify pass of 3 tokens (closed on one)",
        "verify_profile",
    );
    assert_eq!(p["position"], 9 + 1 + 5);
    let rows = p["kernels"].as_array().unwrap();
    let calls = |layer: u64, op: &str| calls_in(p, layer, op);
    // Tiny Qwen3-Next: layers 2 and 5 attention, the rest GDN, a MoE block in each. The GDN
    // recurrence walks the window's tokens in one launch (`gated_delta_norm_window`, the
    // default `QWEN_GDN_VERIFY_WINDOW=one-launch`), and attention attends all of them in one
    // launch of the slot kernel (`attn_decode_slots`): nothing runs once a token any more.
    for layer in 0..6u64 {
        let (op, per_token) = match layer % 3 == 2 {
            true => ("attn_decode_slots", "attn_decode"),
            false => ("gated_delta_norm_window", "gated_delta_norm"),
        };
        assert_eq!(calls(layer, op), 1, "layer {layer}: {op}");
        assert_eq!(
            calls(layer, per_token),
            0,
            "layer {layer}: {per_token} per token"
        );
        assert_once_over_rows(&calls, layer, t);
    }
    for r in rows {
        positive_finite(&r["seconds"], "seconds");
        assert!(r["layer"].is_u64() || r["layer_kind"] == "outside", "{r}");
    }
}

/// The rows of `profile` for op `op` in layer `layer`.
fn calls_in(profile: &Json, layer: u64, op: &str) -> usize {
    let rows = profile["kernels"].as_array().unwrap();
    rows.iter()
        .filter(|r| r["layer"] == layer && r["op"] == op)
        .count()
}

/// A layer of the tiny Qwen3-Next in a profile over several rows (`calls(layer, op)`): its MoE
/// kernels and its three products (the mixer's two and the router) each once over the `rows`.
fn assert_once_over_rows(calls: &dyn Fn(u64, &str) -> usize, layer: u64, rows: usize) {
    for op in [
        "affine_products_swiglu",
        "affine_products_gathered",
        "moe_route",
        "moe_combine",
    ] {
        assert_eq!(
            calls(layer, op),
            1,
            "layer {layer}: {op} over the {rows} rows"
        );
    }
    assert_eq!(calls(layer, "affine_products"), 3, "layer {layer}");
}

/// `--profile-batch B`: one batched step of B sequences, every kernel placed in its layer,
/// each run once over the B rows (the products over the rows, the GDN and attention state
/// kernels over the B sequences' slots), and the state kernels moving B sequences' states:
/// at least B times what the single step's moves.
#[test]
fn batch_profile() {
    let b = 3;
    let report = profile_reports(
        &["--profile-decode", "--profile-batch", "3"],
        &[
            "one fused decode step",
            "one fused batched decode step of 3 sequences",
        ],
    );
    let (one, p) = (&report["decode_profile"], &report["batch_profile"]);
    assert_eq!(p["sequences"], b);
    // Sequence 0: 9 prompt tokens, a warm-up and 5 timed steps before the profiled one.
    assert_eq!(p["position"], 9 + 1 + 5);
    let rows = p["kernels"].as_array().unwrap();
    let calls = |layer: u64, op: &str| calls_in(p, layer, op);
    let read = |profile: &Json, layer: u64, op: &str| -> u64 {
        profile["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["layer"] == layer && r["op"] == op)
            .map(|r| r["bytes_read"].as_u64().unwrap())
            .sum()
    };
    // Tiny Qwen3-Next: layers 2 and 5 attention, the rest GDN, a MoE block in each.
    for layer in 0..6u64 {
        let (state, alone) = match layer % 3 == 2 {
            true => (["attn_prep_slots", "attn_decode_slots"], "attn_decode"),
            false => (
                ["gdn_conv_prep_slots", "gated_delta_norm_slots"],
                "gated_delta_norm",
            ),
        };
        for op in state {
            assert_eq!(calls(layer, op), 1, "layer {layer}: {op} over the {b} rows");
        }
        assert_once_over_rows(&calls, layer, b);
        let (batched, single) = (read(p, layer, state[1]), read(one, layer, alone));
        assert!(
            single > 0 && batched >= b as u64 * single * 9 / 10,
            "layer {layer}: {} read {batched} bytes for {b} sequences, {alone} {single} for one",
            state[1]
        );
    }
    for r in rows {
        positive_finite(&r["seconds"], "seconds");
        assert!(r["layer"].is_u64() || r["layer_kind"] == "outside", "{r}");
    }
}

/// The profile is of the fused decode step: the reference plan (f32 on the CPU) has none,
/// and says what to use instead.
#[test]
fn decode_profile_needs_the_fused_step() {
    let out = bench(&["-p", "4", "-g", "1", "-r", "1", "--profile-decode"]);
    assert_error(&out, &["--profile-decode", "--dtype bf16"]);
}

#[test]
fn batch_json_report() {
    let out = bench(&["-p", "4", "-g", "3", "-r", "1", "--batch", "1,3", "--json"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["batch"].as_array().expect("a batch array");
    assert_eq!(rows.len(), 2, "{report}");
    for (row, b) in rows.iter().zip([1.0, 3.0]) {
        assert_eq!(row["batch"].as_f64(), Some(b), "{row}");
        let aggregate = positive_finite(&row["aggregate_tps"]["median"], "aggregate");
        let each = positive_finite(&row["per_sequence_tps"]["median"], "per sequence");
        // Both from the same timed steps: B sequences' tokens against one sequence's.
        assert!((aggregate / each - b).abs() < 1e-9, "{row}");
    }
    // The CPU's default keeps each row's bits; --batch-products picks the other form.
    assert_eq!(report["batch_products"], "EachRowAlone", "{report}");
    let out = bench(&[
        "-p",
        "4",
        "-g",
        "2",
        "-r",
        "1",
        "--batch",
        "2",
        "--batch-products",
        "shared",
        "--json",
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["batch_products"], "Shared", "{report}");
    let out = bench(&["--batch", "2,0"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--batch"), "{}", stderr(&out));
    let out = bench(&["--batch-products", "shared"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--batch"), "{}", stderr(&out));
}

/// `bench --draft-tokens N|auto --json` on the trained MTP fixture: the `speculative` object,
/// its counts consistent with each other, its speed positive, and its greedy tokens plain
/// decoding's. Speeds are not compared (the machine may be loaded).
#[test]
fn speculative_json_report() {
    let model = repo_root().join("models/mtp/qwen3.5-mtp-tiny-hf");
    for (flag, want) in [("2", Json::from(2)), ("auto", Json::from("auto"))] {
        let out = run(&[
            "bench",
            "--model",
            model.to_str().unwrap(),
            "-p",
            "16",
            "-g",
            "24",
            "-r",
            "1",
            "--json",
            "--draft-tokens",
            flag,
        ]);
        assert!(out.status.success(), "stderr: {}", stderr(&out));
        let report: Json = serde_json::from_slice(&out.stdout).unwrap();
        let spec = &report["speculative"];
        assert_eq!(spec["draft_tokens"], want, "{spec}");
        assert_eq!(spec["same_tokens"], true, "{spec}");
        let median = positive_finite(&spec["generation_tps"]["median"], "speculative tg");
        let plain = positive_finite(&report["generation_tps"]["median"], "tg");
        let speedup = positive_finite(&spec["speedup"], "speedup");
        assert!((speedup - median / plain).abs() < 1e-9 * speedup);
        let count = |key: &str| {
            spec[key]
                .as_u64()
                .unwrap_or_else(|| panic!("{key}: {spec}"))
        };
        let (steps, drafted, accepted) = (count("steps"), count("drafted"), count("accepted"));
        let steps_at: Vec<u64> = serde_json::from_value(spec["steps_at"].clone()).unwrap();
        assert_eq!(steps_at.iter().sum::<u64>(), steps);
        let by_k: u64 = steps_at.iter().enumerate().map(|(k, n)| k as u64 * n).sum();
        assert_eq!(by_k, drafted);
        assert!(accepted <= drafted);
        // 24 tokens after the first: one per step plus the accepted drafts.
        assert_eq!(accepted + steps, 24, "{spec}");
        let close = |key: &str, want: f64| {
            let got = spec[key].as_f64().unwrap();
            assert!((got - want).abs() < 1e-12, "{key}: {got} vs {want}");
        };
        close("acceptance", accepted as f64 / drafted as f64);
        close("tokens_per_step", 24.0 / steps as f64);
        close("mean_draft_tokens", drafted as f64 / steps as f64);
        if flag == "2" {
            assert_eq!(steps_at.len(), 3);
        }
    }
    // Batched decode and the prompt-cache scenario do not take it.
    for other in [&["--batch", "1,2"][..], &["--prompt-cache", "8"]] {
        let mut args = vec![
            "bench",
            "--model",
            model.to_str().unwrap(),
            "--draft-tokens",
            "2",
        ];
        args.extend(other);
        let out = run(&args);
        assert!(!out.status.success(), "{other:?} was accepted");
        assert!(stderr(&out).contains("--draft-tokens"), "{}", stderr(&out));
    }
}

/// `bench --verify-cost K --json`: a verify pass timed for k = 0..=K, its ratios to the
/// one-token pass, and the projection recomputed from the reported times (the formula of
/// verify_cost.rs: (1 − a^(k+1)) / (1 − a) tokens over t(k+1) plus k estimated draft calls).
#[test]
fn verify_cost_json_report() {
    let out = bench(&[
        "-p",
        "16",
        "-g",
        "4",
        "-r",
        "1",
        "--json",
        "--verify-cost",
        "3",
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    let cost = &report["verify_cost"];
    let passes: Vec<f64> = (0..4)
        .map(|k| positive_finite(&cost["pass_seconds"][k]["median"], "pass"))
        .collect();
    assert!(cost["pass_seconds"][4].is_null(), "{cost}");
    let ratios: Vec<f64> = serde_json::from_value(cost["ratio_to_one_token"].clone()).unwrap();
    assert_eq!(ratios[0], 1.0);
    for k in 0..4 {
        assert!((ratios[k] - passes[k] / passes[0]).abs() < 1e-9, "{cost}");
    }
    let tg_step = positive_finite(&cost["tg_step_seconds"], "tg step");
    let tg = positive_finite(&report["generation_tps"]["median"], "tg");
    assert!((tg_step - 1.0 / tg).abs() < 1e-9 * tg_step);
    let head = positive_finite(&cost["output_head_seconds"]["median"], "head");
    let draft = positive_finite(&cost["draft_call_estimate_seconds"], "draft call");
    let config: Json = serde_json::from_str(
        &std::fs::read_to_string(fixture("qwen3.5-moe-tiny-4bit").join("config.json")).unwrap(),
    )
    .unwrap();
    let layers = config["text_config"]["num_hidden_layers"].as_f64().unwrap();
    let want_draft = head + (tg_step - head).max(0.0) / layers;
    assert!(
        (draft - want_draft).abs() < 1e-9 * draft,
        "{draft} vs {want_draft}"
    );
    let projected = cost["projected_tps"].as_array().unwrap();
    assert_eq!(projected.len(), 3);
    for (i, row) in projected.iter().enumerate() {
        let k = i + 1;
        assert_eq!(row["k"], k);
        for cell in row["by_acceptance"].as_array().unwrap() {
            let a = cell["acceptance"].as_f64().unwrap();
            let want = (1.0 - a.powi(k as i32 + 1)) / (1.0 - a) / (passes[k] + k as f64 * draft);
            let got = positive_finite(&cell["tps"], "projected tps");
            assert!(
                (got - want).abs() < 1e-9 * want,
                "k={k} a={a}: {got} vs {want}"
            );
        }
    }
    // The reference plan has no fused step: the composed verify, whose logits are read back.
    assert_eq!(cost["fused"], false, "{cost}");
    let read_backs: Vec<usize> = serde_json::from_value(cost["pass_read_backs"].clone()).unwrap();
    assert!(read_backs.iter().all(|&r| r >= 1), "{cost}");
    // The device plan (bf16 on the CPU): the fused verify, whose only read-back is the
    // logits', and whose launches do not grow with its rows past two (every part of the pass
    // runs once over the window: the recurrence and the attention included).
    let out = bench(&[
        "-p",
        "16",
        "-g",
        "2",
        "-r",
        "1",
        "--json",
        "--dtype",
        "bf16",
        "--verify-cost",
        "3",
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    let cost = &report["verify_cost"];
    assert_eq!(cost["fused"], true, "{cost}");
    let read_backs: Vec<usize> = serde_json::from_value(cost["pass_read_backs"].clone()).unwrap();
    assert_eq!(read_backs, [1, 1, 1, 1], "{cost}");
    let launches: Vec<usize> = serde_json::from_value(cost["pass_launches"].clone()).unwrap();
    assert!(launches[1] > launches[0], "{launches:?}");
    assert!(launches[1] < 2 * launches[0], "{launches:?}");
    assert!(
        launches[2..].iter().all(|&l| l == launches[1]),
        "{launches:?}"
    );
    // A prompt shorter than the window is refused in one line.
    let out = bench(&["-p", "2", "-g", "2", "-r", "1", "--verify-cost", "3"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--verify-cost 3") && err.lines().count() <= 2,
        "{err}"
    );
}
