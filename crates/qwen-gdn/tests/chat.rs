//! `qwen-gdn chat` driven through a pipe: replies against `generate`, the commands, Ctrl-C.

mod common;

use common::*;
use serde_json::{json, Value as Json};
use std::io::{Read, Write};
use std::path::Path;
use std::process::Output;
use tokenizers::Tokenizer;

const SYSTEM: &str = "You are terse.";
const MAX_TOKENS: &str = "24";

/// Runs `chat` on `model` with `lines` as its stdin (greedy, short replies, stats on).
fn chat(model: &Path, extra: &[&str], lines: &[&str]) -> Output {
    let mut args = vec!["--temp", "0", "--max-tokens", MAX_TOKENS, "--verbose"];
    args.extend_from_slice(extra);
    let mut child = spawn_piped(&mut model_command("chat", model, &args));
    let mut input = lines.join("\n");
    input.push('\n');
    let mut stdin = child.stdin.take().unwrap();
    // Written from a thread: a long input must not block while the child's stdout fills up.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "chat failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    out
}

/// `generate`'s greedy reply (text only) to one user message after the system prompt.
fn generate(model: &Path, system: Option<&str>, prompt: &str) -> String {
    let mut args = vec![
        "--prompt",
        prompt,
        "--temp",
        "0",
        "--max-tokens",
        MAX_TOKENS,
        "--verbose",
        "false",
    ];
    if let Some(system) = system {
        args.extend(["--system-prompt", system]);
    }
    let out = run_model("generate", model, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// The per-turn numbers of `--verbose`: (prompt tokens, cached, prefilled).
fn prompt_stats(stderr: &str) -> Vec<(usize, usize, usize)> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("Prompt: "))
        .map(|rest| {
            let n: Vec<usize> = rest
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .take(3)
                .map(|s| s.parse().unwrap())
                .collect();
            assert!(
                rest.contains(" cached, ") && rest.contains(" prefilled"),
                "{rest}"
            );
            (n[0], n[1], n[2])
        })
        .collect()
}

/// The fixture's chat template rendered as transformers renders it (jinja2 with trim_blocks
/// and lstrip_blocks, Python string methods), independently of qwen-gdn's renderer; `None`
/// when the template refuses the messages.
fn render(model: &Path, messages: &[Json], add_generation_prompt: bool) -> Option<String> {
    let source = std::fs::read_to_string(model.join("chat_template.jinja")).unwrap();
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message,
            ))
        },
    );
    env.add_template("chat", &source).unwrap();
    let ctx = json!({
        "messages": messages,
        "add_generation_prompt": add_generation_prompt,
        "enable_thinking": true,
    });
    env.get_template("chat").unwrap().render(ctx).ok()
}

fn tokens(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    tokenizer.encode(text, false).unwrap().get_ids().to_vec()
}

/// The token sequences a turn's prompt leaves in the prompt cache: its whole prompt and each
/// rendered message prefix (with and without the generation prompt) whose tokens begin it.
fn snapshots(model: &Path, tokenizer: &Tokenizer, messages: &[Json]) -> Vec<Vec<u32>> {
    let prompt = tokens(tokenizer, &render(model, messages, true).unwrap());
    let mut kept = vec![prompt.clone()];
    for end in 1..=messages.len() {
        for generation_prompt in [false, true] {
            if let Some(text) = render(model, &messages[..end], generation_prompt) {
                let ids = tokens(tokenizer, &text);
                if !ids.is_empty() && prompt.starts_with(&ids) {
                    kept.push(ids);
                }
            }
        }
    }
    kept
}

fn read_json(path: &Path) -> Json {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn first_reply_equals_generate_and_reset_forgets_the_history() {
    for name in ["qwen3.5-tiny-4bit", "qwen3-next-tiny-4bit"] {
        let model = fixture(name);
        let want = generate(&model, Some(SYSTEM), "Hello there");
        let dir = tempfile::tempdir().unwrap();
        let saved = dir.path().join("after-reset.json");
        let out = chat(
            &model,
            &["--system-prompt", SYSTEM],
            &[
                "Hello there",
                "And then?",
                "/reset",
                "Hello there",
                &format!("/save {}", saved.display()),
            ],
        );
        let stdout = String::from_utf8(out.stdout.clone()).unwrap();
        // Replies 1 and 3 are the same first turn; reply 2 lies between them.
        assert!(
            stdout.starts_with(&want) && stdout.ends_with(&want) && stdout.len() > 2 * want.len(),
            "{name}: chat printed {stdout:?}, generate {want:?}"
        );
        let stats = prompt_stats(&stderr(&out));
        assert_eq!(stats.len(), 3, "{}", stderr(&out));
        assert!(stats[1].0 > stats[0].0, "turn 2 holds turn 1: {stats:?}");
        assert_eq!(stats[2].0, stats[0].0, "{name}: /reset kept history");
        // What was saved after /reset: the system prompt and the one new exchange.
        let messages = read_json(&saved);
        assert_eq!(
            messages,
            json!([
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Hello there"},
                {"role": "assistant", "content": want.trim_end_matches('\n')},
            ]),
            "{name}"
        );
    }
}

#[test]
fn save_never_overwrites_and_bad_commands_keep_the_session() {
    let model = fixture("qwen3.5-tiny-4bit");
    let dir = tempfile::tempdir().unwrap();
    let mine = dir.path().join("mine.json");
    std::fs::write(&mine, "my notes\n").unwrap();
    let fresh = dir.path().join("fresh.json");
    // More tokens than the tiny models' 4096 positions.
    let too_long = "word ".repeat(5000);
    let out = chat(
        &model,
        &[],
        &[
            "/frobnicate",
            &too_long,
            "Hi",
            &format!("/save {}", mine.display()),
            "/save",
            "/reset now",
            "",
            "//etc is a folder",
            &format!("/save {}", fresh.display()),
            "/exit",
            "never read",
        ],
    );
    let err = stderr(&out);
    // The user's file is untouched; the refusal says so and names it.
    assert_eq!(std::fs::read_to_string(&mine).unwrap(), "my notes\n");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 5, "{err}");
    assert!(errors[0].contains("/frobnicate"), "{err}");
    assert!(
        errors[1].contains("the conversation") && errors[1].contains("max_position_embeddings"),
        "{err}"
    );
    assert!(
        errors[2].contains("already exists") && errors[2].contains("mine.json"),
        "{err}"
    );
    // Both replies came (the session outlived every bad input; the long message was taken
    // back) and /exit ended it.
    assert_eq!(prompt_stats(&err).len(), 2, "{err}");
    let messages = read_json(&fresh);
    let roles: Vec<&str> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"]);
    assert_eq!(messages[0]["content"], "Hi");
    // The doubled slash sent a message starting with one slash.
    assert_eq!(messages[2]["content"], "/etc is a folder");
}

#[test]
fn hide_thinking_prints_only_the_answer() {
    // With thinking on, the tiny model's greedy reply never closes its thinking within
    // MAX_TOKENS tokens, so all of it is hidden; without the flag it is all shown.
    let model = fixture("qwen3.5-tiny-4bit");
    let shown = chat(&model, &[], &["Hello there"]);
    let want = generate(&model, None, "Hello there");
    assert_eq!(String::from_utf8(shown.stdout).unwrap(), want);
    assert!(!want.contains("</think>"), "the premise changed: {want:?}");
    let hidden = chat(&model, &["--hide-thinking"], &["Hello there"]);
    assert_eq!(String::from_utf8(hidden.stdout).unwrap(), "\n");
}

/// Ctrl-C while a reply is written stops that reply and keeps the session.
#[test]
fn ctrl_c_stops_the_reply_and_keeps_the_session() {
    let model = fixture("qwen3.5-tiny-4bit");
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("after-ctrl-c.json");
    // Long enough to be still running when the signal comes: up to the whole context.
    let mut child = spawn_piped(&mut model_command(
        "chat",
        &model,
        &["--temp", "0", "--max-tokens", "100000"],
    ));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Tell me everything\n").unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    // SAFETY: kill() only sends a signal to the child we started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    writeln!(stdin, "/save {}", saved.display()).unwrap();
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("(reply stopped)"), "{err}");
    // The partial reply is part of the conversation, as it was shown.
    let messages = read_json(&saved);
    let reply = messages[1]["content"].as_str().unwrap();
    let shown = String::from_utf8_lossy(&[&first[..], &rest[..]].concat()).into_owned();
    assert_eq!(format!("{reply}\n"), shown);
}

/// Each turn prefills only what the prompt cache does not hold: the longest earlier snapshot
/// that begins its prompt (worked out here from the template and the tokenizer), and the
/// replies are those of a session without a prompt cache.
#[test]
fn each_turn_prefills_only_its_new_tokens_and_replies_as_without_the_cache() {
    for name in [
        "qwen3.5-tiny-4bit",
        "qwen3-next-tiny-4bit",
        "qwen3.5-moe-tiny-hf",
    ] {
        let model = fixture(name);
        let tokenizer = Tokenizer::from_file(model.join("tokenizer.json")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let saved = dir.path().join("conversation.json");
        let lines = [
            "Hello there",
            "Tell me more about that.",
            "And the third thing?",
            &format!("/save {}", saved.display()),
        ];
        let system = ["--system-prompt", SYSTEM];
        let cached = chat(&model, &system, &lines);
        let uncached = chat(
            &model,
            &[&system[..], &["--prompt-cache-bytes", "0"]].concat(),
            &lines[..3],
        );
        assert_eq!(
            String::from_utf8_lossy(&cached.stdout),
            String::from_utf8_lossy(&uncached.stdout),
            "{name}: replies differ with the prompt cache"
        );
        let messages = read_json(&saved);
        let messages = messages.as_array().unwrap();
        assert_eq!(messages.len(), 7);
        let stats = prompt_stats(&stderr(&cached));
        let mut earlier: Vec<Vec<u32>> = Vec::new();
        for (turn, &(prompt, cached_tokens, prefilled)) in stats.iter().enumerate() {
            let upto = &messages[..2 + 2 * turn];
            let ids = tokens(&tokenizer, &render(&model, upto, true).unwrap());
            let want_cached = earlier
                .iter()
                .filter(|s| s.len() < ids.len() && ids.starts_with(s))
                .map(Vec::len)
                .max()
                .unwrap_or(0);
            assert_eq!(
                (prompt, cached_tokens, prefilled),
                (ids.len(), want_cached, ids.len() - want_cached),
                "{name} turn {}",
                turn + 1
            );
            if turn > 0 {
                assert!(
                    want_cached > 0,
                    "{name} turn {}: nothing reusable",
                    turn + 1
                );
            }
            earlier.extend(snapshots(&model, &tokenizer, upto));
        }
        // Without the cache every turn prefills its whole prompt.
        for (prompt, cached_tokens, prefilled) in prompt_stats(&stderr(&uncached)) {
            assert_eq!((cached_tokens, prefilled), (0, prompt), "{name}");
        }
    }
}

/// Runs `chat` with `feed` writing its stdin (from a thread, until the child stops reading),
/// and `file_size_limit`, when given, as the child's RLIMIT_FSIZE.
fn chat_fed(
    model: &Path,
    feed: impl FnOnce(&mut dyn Write) -> std::io::Result<()> + Send + 'static,
    file_size_limit: Option<u64>,
) -> Output {
    let mut cmd = model_command("chat", model, &["--temp", "0"]);
    if let Some(bytes) = file_size_limit {
        limit_file_size(&mut cmd, bytes);
    }
    let mut child = spawn_piped(&mut cmd);
    let mut stdin = child.stdin.take().unwrap();
    // A broken pipe (the child stopped reading) ends the feed.
    let writer = std::thread::spawn(move || {
        let _ = feed(&mut stdin);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

/// Piped input that cannot be messages ends the session with one error and a failure:
/// a line longer than the context can hold (endless input without a newline included) and
/// a NUL byte.
#[test]
fn endless_long_or_binary_input_ends_with_one_error() {
    let model = fixture("qwen3.5-tiny-4bit");
    let start = std::time::Instant::now();
    // /dev/zero: NUL bytes without end.
    let out = chat_fed(
        &model,
        |stdin| {
            let mut zero = std::fs::File::open("/dev/zero")?;
            std::io::copy(&mut zero, stdin).map(|_| ())
        },
        None,
    );
    assert_error(
        &out,
        &["a line of stdin", "bytes", "max_position_embeddings"],
    );
    // Text without a newline, for ever.
    let out = chat_fed(
        &model,
        |stdin| loop {
            stdin.write_all(&[b'a'; 1 << 16])?;
        },
        None,
    );
    assert_error(
        &out,
        &["a line of stdin", "bytes", "max_position_embeddings"],
    );
    let out = chat_fed(&model, |stdin| stdin.write_all(b"hello\0world\n"), None);
    assert_error(&out, &["a line of stdin", "NUL"]);
    assert!(start.elapsed().as_secs() < 60, "took {:?}", start.elapsed());
}

/// `/save` on a full disk (a file-size limit of 1 byte here) leaves no file, not even an empty
/// one, and nothing else in the folder; the same name then saves once there is room.
#[test]
fn a_save_that_fails_leaves_nothing_and_can_be_retried() {
    let model = fixture("qwen3.5-tiny-4bit");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.json");
    let save = format!("/save {}\n", path.display());
    let line = save.clone();
    let out = chat_fed(
        &model,
        move |stdin| stdin.write_all(line.as_bytes()),
        Some(1),
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.starts_with("error: ") && err.lines().count() == 1 && err.contains("chat.json"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let out = chat_fed(&model, move |stdin| stdin.write_all(save.as_bytes()), None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(read_json(&path), json!([]));
}
