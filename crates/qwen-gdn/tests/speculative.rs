//! `generate --draft-tokens N`: speculative decoding with the checkpoint's MTP head gives the
//! same text as plain greedy decoding, reports its acceptance, and refuses a checkpoint
//! without a head in one line (the MTP fixtures live in models/mtp/).

mod common;
use common::*;
use std::path::PathBuf;

fn mtp_fixture(name: &str) -> PathBuf {
    fixture(&format!("mtp/{name}"))
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
        assert!(plain.status.success(), "{}", stderr(&plain));
        for k in ["1", "3"] {
            let mut with = args.to_vec();
            with.extend(["--draft-tokens", k]);
            let spec = generate(&model, &with);
            assert!(spec.status.success(), "{}", stderr(&spec));
            assert_eq!(spec.stdout, plain.stdout, "{name}: k = {k}");
            let err = stderr(&spec);
            let line = err
                .lines()
                .find(|l| l.starts_with("Speculative: "))
                .unwrap_or_else(|| panic!("{name}: no stats line in {err}"));
            assert!(
                line.contains("acceptance") && line.contains("tokens per verify step"),
                "{line}"
            );
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
