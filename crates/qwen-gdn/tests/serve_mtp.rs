//! `serve --draft-tokens`: speculative decoding with the checkpoint's MTP head in the server
//! (issue 28). A request decodes speculatively while it is the only one decoding and in the
//! batch's plain steps while another runs beside it; its text must be `generate`'s, with and
//! without speculation (greedy: the same text), alone and through the switch to the batch and
//! back, streamed or not. Usage, the log line and /metrics report the draft tokens, and alone
//! they are the very drafts `generate` makes (same counts, and a seeded sampled reply's text,
//! which depends on every draft). On the trained dense MTP fixture, f32 on the CPU: a batched
//! row is the same bits as the sequence alone, so texts are equal, not close.

mod common;

use common::serve_server::Server;
use common::{fixture, run_model, stderr};
use serde_json::{json, Value as Json};
use std::path::PathBuf;
use std::process::Output;

fn mtp_model() -> PathBuf {
    fixture("mtp/qwen3.5-mtp-tiny-hf")
}

/// A prompt the head predicts fairly well (acceptance about 0.4), one it predicts less well
/// (both give text that a rollback off by one changes), and one for the seeded sampled reply
/// (new to the server, so its prompt is not in the prompt cache).
const CODE: &str = "def main():";
const STORY: &str = "Once upon a time";
const SAMPLED: &str = "Tell me about the sea.";

/// `generate --ignore-chat-template` (the completions endpoint's raw prompt): its text, and
/// with speculation the accepted and proposed draft tokens of its stats line.
fn generate(prompt: &str, max_tokens: usize, extra: &[&str]) -> (String, Option<(u64, u64)>) {
    let n = max_tokens.to_string();
    let mut args = vec!["-p", prompt, "--max-tokens", &n, "--ignore-chat-template"];
    args.extend_from_slice(extra);
    let out = run_model("generate", &mtp_model(), &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    // The text sits between two "==========" lines.
    let text = text.split("==========\n").nth(1).unwrap();
    let text = text.strip_suffix('\n').unwrap().to_string();
    (text, drafts_of(&out))
}

/// (accepted, proposed) from "Speculative: …, acceptance 0.556 (20/36), …".
fn drafts_of(out: &Output) -> Option<(u64, u64)> {
    let err = stderr(out);
    let line = err.lines().find(|l| l.starts_with("Speculative: "))?;
    let counts = line.split(" (").nth(1)?.split(')').next()?;
    let (a, p) = counts.split_once('/')?;
    Some((a.parse().ok()?, p.parse().ok()?))
}

fn body(prompt: &str, max_tokens: usize, stream: bool) -> Json {
    json!({
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

/// A completion's text and usage, streamed or not.
fn complete(server: &Server, body: &Json) -> (String, Json) {
    if body["stream"] == json!(true) {
        let events = server.stream("/v1/completions", body);
        assert_eq!(events.last().unwrap(), "[DONE]");
        let chunks: Vec<Json> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let text = (chunks.iter())
            .filter_map(|c| c["choices"].get(0)?["text"].as_str())
            .collect();
        (text, chunks.last().unwrap()["usage"].clone())
    } else {
        let (status, reply) = server.post("/v1/completions", body);
        assert_eq!(status, 200, "{reply}");
        let text = reply["choices"][0]["text"].as_str().unwrap().to_string();
        (text, reply["usage"].clone())
    }
}

/// (accepted, proposed) draft tokens of a usage object.
fn drafts(usage: &Json) -> (u64, u64) {
    let details = &usage["completion_tokens_details"];
    let accepted = details["accepted_prediction_tokens"].as_u64();
    let rejected = details["rejected_prediction_tokens"].as_u64();
    let (accepted, rejected) = accepted.zip(rejected).expect("draft tokens in the usage");
    (accepted, accepted + rejected)
}

/// A counter of /metrics.
fn counter(server: &Server, name: &str) -> u64 {
    let (status, text) = server.call("/metrics", None, None);
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// The `n`-th line of a 40-token request in the server's log, once its stderr has been read
/// that far (the worker writes it just before the request's last event).
fn log_line(server: &Server, n: usize) -> String {
    for _ in 0..500 {
        let log = server.log();
        let mut lines =
            (log.into_iter()).filter(|l| l.starts_with("request: ") && l.contains(" 40 generated"));
        if let Some(line) = lines.nth(n - 1) {
            return line;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("no log line {n} of a 40-token request: {:?}", server.log())
}

#[test]
fn replies_with_mtp_are_generates_alone_and_beside_another() {
    let (code, _) = generate(CODE, 40, &["--temp", "0"]);
    let (story, _) = generate(STORY, 16, &["--temp", "0"]);
    let (code_spec, code_drafts) = generate(CODE, 40, &["--temp", "0", "--draft-tokens", "2"]);
    assert_eq!(code_spec, code, "generate with speculation");
    let code_drafts = code_drafts.expect("generate's stats line");
    assert!(code_drafts.0 > 0, "{code_drafts:?}");
    let sampling = [
        "--temp", "0.8", "--seed", "3", "--top-p", "0.9", "--top-k", "20",
    ];
    let (sampled, _) = generate(
        SAMPLED,
        24,
        &[&sampling[..], &["--draft-tokens", "2"]].concat(),
    );

    // Without MTP (flags that ask for it, overruled): the greedy texts, and no draft tokens.
    let plain = Server::start_on(&mtp_model(), &["--draft-tokens", "2", "--no-mtp"], &[]);
    let (text, usage) = complete(&plain, &body(CODE, 40, false));
    assert_eq!(text, code);
    assert!(usage.get("completion_tokens_details").is_none(), "{usage}");
    drop(plain);

    // 15 ms after each piece of text: the second request below joins while the first runs.
    let server = Server::start_on(
        &mtp_model(),
        &["--draft-tokens", "2", "--max-batch", "4"],
        &[("QWEN_GDN_TEST_TOKEN_DELAY_MS", "15")],
    );
    assert!(
        (server.log().iter()).any(|l| l.contains("speculative decoding with the MTP head")),
        "{:?}",
        server.log()
    );
    let mut accepted_sum = 0;
    let mut proposed_sum = 0;

    // Alone: generate's text and its very drafts.
    let (text, usage) = complete(&server, &body(CODE, 40, false));
    assert_eq!(text, code);
    assert_eq!(drafts(&usage), code_drafts, "{usage}");
    accepted_sum += code_drafts.0;
    proposed_sum += code_drafts.1;
    let (text, usage) = complete(&server, &body(STORY, 16, true));
    assert_eq!(text, story);
    let d = drafts(&usage);
    accepted_sum += d.0;
    proposed_sum += d.1;
    // Seeded sampling draws per draft: the same text only if every draft is generate's.
    let mut sampled_body = body(SAMPLED, 24, false);
    for (k, v) in [("temperature", json!(0.8)), ("seed", json!(3))] {
        sampled_body[k] = v;
    }
    (sampled_body["top_p"], sampled_body["top_k"]) = (json!(0.9), json!(20));
    let (text, usage) = complete(&server, &sampled_body);
    assert_eq!(text, sampled, "seeded sampling with speculation");
    let d = drafts(&usage);
    accepted_sum += d.0;
    proposed_sum += d.1;

    // Together: the long one streams alone (speculative steps), the short one joins (plain
    // batched steps for both), leaves, and the long one speculates again to its end.
    let server = std::sync::Arc::new(server);
    let (started, under_way) = std::sync::mpsc::channel();
    let long = {
        let server = server.clone();
        std::thread::spawn(move || {
            let response = ureq::post(&format!("{}/v1/completions", server.base))
                .header("Content-Type", "application/json")
                .send(body(CODE, 40, true).to_string())
                .unwrap();
            let mut reader = std::io::BufReader::new(response.into_body().into_reader());
            // The first piece of text, then the other request is sent.
            let mut line = String::new();
            while !line.starts_with("data: ") {
                line.clear();
                std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
            }
            started.send(()).unwrap();
            let rest = std::io::read_to_string(reader).unwrap();
            line + &rest
        })
    };
    under_way.recv().unwrap();
    let (short_text, short_usage) = complete(&server, &body(STORY, 16, false));
    let events: Vec<Json> = long
        .join()
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let long_text: String = (events.iter())
        .filter_map(|c| c["choices"].get(0)?["text"].as_str())
        .collect();
    let long_usage = events.last().unwrap()["usage"].clone();
    assert_eq!(long_text, code, "beside another request");
    assert_eq!(short_text, story, "beside another request");
    // 40 tokens: the first from the prompt, then per speculative step its accepted drafts and
    // one more, per plain step one. The long request took both kinds of step.
    let (accepted, proposed) = drafts(&long_usage);
    let generated = long_usage["completion_tokens"].as_u64().unwrap();
    let verify_steps = counter(&server, "qwen_gdn_spec_decode_verify_steps_total");
    let line = log_line(&server, 2);
    let long_steps: u64 = common::leading_number(line.split(" accepted in ").nth(1).unwrap())
        .try_into()
        .unwrap();
    assert!(
        line.contains(&format!("({accepted}/{proposed} draft tokens accepted in ")),
        "{line}"
    );
    let plain_steps = generated - 1 - long_steps - accepted;
    eprintln!("{line}: {plain_steps} plain steps; alone: {code_drafts:?}");
    assert!(long_steps > 0 && plain_steps > 0, "{line}");
    assert!(verify_steps >= long_steps);
    for (a, p) in [drafts(&long_usage), drafts(&short_usage)] {
        accepted_sum += a;
        proposed_sum += p;
    }

    let metric = |name| counter(&server, name);
    assert_eq!(
        metric("qwen_gdn_spec_decode_accepted_tokens_total"),
        accepted_sum
    );
    assert_eq!(
        metric("qwen_gdn_spec_decode_draft_tokens_total"),
        proposed_sum
    );
}

#[test]
fn bad_draft_settings_are_refused_in_one_line() {
    for bad in ["0", "many"] {
        let out = run_model(
            "serve",
            &mtp_model(),
            &["--port", "0", "--draft-tokens", bad],
        );
        assert!(!out.status.success(), "--draft-tokens {bad} was accepted");
        let err = stderr(&out);
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(errors.len(), 1, "{err}");
        assert!(errors[0].contains("--draft-tokens"), "{err}");
    }
    // A checkpoint without an MTP head: generate's one line.
    let out = run_model(
        "serve",
        &fixture("qwen3.5-tiny-4bit"),
        &["--port", "0", "--draft-tokens", "2"],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains("--draft-tokens") && errors[0].contains("no MTP head"),
        "{err}"
    );
}
