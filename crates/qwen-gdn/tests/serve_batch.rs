//! `serve`'s continuous batching end to end (issue 29): requests of different lengths run
//! together, one joining mid-way and one cancelled mid-stream, streamed and not, greedy, seeded
//! sampling and a stop string, prompts prefilled in pieces between the others' decode
//! steps; each gives exactly the text and usage it gives alone (a
//! request served by itself, which is a batch of one: the engine's single-sequence step).
//! The reference plan (f32 on the CPU) makes a batched row the same bits as that sequence
//! alone, so the texts must be equal, not close.
//! Also: a request's `n` choices (one prefill, each choice its own sequence, choice i seeded
//! with seed + i) each equal the reply alone with that seed; a reply whose own sampling
//! panics mid-batch fails alone while the others stay exact.

mod common;

use common::serve_server::Server;
use serde_json::{json, Value as Json};
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A completions request: its prompt, length and sampling.
#[derive(Clone)]
struct Ask {
    prompt: &'static str,
    max_tokens: usize,
    extra: Json,
}

impl Ask {
    fn body(&self, stream: bool) -> Json {
        let mut body = json!({
            "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0,
            "stream": stream,
        });
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        for (k, v) in self.extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    }
}

fn asks() -> Vec<Ask> {
    vec![
        Ask {
            prompt: "Once upon a time",
            max_tokens: 40,
            extra: json!({}),
        },
        Ask {
            prompt: "The capital of France is",
            max_tokens: 9,
            extra: json!({}),
        },
        Ask {
            prompt: "1, 2, 3, 4,",
            max_tokens: 27,
            extra: json!({}),
        },
        Ask {
            prompt: "def main():",
            max_tokens: 33,
            extra: json!({"temperature": 0.9, "seed": 7}),
        },
        Ask {
            prompt: "Dear friend, I write",
            max_tokens: 30,
            extra: json!({"stop": ["e"]}),
        },
    ]
}

/// The text, finish reason and usage of a plain request.
fn plain(server: &Server, ask: &Ask) -> (String, Json, Json) {
    let (status, reply) = server.post("/v1/completions", &ask.body(false));
    assert_eq!(status, 200, "{reply}");
    let choice = &reply["choices"][0];
    (
        choice["text"].as_str().unwrap().to_string(),
        choice["finish_reason"].clone(),
        reply["usage"].clone(),
    )
}

/// The same from a streamed request, read as it comes; with `cancel_after`, the client
/// hangs up after that many text chunks (and `None` is returned).
fn streamed(
    server: &Server,
    ask: &Ask,
    cancel_after: Option<usize>,
) -> Option<(String, Json, Json)> {
    let response = ureq::post(&format!("{}/v1/completions", server.base))
        .header("Content-Type", "application/json")
        .send(ask.body(true).to_string())
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let reader = BufReader::new(response.into_body().into_reader());
    let (mut text, mut finish, mut usage, mut chunks) = (String::new(), Json::Null, Json::Null, 0);
    for line in reader.lines() {
        let line = line.expect("the stream was cut");
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            assert!(!finish.is_null(), "a stream without a finish_reason");
            return Some((text, finish, usage));
        }
        let chunk: Json = serde_json::from_str(data).unwrap();
        assert!(chunk.get("error").is_none(), "{chunk}");
        if let Some(choice) = chunk["choices"].get(0) {
            text.push_str(choice["text"].as_str().unwrap_or_default());
            if !choice["finish_reason"].is_null() {
                finish = choice["finish_reason"].clone();
            }
            chunks += 1;
        }
        if !chunk["usage"].is_null() {
            usage = chunk["usage"].clone();
        }
        if cancel_after.is_some_and(|n| chunks >= n) {
            return None;
        }
    }
    panic!("the stream ended without [DONE]")
}

/// The most generations `/metrics` saw running at once, polled until `done`.
fn watch_running(server: &Server, done: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let base = server.base.clone();
    let widest = Arc::new(AtomicU64::new(0));
    std::thread::spawn(move || {
        while !done.load(Ordering::Relaxed) {
            let text = ureq::get(&format!("{base}/metrics"))
                .call()
                .unwrap()
                .into_body()
                .read_to_string()
                .unwrap();
            let running = text
                .lines()
                .find_map(|l| l.strip_prefix("qwen_gdn_requests_running "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0);
            widest.fetch_max(running as u64, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(10));
        }
        widest.load(Ordering::Relaxed)
    })
}

#[test]
fn concurrent_requests_each_get_their_text_alone() {
    // 15 ms a piece of text: the requests overlap for certain. Prefill chunks of 2 tokens:
    // a prompt's prefill runs in pieces between the others' decode steps.
    let server = Server::start(
        &["--max-batch", "8", "--prefill-chunk-size", "2"],
        &[("QWEN_GDN_TEST_TOKEN_DELAY_MS", "15")],
    );
    let asks = asks();
    // Alone: one request at a time (each a batch of one). The second pass below then hits
    // the prompt cache, which joins the batch at its cached position.
    let alone: Vec<_> = asks.iter().map(|ask| plain(&server, ask)).collect();
    for (ask, (text, _, usage)) in asks.iter().zip(&alone) {
        let stops = ask.extra.get("stop").is_some();
        assert!(stops || !text.is_empty(), "{}: no text", ask.prompt);
        assert!(usage["completion_tokens"].as_u64().unwrap() > 0);
    }
    let done = Arc::new(AtomicBool::new(false));
    let watcher = watch_running(&server, done.clone());
    let server = Arc::new(server);
    let run = |i: usize, stream: bool| {
        let (server, ask) = (server.clone(), asks[i].clone());
        std::thread::spawn(move || match stream {
            true => streamed(&server, &ask, None).unwrap(),
            false => plain(&server, &ask),
        })
    };
    // The longest, streamed, starts first; the others join it, one once it is under way.
    let first = {
        let (server, ask) = (server.clone(), asks[0].clone());
        std::thread::spawn(move || streamed(&server, &ask, None).unwrap())
    };
    let mut together = vec![];
    for (i, stream) in [(1, false), (2, true), (3, false)] {
        together.push((i, run(i, stream)));
    }
    // A client that hangs up mid-stream; its slot is freed and the others go on.
    let cancelled = {
        let server = server.clone();
        let ask = Ask {
            prompt: "A long story:",
            max_tokens: 10_000,
            extra: json!({}),
        };
        std::thread::spawn(move || streamed(&server, &ask, Some(3)))
    };
    assert!(cancelled.join().unwrap().is_none());
    // Joins mid-way: the others are decoding by now.
    together.push((4, run(4, true)));
    together.push((0, first));
    for (i, handle) in together {
        let got = handle.join().unwrap();
        assert_eq!(got.0, alone[i].0, "{}: text in the batch", asks[i].prompt);
        assert_eq!(got.1, alone[i].1, "{}: finish", asks[i].prompt);
        let (a, b) = (&got.2, &alone[i].2);
        assert_eq!(
            a["completion_tokens"], b["completion_tokens"],
            "{}",
            asks[i].prompt
        );
        assert_eq!(a["prompt_tokens"], b["prompt_tokens"], "{}", asks[i].prompt);
    }
    done.store(true, Ordering::Relaxed);
    let widest = watcher.join().unwrap();
    assert!(
        widest >= 3,
        "the requests did not run together (at most {widest} at once)"
    );
    // The server is healthy, and the cancelled request was logged as such.
    let (status, _) = server.call("/health", None, None);
    assert_eq!(status, 200);
    let log = server.log();
    assert!(log.iter().any(|l| l.contains("cancelled")), "{log:?}");
}

#[test]
fn max_batch_zero_is_refused_with_one_line() {
    let out = common::command(&[
        "serve",
        "--model",
        common::fixture(common::serve_server::MODEL)
            .to_str()
            .unwrap(),
        "--max-batch",
        "0",
    ])
    .output()
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--max-batch"), "{err}");
    assert!(err.contains("at least 1"), "{err}");
}

#[test]
fn the_batch_size_is_printed_at_start() {
    let server = Server::start(&[], &[]);
    let log = server.log();
    assert!(
        log.iter()
            .any(|l| l.contains("--max-batch ") && l.contains("positions")),
        "{log:?}"
    );
    drop(server);
    let server = Server::start(&["--max-batch", "3"], &[]);
    let log = server.log();
    assert!(log.iter().any(|l| l.contains("--max-batch 3 (")), "{log:?}");
}

/// Every chunk of a streamed request, read to its `[DONE]` (a stream cut before it fails).
fn stream_chunks(server: &Server, path: &str, body: &Json) -> Vec<Json> {
    let response = ureq::post(&format!("{}{path}", server.base))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let reader = BufReader::new(response.into_body().into_reader());
    let mut chunks = vec![];
    for line in reader.lines() {
        let line = line.expect("the stream was cut");
        match line.strip_prefix("data: ") {
            Some("[DONE]") => return chunks,
            Some(data) => chunks.push(serde_json::from_str(data).unwrap()),
            None => {}
        }
    }
    panic!("the stream ended without [DONE]")
}

/// `body` with `fields` set.
fn with(body: &Json, fields: Json) -> Json {
    let mut body = body.clone();
    for (k, v) in fields.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// A choice as the tests compare it: its text (or message), finish and log-probabilities.
fn choice_of(choice: &Json) -> Json {
    json!({"text": choice["text"], "message": choice["message"],
           "finish_reason": choice["finish_reason"], "logprobs": choice["logprobs"]})
}

#[test]
fn each_choice_of_n_is_its_reply_alone_with_seed_plus_its_index() {
    let server = Server::start(&["--max-batch", "4", "--prefill-chunk-size", "3"], &[]);
    let schema = json!({"type": "object", "properties": {"answer": {"enum": ["yes", "no", 3, null]}},
                        "required": ["answer"], "additionalProperties": false});
    let cases = [
        // Sampled, with a stop string and log-probabilities per choice.
        (
            "/v1/completions",
            json!({"prompt": "def main():", "max_tokens": 14, "temperature": 0.9, "seed": 7,
                   "stop": ["e"], "logprobs": 2}),
        ),
        // A constraint per choice (each its own place in the grammar).
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Say yes or no."}], "max_tokens": 60,
                   "temperature": 1, "seed": 3,
                   "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}),
        ),
    ];
    for (path, body) in cases {
        // The n request first, on a cold prompt cache: its prompt is prefilled (in pieces),
        // not restored.
        let (status, together) = server.post(path, &with(&body, json!({"n": 3})));
        assert_eq!(status, 200, "{together}");
        let choices = together["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3, "{together}");
        let mut completion_tokens = 0;
        for (i, choice) in choices.iter().enumerate() {
            assert_eq!(choice["index"], i, "{together}");
            let seed = body["seed"].as_u64().unwrap() + i as u64;
            let (status, alone) = server.post(path, &with(&body, json!({"seed": seed})));
            assert_eq!(status, 200, "{alone}");
            assert_eq!(
                choice_of(choice),
                choice_of(&alone["choices"][0]),
                "{path} choice {i} against seed {seed} alone"
            );
            assert_eq!(
                together["usage"]["prompt_tokens"],
                alone["usage"]["prompt_tokens"]
            );
            completion_tokens += alone["usage"]["completion_tokens"].as_u64().unwrap();
        }
        // The prompt counted once, the completions summed.
        assert_eq!(together["usage"]["completion_tokens"], completion_tokens);
        let distinct: std::collections::HashSet<String> =
            choices.iter().map(|c| choice_of(c).to_string()).collect();
        assert!(
            distinct.len() > 1,
            "the seeds made no difference: {together}"
        );
        // Streamed: the same choices, each chunk naming its choice.
        let chunks = stream_chunks(
            &server,
            path,
            &with(
                &body,
                json!({"n": 3, "stream": true, "stream_options": {"include_usage": true}}),
            ),
        );
        let mut texts = vec![String::new(); 3];
        let mut finishes = vec![Json::Null; 3];
        for chunk in &chunks {
            assert!(chunk.get("error").is_none(), "{chunk}");
            for c in chunk["choices"].as_array().unwrap() {
                let i = c["index"].as_u64().unwrap() as usize;
                let piece = c["text"].as_str().or(c["delta"]["content"].as_str());
                texts[i].push_str(piece.unwrap_or_default());
                if !c["finish_reason"].is_null() {
                    finishes[i] = c["finish_reason"].clone();
                }
            }
        }
        for (i, choice) in choices.iter().enumerate() {
            let whole = choice["text"]
                .as_str()
                .or(choice["message"]["content"].as_str());
            assert_eq!(texts[i], whole.unwrap(), "{path} streamed choice {i}");
            assert_eq!(
                finishes[i], choice["finish_reason"],
                "{path} streamed choice {i}"
            );
        }
        let usage = &chunks.last().unwrap()["usage"];
        assert_eq!(usage["completion_tokens"], completion_tokens, "{chunks:?}");
    }
    // More choices than run together: a 400 in OpenAI's shape, naming `n`.
    let (status, reply) = server.post(
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 2, "n": 5}),
    );
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["param"], "n", "{reply}");
}

#[test]
fn a_panic_in_one_replys_sampling_fails_that_reply_alone() {
    // Each reply whose prompt holds the marker panics at its third token, in its own
    // sampling (a constraint that panics), while the others decode beside it.
    let server = Server::start(
        &["--max-batch", "8"],
        &[
            ("QWEN_GDN_TEST_TOKEN_DELAY_MS", "15"),
            ("QWEN_GDN_TEST_REPLY_PANIC", "FAULT"),
        ],
    );
    let asks = &asks()[..3];
    let alone: Vec<_> = asks.iter().map(|ask| plain(&server, ask)).collect();
    let server = Arc::new(server);
    let others: Vec<_> = asks
        .iter()
        .enumerate()
        .map(|(i, ask)| {
            let (server, ask) = (server.clone(), ask.clone());
            std::thread::spawn(move || match i % 2 {
                0 => streamed(&server, &ask, None).unwrap(),
                _ => plain(&server, &ask),
            })
        })
        .collect();
    // Once the others are decoding, two faulty replies join them: plain and streamed.
    std::thread::sleep(Duration::from_millis(150));
    let faulty = json!({"prompt": "FAULT: once", "max_tokens": 20, "temperature": 0});
    let (status, reply) = server.post("/v1/completions", &faulty);
    assert_eq!(status, 500, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("test panic in one reply"), "{reply}");
    let chunks = stream_chunks(
        &server,
        "/v1/completions",
        &with(&faulty, json!({"stream": true})),
    );
    let last = chunks.last().unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("test panic in one reply"),
        "{chunks:?}"
    );
    for (i, handle) in others.into_iter().enumerate() {
        let got = handle.join().unwrap();
        assert_eq!(
            got, alone[i],
            "{}: beside the panicking replies",
            asks[i].prompt
        );
    }
    let (status, _) = server.call("/health", None, None);
    assert_eq!(status, 200);
    assert_eq!(plain(&server, &asks[1]), alone[1], "after");
}
