//! `cache-prompt` and `generate --prompt-cache-file`: a saved prefix continues exactly as the
//! whole prompt would, and files that do not belong to the model are refused.

mod common;

use common::*;
use std::path::Path;

/// The cached prefix and the later prompt. They meet between two digits, which the Qwen
/// pre-tokenizer always splits, so the two token sequences join into the whole prompt's.
const PREFIX: &str = "Remember the code word. The code is 12";
const REST: &str = "34 and nothing else.";

fn cache_prompt(model: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    cache_prefix(model, PREFIX, out, extra)
}

fn cache_prefix(model: &Path, prefix: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["--prompt", prefix, "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    run_model("cache-prompt", model, &args)
}

/// `generate` greedy: (text, stats on stderr).
fn generate(model: &Path, prompt: &str, extra: &[&str]) -> (String, String) {
    let mut args = vec!["--prompt", prompt, "--temp", "0", "--max-tokens", "24"];
    args.extend_from_slice(extra);
    let out = run_model("generate", model, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr(&out),
    )
}

/// The flags of a raw prompt (no chat template), or of a templated one.
fn raw_flags(raw: bool) -> &'static [&'static str] {
    if raw {
        &["--ignore-chat-template"]
    } else {
        &[]
    }
}

fn prompt_tokens(stderr: &str) -> usize {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("Prompt: "))
        .unwrap_or_else(|| panic!("no Prompt: in {stderr}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn a_saved_prefix_continues_as_the_whole_prompt() {
    for name in [
        "qwen3.5-tiny-4bit",
        "qwen3-next-tiny-4bit",
        "qwen3.5-moe-tiny-4bit",
        "qwen3-next-tiny-bf16",
        "qwen3.5-moe-tiny-hf",
        "qwen4-exp-tiny-hf",
        "qwen4-exp-tiny-4bit",
    ] {
        let model = fixture(name);
        let dir = tempfile::tempdir().unwrap();
        let whole = format!("{PREFIX}{REST}");
        for raw in [false, true] {
            let file = dir.path().join(format!("prefix-{raw}.safetensors"));
            let flags = raw_flags(raw);
            let made = cache_prompt(&model, &file, flags);
            assert!(made.status.success(), "{name}: {}", stderr(&made));
            let (want, want_stats) = generate(&model, &whole, flags);
            let (got, got_stats) = generate(
                &model,
                REST,
                &[flags, &["--prompt-cache-file", file.to_str().unwrap()]].concat(),
            );
            assert_eq!(got, want, "{name} raw={raw}");
            let whole_tokens = prompt_tokens(&want_stats);
            assert_eq!(
                prompt_tokens(&got_stats),
                whole_tokens,
                "{name} raw={raw}: {got_stats}"
            );
            // The file's tokens were not prefilled again: only the rest was.
            let cached: usize = stderr(&made)
                .lines()
                .find_map(|l| l.strip_prefix("Cached "))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
                .unwrap_or_else(|| panic!("{}", stderr(&made)));
            let line = format!(
                "Prompt cache: {cached} tokens from {}, {} prefilled",
                file.display(),
                whole_tokens - cached
            );
            assert!(
                got_stats.contains(&line),
                "{name} raw={raw}: {got_stats}\nwant {line}"
            );
        }
    }
}

/// The text at the split is kept as it is, whitespace included, with the chat template (which
/// trims a message's ends) and without: "The sea is" + " blue" runs as "The sea is blue".
#[test]
fn the_split_keeps_its_whitespace() {
    let model = fixture("qwen3.5-tiny-4bit");
    let dir = tempfile::tempdir().unwrap();
    for raw in [false, true] {
        let flags = raw_flags(raw);
        let file = dir.path().join(format!("sea-{raw}.safetensors"));
        let made = cache_prefix(&model, "The sea is", &file, flags);
        assert!(made.status.success(), "{}", stderr(&made));
        let (want, want_stats) = generate(&model, "The sea is blue", flags);
        let (got, got_stats) = generate(
            &model,
            " blue",
            &[flags, &["--prompt-cache-file", file.to_str().unwrap()]].concat(),
        );
        assert_eq!(
            prompt_tokens(&got_stats),
            prompt_tokens(&want_stats),
            "raw={raw}"
        );
        assert_eq!(got, want, "raw={raw}");
    }
}

/// The file records whether the chat template made its tokens; a run that reads the prompt
/// the other way is refused in one line, before the model is loaded.
#[test]
fn a_file_made_the_other_way_round_is_refused() {
    let model = fixture("qwen3.5-tiny-4bit");
    let dir = tempfile::tempdir().unwrap();
    for made_raw in [false, true] {
        let file = dir.path().join(format!("made-raw-{made_raw}.safetensors"));
        let flags = raw_flags(made_raw);
        let made = cache_prompt(&model, &file, flags);
        assert!(made.status.success(), "{}", stderr(&made));
        let mut args = vec![
            "--prompt",
            REST,
            "--prompt-cache-file",
            file.to_str().unwrap(),
        ];
        if !made_raw {
            args.push("--ignore-chat-template");
        }
        assert_error(
            &run_model("generate", &model, &args),
            &[
                file.file_name().unwrap().to_str().unwrap(),
                "--ignore-chat-template",
            ],
        );
    }
}

#[test]
fn files_of_another_model_or_damaged_are_refused() {
    let model = fixture("qwen3.5-tiny-4bit");
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("other-model.safetensors");
    let made = cache_prompt(&fixture("qwen3.5-moe-tiny-4bit"), &theirs, &[]);
    assert!(made.status.success(), "{}", stderr(&made));
    let use_file = |file: &Path| {
        run_model(
            "generate",
            &model,
            &[
                "--prompt",
                REST,
                "--prompt-cache-file",
                file.to_str().unwrap(),
            ],
        )
    };
    assert_error(&use_file(&theirs), &["other-model.safetensors"]);

    let mine = dir.path().join("mine.safetensors");
    let made = cache_prompt(&model, &mine, &[]);
    assert!(made.status.success(), "{}", stderr(&made));
    let bytes = std::fs::read(&mine).unwrap();
    for (what, damaged) in [
        ("truncated", bytes[..bytes.len() / 2].to_vec()),
        ("empty", Vec::new()),
        ("garbage header", {
            let mut b = bytes.clone();
            b[8..40].fill(b'#');
            b
        }),
        ("flipped bit", {
            // The last byte belongs to the last tensor's data.
            let mut b = bytes.clone();
            *b.last_mut().unwrap() ^= 0x10;
            b
        }),
    ] {
        let file = dir.path().join(format!("{what}.safetensors"));
        std::fs::write(&file, damaged).unwrap();
        let out = use_file(&file);
        assert_error(&out, &[file.file_name().unwrap().to_str().unwrap()]);
    }
    // The system prompt belongs to the cached prefix.
    let out = run_model(
        "generate",
        &model,
        &[
            "--prompt",
            REST,
            "--system-prompt",
            "be brief",
            "--prompt-cache-file",
            mine.to_str().unwrap(),
        ],
    );
    assert_error(&out, &["--system-prompt", "cache-prompt"]);
}

#[test]
fn out_is_never_overwritten_without_force() {
    let model = fixture("qwen3.5-tiny-4bit");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("notes.safetensors");
    std::fs::write(&out, "mine").unwrap();
    assert_error(&cache_prompt(&model, &out, &[]), &["--out", "--force"]);
    // --force replaces only an earlier prompt-cache file, never a file of the user's.
    assert_error(
        &cache_prompt(&model, &out, &["--force"]),
        &["notes.safetensors"],
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "mine");

    let cache = dir.path().join("cache.safetensors");
    let made = cache_prompt(&model, &cache, &[]);
    assert!(made.status.success(), "{}", stderr(&made));
    let first = std::fs::read(&cache).unwrap();
    assert_error(&cache_prompt(&model, &cache, &[]), &["--out", "--force"]);
    assert_eq!(std::fs::read(&cache).unwrap(), first);
    let forced = run_model(
        "cache-prompt",
        &model,
        &[
            "--prompt",
            "Another prefix entirely",
            "--out",
            cache.to_str().unwrap(),
            "--force",
        ],
    );
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert_ne!(std::fs::read(&cache).unwrap(), first);
    // No temporary file is left behind.
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["cache.safetensors", "notes.safetensors"]);
}

/// A prompt-cache file whose write fails (a full disk: a file-size limit here) leaves nothing
/// in the folder, and the same name works once there is room.
#[test]
fn a_failed_write_leaves_nothing_and_can_be_retried() {
    let model = fixture("qwen3.5-tiny-4bit");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cache.safetensors");
    let mut cmd = model_command(
        "cache-prompt",
        &model,
        &["--prompt", PREFIX, "--out", out.to_str().unwrap()],
    );
    limit_file_size(&mut cmd, 1000);
    let failed = output(&mut cmd);
    assert_error(&failed, &["cache.safetensors"]);
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let made = cache_prompt(&model, &out, &[]);
    assert!(made.status.success(), "{}", stderr(&made));
}
