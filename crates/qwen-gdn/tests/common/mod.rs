//! Helpers shared by the integration tests: run the built binary and locate the fixtures.
#![allow(dead_code)] // each test file uses a different subset

#[path = "../../../qwen-gdn-model/tests/common/checkpoints.rs"]
mod checkpoints;
pub mod fake_hub;
pub mod serve_server;

#[allow(unused_imports)] // each test file uses a different subset
pub use checkpoints::{CHECKPOINTS, QWEN4_EXP};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// A tiny checkpoint under models/ (made by scripts/gen_fixtures.py).
pub fn fixture(name: &str) -> PathBuf {
    let dir = repo_root().join("models").join(name);
    assert!(
        dir.join("config.json").is_file(),
        "fixture {} is missing; run scripts/gen-fixtures.sh",
        dir.display()
    );
    dir
}

pub fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qwen-gdn"));
    cmd.args(args);
    // Keep the tests off the user's Hugging Face cache and token.
    cmd.env("HF_HUB_OFFLINE", "1").env(
        "HF_HOME",
        std::env::temp_dir().join("qwen-gdn-tests-no-hf-home"),
    );
    cmd.env_remove("HF_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .env_remove("MLX_LM_GDN_STATE_BF16");
    cmd
}

/// Limits the files `cmd` writes to `bytes` (RLIMIT_FSIZE): past it a write fails with
/// EFBIG, as on a full disk (SIGXFSZ, which would kill the process instead, is ignored).
pub fn limit_file_size(cmd: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

pub fn run(args: &[&str]) -> Output {
    output(&mut command(args))
}

/// `cmd` run to its end, its stdin closed.
pub fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap()
}

/// `cmd` started with its stdin, stdout and stderr piped.
pub fn spawn_piped(cmd: &mut Command) -> std::process::Child {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `qwen-gdn <subcommand> --model <model> <rest>`, in the tests' environment ([`command`]).
pub fn model_command(subcommand: &str, model: &Path, rest: &[&str]) -> Command {
    let mut cmd = command(&[subcommand, "--model", model.to_str().unwrap()]);
    cmd.args(rest);
    cmd
}

/// [`model_command`] run to its end, its stdin closed.
pub fn run_model(subcommand: &str, model: &Path, rest: &[&str]) -> Output {
    output(&mut model_command(subcommand, model, rest))
}

/// `generate --model <model>` with `extra`, and `--prompt "Hello there"` unless `extra` has
/// a prompt flag.
pub fn generate(model: &Path, extra: &[&str]) -> Output {
    let mut args = vec![];
    if !extra.iter().any(|a| a.starts_with("--prompt")) {
        args.extend(["--prompt", "Hello there"]);
    }
    args.extend(extra);
    run_model("generate", model, &args)
}

/// The `logprobs` of an `eval --json` run's report.
/// `eval --json` of `text` one token per forward (`--prefill-chunk-size 1`: the decode-shaped
/// products, the state stored every token), with `extra` flags and `env` set: its
/// log-probabilities.
pub fn eval_logprobs_per_token(
    model: &Path,
    text: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Vec<f64> {
    let mut args = vec!["--text", text, "--json", "--prefill-chunk-size", "1"];
    args.extend_from_slice(extra);
    let mut cmd = model_command("eval", model, &args);
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{env:?}: {}", stderr(&out));
    logprobs_of(&out)
}

pub fn logprobs_of(out: &Output) -> Vec<f64> {
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The failure contract: non-zero exit, exactly one stderr line `error: ...` that mentions
/// every `needle` (the flag or file at fault), and no panic.
pub fn assert_error(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert!(
        !out.status.success(),
        "expected a failure, got success; stderr: {err}"
    );
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(
        err.starts_with("error: ") && err.ends_with('\n') && err.lines().count() == 1,
        "not one `error:` line: {err:?}"
    );
    for needle in needles {
        assert!(
            err.contains(needle),
            "error does not mention {needle:?}: {err}"
        );
    }
}

/// Copies a checkpoint folder into a fresh temp dir, to break it.
pub fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join(name);
    copy_dir(&fixture(name), &dst);
    (tmp, dst)
}

pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
}

/// Makes a named pipe at `path` (nothing may stand there): a "file" whose read never ends.
pub fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// The whole number `text` starts with, up to its first space ("12 tokens" → 12): how the
/// tests read a count out of a log or stats line.
pub fn leading_number(text: &str) -> usize {
    let word = text.split(' ').next().unwrap_or_default();
    word.parse()
        .unwrap_or_else(|_| panic!("expected a number at the start of {text:?}"))
}
