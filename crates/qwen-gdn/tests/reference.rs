//! End-to-end checks against mlx-lm's recorded outputs for the tiny checkpoints
//! (models/reference/<name>.json and .safetensors, made by scripts/gen_fixtures.py), and
//! against transformers' for the two qwen4_exp fixtures (raw HF and mlx-vlm 4-bit layouts).

mod common;

use common::*;
use serde_json::Value as Json;
use std::path::Path;
use tokenizers::Tokenizer;

/// Checkpoints with recorded references.
fn references() -> Vec<(String, Json)> {
    let dir = repo_root().join("models/reference");
    let mut refs: Vec<(String, Json)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            (
                p.file_stem().unwrap().to_string_lossy().into_owned(),
                serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap(),
            )
        })
        .collect();
    refs.sort_by(|a, b| a.0.cmp(&b.0));
    for name in QWEN4_EXP {
        assert!(
            refs.iter().any(|(n, _)| n == name),
            "{name}: no reference in {}",
            dir.display()
        );
    }
    refs
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn eos_ids(model: &Path) -> Vec<u32> {
    let g: Json =
        serde_json::from_slice(&std::fs::read(model.join("generation_config.json")).unwrap())
            .unwrap();
    match &g["eos_token_id"] {
        Json::Array(_) => ids(&g["eos_token_id"]),
        n => vec![n.as_u64().unwrap() as u32],
    }
}

/// What `generate` must print for mlx-lm's greedy tokens: it stops at the first EOS (counted,
/// not printed), and the references were recorded without stopping.
fn expected(tokenizer: &Tokenizer, greedy: &[u32], eos: &[u32]) -> (String, usize) {
    let n = greedy
        .iter()
        .position(|t| eos.contains(t))
        .map_or(greedy.len(), |i| i + 1);
    let text_ids: Vec<u32> = greedy[..n]
        .iter()
        .copied()
        .filter(|t| !eos.contains(t))
        .collect();
    (tokenizer.decode(&text_ids, false).unwrap(), n)
}

fn stat(stderr: &str, key: &str) -> usize {
    let line = stderr
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in {stderr}"));
    line[key.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn greedy_generation_matches_mlx_lm() {
    let mut failures = Vec::new();
    for (name, r) in references() {
        let model = fixture(&name);
        let tokenizer = Tokenizer::from_file(model.join("tokenizer.json")).unwrap();
        let eos = eos_ids(&model);
        let prompt = r["greedy_prompt"].as_str().unwrap();
        for (kind, raw, prompt_ids, greedy) in [
            ("raw", true, &r["greedy_prompt_ids"], &r["greedy_ids"]),
            ("chat", false, &r["chat_prompt_ids"], &r["chat_greedy_ids"]),
        ] {
            // transformers' references (qwen4_exp) record the raw prompt only; its chat
            // template is checked by `qwen4_exp_chat_template_from_the_checkpoint`.
            if greedy.is_null() {
                continue;
            }
            let mut args = vec!["--prompt", prompt, "--max-tokens", "32", "--temp", "0"];
            if raw {
                args.push("--ignore-chat-template");
            }
            let out = run_model("generate", &model, &args);
            let err = stderr(&out);
            if !out.status.success() {
                failures.push(format!("{name} {kind}: {err}"));
                continue;
            }
            let stdout = String::from_utf8(out.stdout).unwrap();
            let text = stdout
                .strip_prefix("==========\n")
                .and_then(|s| s.strip_suffix("\n==========\n"))
                .expect(&stdout);
            let (want, n) = expected(&tokenizer, &ids(greedy), &eos);
            let prompt_len = prompt_ids.as_array().unwrap().len();
            if text != want
                || stat(&err, "Generation: ") != n
                || stat(&err, "Prompt: ") != prompt_len
            {
                failures.push(format!(
                    "{name} {kind}: got {text:?}\nwant {want:?} ({n} tokens, prompt {prompt_len})\n{err}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The recorded teacher-forced ids and their logits ([ids, vocab] row-major), and vocab.
fn teacher_forced(name: &str) -> (Vec<u32>, Vec<f32>, usize) {
    let path = repo_root().join(format!("models/reference/{name}.safetensors"));
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let words = |key: &str| -> Vec<[u8; 4]> {
        let data = st.tensor(key).unwrap().data().to_vec();
        data.chunks_exact(4)
            .map(|b| b.try_into().unwrap())
            .collect()
    };
    let ids = words("tf_ids")
        .into_iter()
        .map(|b| i32::from_le_bytes(b) as u32)
        .collect();
    let logits = words("tf_logits")
        .into_iter()
        .map(f32::from_le_bytes)
        .collect();
    (ids, logits, st.tensor("tf_logits").unwrap().shape()[1])
}

/// The text whose tokens are the reference's `tf_ids`: `text` itself, or, where the ids are
/// not its plain tokenization (`tf_ids_note`: transformers' qwen4_exp reference inserts an
/// `<|im_end|>` to cut the n-grams), the ids decoded with their special tokens.
fn scored_text(model: &Path, name: &str, r: &Json) -> String {
    if r["tf_ids_note"].is_null() {
        return r["text"].as_str().unwrap().to_string();
    }
    let tokenizer = Tokenizer::from_file(model.join("tokenizer.json")).unwrap();
    tokenizer.decode(&teacher_forced(name).0, false).unwrap()
}

/// log_softmax at each next token, the argmax of each row, and max|logit| (the scale of the
/// model issue's tolerance).
fn scores(logits: &[f32], vocab: usize, tokens: &[u32]) -> (Vec<f32>, Vec<u32>, f32) {
    let (mut lp, mut am, mut scale) = (Vec::new(), Vec::new(), 0f32);
    for (i, row) in logits
        .chunks_exact(vocab)
        .take(tokens.len() - 1)
        .enumerate()
    {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = max + row.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
        lp.push(row[tokens[i + 1] as usize] - lse);
        am.push(
            row.iter()
                .enumerate()
                .fold(0, |b, (j, &l)| if l > row[b] { j } else { b }) as u32,
        );
        scale = row.iter().fold(scale, |s, l| s.max(l.abs()));
    }
    (lp, am, scale)
}

#[test]
fn eval_json_matches_mlx_lm_logprobs() {
    let mut failures = Vec::new();
    for (name, r) in references() {
        let model = fixture(&name);
        let text = scored_text(&model, &name, &r);
        // A chunk size below the text length exercises chunked scoring too.
        let out = run_model(
            "eval",
            &model,
            &["--text", &text, "--json", "--prefill-chunk-size", "37"],
        );
        if !out.status.success() {
            failures.push(format!("{name}: {}", stderr(&out)));
            continue;
        }
        let got: Json = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            got.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["tokens", "logprobs", "argmax", "ppl"]
        );
        let tokens = ids(&got["tokens"]);
        let (tf_ids, logits, vocab) = teacher_forced(&name);
        assert_eq!(tokens, tf_ids, "{name}: tokenization differs from mlx-lm's");
        let (want_lp, want_am, scale) = scores(&logits, vocab, &tokens);
        let lp: Vec<f32> = got["logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let worst = lp
            .iter()
            .zip(&want_lp)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        // The model issue's gate is 1e-3 * max|logit| on logits; a log-prob sums two such errors.
        if lp.len() != want_lp.len() || worst > 2e-3 * scale {
            failures.push(format!(
                "{name}: logprobs differ by up to {worst} (scale {scale})"
            ));
        }
        if ids(&got["argmax"]) != want_am {
            failures.push(format!("{name}: argmax differs"));
        }
        let ppl = (-lp.iter().map(|&l| l as f64).sum::<f64>() / lp.len() as f64).exp();
        assert!(
            (got["ppl"].as_f64().unwrap() / ppl - 1.0).abs() < 1e-5,
            "{name}: ppl"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn quiet_output_and_sampling_flags() {
    let model = fixture("qwen3.5-tiny-4bit");
    let args = [
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "12",
        "--verbose",
        "false",
    ];
    let greedy = run_model("generate", &model, &args);
    assert!(
        greedy.status.success() && greedy.stderr.is_empty(),
        "{}",
        stderr(&greedy)
    );
    assert!(!String::from_utf8_lossy(&greedy.stdout).contains("=========="));
    let sampled = |seed: &str| {
        let mut a = args.to_vec();
        a.extend([
            "--temp",
            "0.8",
            "--top-p",
            "0.95",
            "--top-k",
            "50",
            "--min-p",
            "0.01",
            "--repetition-penalty",
            "1.3",
            "--seed",
            seed,
        ]);
        let out = run_model("generate", &model, &a);
        assert!(out.status.success(), "{}", stderr(&out));
        out.stdout
    };
    assert_eq!(
        sampled("7"),
        sampled("7"),
        "a seed makes sampling reproducible"
    );
    assert_ne!(sampled("7"), sampled("8"));
    // Thinking off changes the chat prompt of Qwen3.5 (an empty think block is prefilled).
    let prompt_tokens = |extra: &[&str]| {
        let out = generate_hi(&model, "1", extra);
        assert!(out.status.success(), "{}", stderr(&out));
        stat(&stderr(&out), "Prompt: ")
    };
    let on = prompt_tokens(&[]);
    let off = prompt_tokens(&["--enable-thinking", "false"]);
    assert!(off > on);
    assert_eq!(
        prompt_tokens(&["--chat-template-args", r#"{"enable_thinking": false}"#]),
        off
    );
    assert!(prompt_tokens(&["--system-prompt", "Be brief."]) > on);
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_generation_and_prints_stats() {
    let model = fixture("qwen3.5-tiny-4bit");
    let mut child = model_command(
        "generate",
        &model,
        &[
            "--prompt",
            "Tell me everything.",
            "--max-tokens",
            "4000",
            "--ignore-chat-template",
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // Interrupt once generated text streams (after the 11-byte "==========\n").
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    while seen.len() < 16 {
        let mut buf = [0u8; 64];
        let n = std::io::Read::read(&mut stdout, &mut buf).unwrap();
        assert!(n > 0, "generation ended before it could be interrupted");
        seen.extend_from_slice(&buf[..n]);
    }
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    std::io::Read::read_to_end(&mut stdout, &mut seen).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{err}");
    let n = stat(&err, "Generation: ");
    assert!(n > 0 && n < 4000, "{err}");
    assert!(err.contains("Peak memory: "), "{err}");
    assert!(String::from_utf8_lossy(&seen).ends_with("\n==========\n"));
}

/// qwen4_exp's chat template comes from its checkpoint (chat_template.jinja): the rendered
/// prompt wraps the message in its turn markers, and generation runs on it, in both layouts.
#[test]
fn qwen4_exp_chat_template_from_the_checkpoint() {
    for name in QWEN4_EXP {
        chat_template_from_the_checkpoint(name);
    }
}

/// `generate --prompt Hi --max-tokens <max_tokens>` with `extra`.
fn generate_hi(model: &Path, max_tokens: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["--prompt", "Hi", "--max-tokens", max_tokens];
    args.extend(extra);
    run_model("generate", model, &args)
}

fn chat_template_from_the_checkpoint(name: &str) {
    let model = fixture(name);
    let prompt_tokens = |extra: &[&str]| {
        let out = generate_hi(&model, "4", extra);
        let err = stderr(&out);
        assert!(out.status.success(), "{name}: {err}");
        assert!(
            (1..=4).contains(&stat(&err, "Generation: ")),
            "{name}: {err}"
        );
        stat(&err, "Prompt: ")
    };
    let raw = prompt_tokens(&["--ignore-chat-template"]);
    let chat = prompt_tokens(&[]);
    assert!(
        chat > raw + 4,
        "{name}: chat prompt {chat} tokens, raw {raw}"
    );
    assert!(prompt_tokens(&["--system-prompt", "Be brief."]) > chat);
    // The device plan (bf16 activations, composed ops) runs the same prompt.
    assert_eq!(prompt_tokens(&["--dtype", "bf16"]), chat, "{name}");
}
