//! `generate` and `chat` with `--draft-tokens N|auto`: speculative decoding with the
//! checkpoint's MTP head gives the same text as plain greedy decoding (in chat across turns,
//! with the prompt cache), reports its acceptance and the draft lengths used, and refuses a
//! checkpoint without a head in one line (the MTP fixtures live in models/mtp/).

mod common;
use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Output;

/// Every MTP fixture: the three raw HF ones and the 4-bit MLX twin.
const MTP_FIXTURES: [&str; 4] = [
    "qwen3.5-mtp-tiny-hf",
    "qwen3-next-mtp-tiny-hf",
    "qwen3.5-moe-mtp-tiny-hf",
    "qwen3.5-mtp-tiny-4bit",
];

fn mtp_fixture(name: &str) -> PathBuf {
    fixture(&format!("mtp/{name}"))
}

/// `generate` with `args` and then `--draft-tokens k` for each of `ks` on `model`: every
/// speculative run gives plain decoding's text and one stats line, returned with the run's
/// arguments.
fn speculative_runs<'a>(
    model: &Path,
    args: &[&'a str],
    ks: &[&'a str],
) -> Vec<(Vec<&'a str>, String)> {
    let plain = generate(model, args);
    assert!(plain.status.success(), "{}", stderr(&plain));
    ks.iter()
        .map(|&k| {
            let mut with = args.to_vec();
            with.extend(["--draft-tokens", k]);
            let spec = generate(model, &with);
            assert!(spec.status.success(), "{}", stderr(&spec));
            assert_eq!(spec.stdout, plain.stdout, "{}: k = {k}", model.display());
            let lines = speculative_lines(&spec);
            assert_eq!(lines.len(), 1, "{}", stderr(&spec));
            let line = lines[0].clone();
            assert!(
                line.contains("acceptance") && line.contains("tokens per verify step"),
                "{line}"
            );
            (with, line)
        })
        .collect()
}

#[test]
fn speculation_gives_the_text_of_plain_greedy_decoding() {
    for name in [
        "qwen3.5-mtp-tiny-hf",
        "qwen3-next-mtp-tiny-hf",
        "qwen3.5-mtp-tiny-4bit",
    ] {
        let model = mtp_fixture(name);
        let args = ["--max-tokens", "48", "--prompt", "Tell me about the sea."];
        let plain = generate(&model, &args);
        for (mut with, _) in speculative_runs(&model, &args, &["1", "3", "auto"]) {
            // --no-mtp turns it off.
            with.push("--no-mtp");
            let off = generate(&model, &with);
            assert_eq!(off.stdout, plain.stdout);
            assert!(!stderr(&off).contains("Speculative: "));
        }
    }
}

#[test]
fn draft_tokens_without_a_head_is_a_one_line_error() {
    let out = generate(&fixture("qwen3.5-tiny-4bit"), &["--draft-tokens", "2"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("no MTP head"), "{err}");
}

#[test]
fn draft_tokens_are_bounded() {
    for bad in ["0", "17"] {
        let out = generate(
            &mtp_fixture("qwen3.5-mtp-tiny-hf"),
            &["--draft-tokens", bad],
        );
        assert!(!out.status.success(), "--draft-tokens {bad} was accepted");
    }
}

/// The `Speculative: ` lines of a run's stderr.
fn speculative_lines(out: &Output) -> Vec<String> {
    stderr(out)
        .lines()
        .filter(|l| l.starts_with("Speculative: "))
        .map(str::to_string)
        .collect()
}

/// `--draft-tokens auto` on every fixture, 64 tokens: the greedy text without speculation, and
/// a stats line that names the draft lengths used, whose steps add up.
#[test]
fn adaptive_draft_length_gives_the_text_of_plain_greedy_decoding() {
    for name in MTP_FIXTURES {
        let model = mtp_fixture(name);
        let args = [
            "--max-tokens",
            "64",
            "--temp",
            "0",
            "--prompt",
            "Once upon a time",
        ];
        let plain = generate(&model, &args);
        assert!(plain.status.success(), "{}", stderr(&plain));
        let auto = generate(&model, &[&args[..], &["--draft-tokens", "auto"]].concat());
        assert!(auto.status.success(), "{}", stderr(&auto));
        assert_eq!(
            String::from_utf8_lossy(&auto.stdout),
            String::from_utf8_lossy(&plain.stdout),
            "{name}"
        );
        let lines = speculative_lines(&auto);
        assert_eq!(lines.len(), 1, "{name}: {lines:?}");
        let line = &lines[0];
        eprintln!("{name}: {line}");
        assert!(
            line.starts_with("Speculative: adaptive draft tokens (1–6), k used "),
            "{line}"
        );
        // "k:steps 1:3 2:5 …": lengths within 1..=6 whose counts sum to the steps; the last step
        // may draft fewer (0 when one token is left).
        let per_k = line
            .split("(k:steps ")
            .nth(1)
            .unwrap()
            .split(')')
            .next()
            .unwrap();
        let mut steps_by_k = 0;
        for pair in per_k.split(' ') {
            let (k, n) = pair.split_once(':').unwrap();
            let (k, n): (usize, usize) = (k.parse().unwrap(), n.parse().unwrap());
            assert!(k <= 6 && n > 0, "{line}");
            steps_by_k += n;
        }
        let steps = leading_number(line.rsplit('(').next().unwrap());
        assert_eq!(steps_by_k, steps, "{line}");
    }
}

/// `chat` with `lines` on its stdin, greedy, stats on.
fn chat(model: &Path, extra: &[&str], lines: &[&str]) -> Output {
    let mut args = vec!["--temp", "0", "--max-tokens", "40", "--verbose"];
    args.extend_from_slice(extra);
    let mut child = spawn_piped(&mut model_command("chat", model, &args));
    let input = lines.join("\n") + "\n";
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "chat failed: {}", stderr(&out));
    out
}

/// The `Prompt: ` lines of chat's stats: the prompt tokens, cached and prefilled per turn.
fn prompt_lines(out: &Output) -> Vec<String> {
    stderr(out)
        .lines()
        .filter(|l| l.starts_with("Prompt: "))
        .map(|l| {
            l.split(" tokens-per-sec")
                .next()
                .unwrap()
                .rsplit_once(',')
                .unwrap()
                .0
                .to_string()
        })
        .collect()
}

/// Three turns of `chat`: the streamed replies with speculation (fixed and adaptive) are those
/// without, token for token, and each turn resumes from the prompt cache as far as without.
#[test]
fn chat_replies_with_speculation_are_those_without() {
    let lines = [
        "Hello there",
        "Tell me more about that.",
        "And the third thing?",
    ];
    for name in MTP_FIXTURES {
        let model = mtp_fixture(name);
        let plain = chat(&model, &[], &lines);
        assert!(speculative_lines(&plain).is_empty());
        for k in ["2", "auto"] {
            let spec = chat(&model, &["--draft-tokens", k], &lines);
            assert_eq!(
                String::from_utf8_lossy(&spec.stdout),
                String::from_utf8_lossy(&plain.stdout),
                "{name}: --draft-tokens {k}"
            );
            assert_eq!(
                prompt_lines(&spec),
                prompt_lines(&plain),
                "{name}: --draft-tokens {k}"
            );
            let stats = speculative_lines(&spec);
            assert_eq!(stats.len(), lines.len(), "{name}: {stats:?}");
            eprintln!("{name} k={k}: {stats:?}");
        }
    }
}

#[test]
fn chat_without_a_head_refuses_draft_tokens_in_one_line() {
    let mut child = spawn_piped(&mut model_command(
        "chat",
        &fixture("qwen3.5-tiny-4bit"),
        &["--draft-tokens", "auto"],
    ));
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert_error(&out, &["no MTP head"]);
}

/// `generate --prompt-cache-file` with speculation: the continuation of a saved prefix is the
/// text without speculation (fixed and adaptive), on the trained dense fixture and a MoE one.
#[test]
fn speculation_from_a_prompt_cache_file_gives_the_text_without() {
    for name in ["qwen3.5-mtp-tiny-hf", "qwen3.5-moe-mtp-tiny-hf"] {
        let model = mtp_fixture(name);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("prefix.safetensors");
        let made = run_model(
            "cache-prompt",
            &model,
            &[
                "--prompt",
                "The sea is wide and the",
                "--out",
                file.to_str().unwrap(),
            ],
        );
        assert!(made.status.success(), "{}", stderr(&made));
        let args = [
            "--prompt",
            " waves are tall.",
            "--prompt-cache-file",
            file.to_str().unwrap(),
            "--max-tokens",
            "48",
            "--temp",
            "0",
        ];
        let plain = generate(&model, &args);
        assert!(plain.status.success(), "{}", stderr(&plain));
        for k in ["2", "auto"] {
            let spec = generate(&model, &[&args[..], &["--draft-tokens", k]].concat());
            assert!(spec.status.success(), "{}", stderr(&spec));
            assert_eq!(
                String::from_utf8_lossy(&spec.stdout),
                String::from_utf8_lossy(&plain.stdout),
                "{name}: --draft-tokens {k}"
            );
            assert_eq!(speculative_lines(&spec).len(), 1, "{}", stderr(&spec));
        }
    }
}

/// `--draft-model`: a separate model drafts (here the main model itself, and its 4-bit
/// conversion); the text is plain greedy decoding's and the stats line is printed.
#[test]
fn a_draft_model_gives_the_text_of_plain_greedy_decoding() {
    let model = fixture("qwen3-next-tiny-bf16");
    let args = ["--max-tokens", "32", "--prompt", "Tell me about the sea."];
    let plain = generate(&model, &args);
    assert!(plain.status.success(), "{}", stderr(&plain));
    for draft in ["qwen3-next-tiny-bf16", "qwen3-next-tiny-4bit"] {
        for k in ["2", "auto"] {
            let draft_path = fixture(draft);
            let mut with = args.to_vec();
            with.extend([
                "--draft-model",
                draft_path.to_str().unwrap(),
                "--draft-tokens",
                k,
            ]);
            let spec = generate(&model, &with);
            assert!(spec.status.success(), "{}", stderr(&spec));
            assert_eq!(spec.stdout, plain.stdout, "draft {draft}: k = {k}");
            assert!(
                stderr(&spec)
                    .lines()
                    .any(|l| l.starts_with("Speculative: ")),
                "{}",
                stderr(&spec)
            );
        }
    }
}

/// `--draft-model` on Qwen3.8-Flash-Next (`qwen4_exp`), whose per-layer embedding and QSA
/// indexer state windows rewind by running the kept tokens again: as main and draft model,
/// the text is plain greedy decoding's.
#[test]
fn a_draft_model_gives_the_text_of_plain_greedy_decoding_on_qwen4_exp() {
    let model = fixture("qwen4-exp-tiny-hf");
    let args = ["--max-tokens", "24", "--prompt", "Tell me about the sea."];
    let plain = generate(&model, &args);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let mut with = args.to_vec();
    with.extend([
        "--draft-model",
        model.to_str().unwrap(),
        "--draft-tokens",
        "3",
    ]);
    let spec = generate(&model, &with);
    assert!(spec.status.success(), "{}", stderr(&spec));
    assert_eq!(spec.stdout, plain.stdout);
    assert_eq!(speculative_lines(&spec).len(), 1, "{}", stderr(&spec));
}

/// Qwen3.8-Flash-Next's (`qwen4_exp`) own MTP head (docs/mtp.md §8, the fixture of
/// scripts/gen_fixture_qwen4_exp_mtp.py): greedy text with speculation is plain greedy's at
/// k = 1, 3 and auto; a seeded sampled run (speculative sampling)
/// repeats itself.
#[test]
fn the_qwen4_exp_head_gives_the_text_of_plain_greedy_decoding() {
    let model = mtp_fixture("qwen4-exp-mtp-tiny-hf");
    let args = ["--max-tokens", "48", "--prompt", "Tell me about the sea."];
    // (Acceptance: the head memorised its training continuations, and this prompt is not
    // one; `cargo test -p qwen-gdn-model --test mtp_qwen4_exp` measures it on one.)
    speculative_runs(&model, &args, &["1", "3", "auto"]);
    let sampled = [
        "--max-tokens",
        "32",
        "--prompt",
        "Tell me about the sea.",
        "--temp",
        "1",
        "--seed",
        "7",
        "--draft-tokens",
        "2",
    ];
    let (a, b) = (generate(&model, &sampled), generate(&model, &sampled));
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(a.stdout, b.stdout);
    assert_eq!(speculative_lines(&a).len(), 1, "{}", stderr(&a));
}

/// `--mtp-from <folder>` on Qwen3.8-Flash-Next: the MTP checkpoint's folder lends its head to
/// the same main model stored without one (models/qwen4-exp-tiny-hf, whose main weights the
/// MTP fixture shares): the text and the speculation line are those of the MTP checkpoint run
/// alone, and the text is plain greedy's.
#[test]
fn mtp_from_a_folder_lends_the_qwen4_exp_head() {
    let head = mtp_fixture("qwen4-exp-mtp-tiny-hf");
    let args = ["--max-tokens", "24", "--prompt", "Tell me about the sea."];
    let own = speculative_runs(&head, &args, &["2"]);
    let main = fixture("qwen4-exp-tiny-hf");
    let plain = generate(&main, &args);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let lent = [
        args.as_slice(),
        &["--mtp-from", head.to_str().unwrap(), "--draft-tokens", "2"],
    ]
    .concat();
    let out = generate(&main, &lent);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, plain.stdout);
    assert_eq!(speculative_lines(&out), vec![own[0].1.clone()]);
}

/// mlx-vlm's separate drafter of Qwen3.8-Flash-Next's head (models/mtp/qwen4-exp-mtp-tiny-
/// drafter-{bf16,4bit}: the MTP fixture's head split by mlx-vlm's own `split_qwen4_exp_mtp`),
/// given with `--mtp-from` or, as mlx-vlm users type it, `--draft-model`: plain greedy's text
/// and one stats line; the bf16 drafter's line is that of the HF-layout head it was split from.
#[test]
fn an_mlx_vlm_drafter_lends_the_qwen4_exp_head() {
    let main = fixture("qwen4-exp-tiny-hf");
    let args = ["--max-tokens", "24", "--prompt", "Tell me about the sea."];
    let plain = generate(&main, &args);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let lent = |flag: &str, dir: &Path| {
        let with = [
            args.as_slice(),
            &[flag, dir.to_str().unwrap(), "--draft-tokens", "2"],
        ];
        let out = generate(&main, &with.concat());
        assert!(
            out.status.success(),
            "{flag} {}: {}",
            dir.display(),
            stderr(&out)
        );
        assert_eq!(out.stdout, plain.stdout, "{flag} {}", dir.display());
        let lines = speculative_lines(&out);
        assert_eq!(lines.len(), 1, "{}", stderr(&out));
        lines[0].clone()
    };
    let hf = lent("--mtp-from", &mtp_fixture("qwen4-exp-mtp-tiny-hf"));
    for name in [
        "qwen4-exp-mtp-tiny-drafter-bf16",
        "qwen4-exp-mtp-tiny-drafter-4bit",
    ] {
        for flag in ["--mtp-from", "--draft-model"] {
            let line = lent(flag, &mtp_fixture(name));
            eprintln!("{name} {flag}: {line}");
            if name.ends_with("bf16") {
                assert_eq!(line, hf, "{flag} {name}");
            }
        }
    }
}

/// A drafter folder of another model (its config's hidden size), or one missing a tensor, is
/// refused in one line before anything is generated.
#[test]
fn a_drafter_that_does_not_fit_is_refused_in_one_line() {
    let main = fixture("qwen4-exp-tiny-hf");
    let (_tmp, wide) = copy_fixture("mtp/qwen4-exp-mtp-tiny-drafter-bf16");
    let path = wide.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["text_config"]["hidden_size"] = 128.into();
    std::fs::write(&path, json.to_string()).unwrap();
    let (_tmp2, short) = copy_fixture("mtp/qwen4-exp-mtp-tiny-drafter-4bit");
    let file = short.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "layers.0.mlp.switch_mlp.up_proj.scales");
    std::fs::write(&file, safetensors::serialize(kept, None).unwrap()).unwrap();
    let cases = [
        (
            &wide,
            [
                "config.json: text_config.hidden_size is 128",
                "a drafter for another model",
            ],
        ),
        (
            &short,
            ["layers.0.mlp.switch_mlp.up_proj", "model.safetensors"],
        ),
    ];
    // models/qwen4-exp-tiny-4bit is another tiny model (its experts twice as wide).
    let other = fixture("qwen4-exp-tiny-4bit");
    let drafter = mtp_fixture("qwen4-exp-mtp-tiny-drafter-4bit");
    let cases = cases.into_iter().map(|(d, n)| (&main, d, n)).chain([(
        &other,
        &drafter,
        [
            "text_config.moe_intermediate_size is 32, the main model's is 64",
            "config.json",
        ],
    )]);
    for (main, dir, needles) in cases {
        for flag in ["--mtp-from", "--draft-model"] {
            let out = generate(main, &[flag, dir.to_str().unwrap(), "--max-tokens", "4"]);
            // The main checkpoint's own warning (its placeholder head) comes first.
            let err = stderr(&out);
            assert!(!out.status.success() && !err.contains("panicked"), "{err}");
            let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("warning")).collect();
            assert_eq!(lines.len(), 1, "{err}");
            assert!(lines[0].starts_with("error: "), "{err}");
            for needle in needles {
                assert!(lines[0].contains(needle), "{needle:?} not in {err}");
            }
        }
    }
}

/// A draft model whose tokenizer differs (two tokens' ids swapped in a copy of a fixture with
/// the main model's tokenizer), or one given with --mtp-from, is refused in one line before
/// anything is generated.
#[test]
fn a_draft_model_with_another_tokenizer_is_refused() {
    let main = fixture("qwen3-next-tiny-bf16");
    let (_dir, other) = copy_fixture("qwen3-next-tiny-4bit");
    // Two tokens of the vocabulary swap ids.
    let path = other.join("tokenizer.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object_mut().unwrap();
    let (a, b) = ("the".to_string(), "a".to_string());
    let (ia, ib) = (vocab[&a].clone(), vocab[&b].clone());
    vocab.insert(a, ib);
    vocab.insert(b, ia);
    std::fs::write(&path, json.to_string()).unwrap();
    let out = generate(
        &main,
        &[
            "--max-tokens",
            "4",
            "--prompt",
            "Hi",
            "--draft-model",
            other.to_str().unwrap(),
        ],
    );
    assert_error(&out, &["--draft-model", "tokenizer", "has another id"]);
    let with_head = generate(
        &main,
        &[
            "--draft-model",
            other.to_str().unwrap(),
            "--mtp-from",
            main.to_str().unwrap(),
        ],
    );
    assert!(!with_head.status.success());
    assert!(
        stderr(&with_head).contains("--mtp-from"),
        "{}",
        stderr(&with_head)
    );
}
