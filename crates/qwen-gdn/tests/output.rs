//! A closed stdout ends the output quietly, a full disk is one `error:` line, and a failing
//! stderr never turns into a panic (exit 101), in every subcommand.

mod common;

use common::*;
use std::process::{Output, Stdio};

const MODEL: &str = "qwen3.5-tiny-4bit";

fn eval_args(model: &str) -> Vec<&str> {
    vec![
        "eval",
        "--model",
        model,
        "--text",
        "Hello there, how are you?",
    ]
}

fn bench_args(model: &str) -> Vec<&str> {
    vec!["bench", "--model", model, "-p", "4", "-g", "2", "-r", "1"]
}

/// Runs with stdout a pipe whose reader is gone before anything is written (`… | true`).
fn closed_stdout(args: &[&str]) -> Output {
    let mut child = command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

/// Runs with stdout, or stderr, on /dev/full (every write fails with "no space left").
fn full(args: &[&str], stderr_full: bool) -> Output {
    let dev_full = || Stdio::from(std::fs::File::create("/dev/full").unwrap());
    let mut cmd = command(args);
    cmd.stdin(Stdio::null());
    if stderr_full {
        cmd.stdout(Stdio::piped()).stderr(dev_full());
    } else {
        cmd.stdout(dev_full()).stderr(Stdio::piped());
    }
    cmd.output().unwrap()
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let model = fixture(MODEL);
    let m = model.to_str().unwrap();
    for args in [eval_args(m), bench_args(m)] {
        let out = closed_stdout(&args);
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{args:?}: {:?} {}",
            out.status,
            stderr(&out)
        );
    }
}

#[test]
fn a_full_disk_is_an_error() {
    let model = fixture(MODEL);
    let m = model.to_str().unwrap();
    let mut json = eval_args(m);
    json.push("--json");
    for args in [eval_args(m), json, bench_args(m)] {
        assert_error(&full(&args, false), &["writing to stdout"]);
    }
}

#[test]
fn a_failing_stderr_never_panics() {
    let model = fixture(MODEL);
    let m = model.to_str().unwrap();
    // An error to report, a clap error, and the stats of a successful run.
    let cases: [(Vec<&str>, i32); 3] = [
        (
            vec!["eval", "--model", "/no/such/model", "--text", "hi there"],
            1,
        ),
        (vec!["generate", "--no-such-flag"], 2),
        (
            vec![
                "generate",
                "--model",
                m,
                "--prompt",
                "Hi",
                "--max-tokens",
                "2",
            ],
            0,
        ),
    ];
    for (args, code) in cases {
        let out = full(&args, true);
        assert_eq!(out.status.code(), Some(code), "{args:?}");
    }
}
