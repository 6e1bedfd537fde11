//! `qwen-gdn serve` end to end: the built binary on a free port with a tiny checkpoint,
//! driven over HTTP (ureq, and raw sockets where a client must hang up midway).

mod common;

use common::serve_server::{serve_command, Server, MODEL};
use common::*;
use serde_json::{json, Value as Json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn user(text: &str) -> Json {
    json!([{"role": "user", "content": text}])
}

/// The OpenAI error shape, with the status and (when given) the param and code.
fn assert_api_error(status: u16, body: &Json, want: u16, param: Option<&str>, code: Option<&str>) {
    assert_eq!(status, want, "{body}");
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(e["type"].is_string(), "{body}");
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "{body}"
    );
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{body}");
    }
    if let Some(c) = code {
        assert_eq!(e["code"], c, "{body}");
    }
}

/// `generate --temp 0 --verbose false`'s text (its trailing newline dropped) and its
/// prompt-token count (from a second, verbose run's stats).
fn generate(prompt: &str, max_tokens: usize, extra: &[&str]) -> (String, usize) {
    let model = fixture(MODEL);
    let n = max_tokens.to_string();
    let mut args = vec!["-p", prompt, "--temp", "0", "--max-tokens", &n];
    args.extend_from_slice(extra);
    let mut quiet = args.clone();
    quiet.extend(["--verbose", "false"]);
    let out = run_model("generate", &model, &quiet);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let text = text.strip_suffix('\n').unwrap().to_string();
    let out = run_model("generate", &model, &args);
    let err = stderr(&out);
    let prompt_tokens = err
        .lines()
        .find_map(|l| l.strip_prefix("Prompt: ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no prompt stats: {err}"));
    (text, prompt_tokens)
}

#[test]
fn greedy_replies_equal_generate_streamed_or_not() {
    let server = Server::start(&[], &[]);
    let prompt = "Tell me about the sea.";
    // Chat, through the template, thinking off: the whole reply is content (the reasoning
    // parser finds the prompt's closed think block).
    let (expected, prompt_tokens) = generate(prompt, 24, &["--enable-thinking", "false"]);
    let body = json!({
        "model": fixture(MODEL).to_str().unwrap(), "messages": user(prompt), "max_tokens": 24,
        "temperature": 0, "chat_template_kwargs": {"enable_thinking": false},
    });
    let (status, reply) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    let message = &reply["choices"][0]["message"];
    assert_eq!(message["content"], expected);
    assert!(message.get("reasoning_content").is_none(), "{reply}");
    assert_eq!(reply["object"], "chat.completion");
    assert_eq!(reply["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(
        reply["usage"]["total_tokens"],
        reply["usage"]["prompt_tokens"].as_u64().unwrap()
            + reply["usage"]["completion_tokens"].as_u64().unwrap()
    );
    // A fresh server has nothing cached.
    assert_eq!(reply["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let reason = reply["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(["stop", "length"].contains(&reason), "{reply}");

    // The same, streamed: the deltas join to the same text; usage comes last.
    let mut body = body.clone();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let events = server.stream("/v1/chat/completions", &body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Json> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut streamed = String::new();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(choice) = c["choices"].get(0) {
            assert!(choice["delta"].get("reasoning_content").is_none(), "{c}");
            streamed.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(streamed, expected);
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["prompt_tokens"], prompt_tokens);
    // The same prompt again starts from the prompt cache (a snapshot at a message boundary;
    // at least the last token is run, its logits give the first new one) and still gives
    // generate's text.
    let cached = usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached > 0 && cached < prompt_tokens as u64, "{usage_chunk}");
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        reason
    );

    // Completions: the raw prompt, as generate --ignore-chat-template.
    let (expected, prompt_tokens) = generate(prompt, 16, &["--ignore-chat-template"]);
    let body = json!({"prompt": prompt, "max_tokens": 16, "temperature": 0});
    let (status, reply) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["object"], "text_completion");
    assert_eq!(reply["choices"][0]["text"], expected);
    assert_eq!(reply["usage"]["prompt_tokens"], prompt_tokens);
    let mut body = body.clone();
    body["stream"] = json!(true);
    let events = server.stream("/v1/completions", &body);
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Json>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, expected);
    assert_eq!(events.last().unwrap(), "[DONE]");
}

#[test]
fn models_health_and_stop_strings() {
    let server = Server::start(&["--served-model-name", "tiny"], &[]);
    let (status, body) = server.call("/health", None, None);
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.call("/v1/models", None, None);
    assert_eq!(status, 200);
    let models: Json = serde_json::from_str(&body).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(server.call("/v1/models/tiny", None, None).0, 200);
    // A stop string taken from the greedy output itself cuts the reply just before it.
    let body = json!({"model": "tiny", "prompt": "Tell me about the sea.", "max_tokens": 16, "temperature": 0});
    let (_, full) = server.post("/v1/completions", &body);
    let full = full["choices"][0]["text"].as_str().unwrap().to_string();
    let cut = full
        .char_indices()
        .map(|(i, _)| i)
        .nth(full.chars().count() / 2)
        .unwrap();
    let stop: String = full[cut..].chars().take(2).collect();
    let mut body = body.clone();
    body["stop"] = json!([stop]);
    let (status, reply) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{reply}");
    let text = reply["choices"][0]["text"].as_str().unwrap();
    assert_eq!(text, &full[..full.find(&stop).unwrap()]);
    assert_eq!(reply["choices"][0]["finish_reason"], "stop");
}

#[test]
fn bad_requests_get_openai_errors() {
    let server = Server::start(&["--max-request-bytes", "2000000"], &[]);
    let chat = "/v1/chat/completions";
    let (status, body) = server.call(chat, Some("{\"messages\": ["), None);
    assert_api_error(
        status,
        &serde_json::from_str(&body).unwrap(),
        400,
        None,
        None,
    );
    let cases = [
        (
            json!({"messages": user("hi"), "temperature": "hot"}),
            "temperature",
        ),
        (
            json!({"messages": user("hi"), "temperature": -0.5}),
            "temperature",
        ),
        (json!({"messages": user("hi"), "top_p": 1.5}), "top_p"),
        (json!({"messages": user("hi"), "min_p": -1}), "min_p"),
        (
            json!({"messages": user("hi"), "max_tokens": 0}),
            "max_tokens",
        ),
        (json!({"messages": "hi"}), "messages"),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (json!({"messages": user("hi"), "stop": 3}), "stop"),
        // OpenAI's rules: content is required but in an assistant turn that calls tools; a
        // tool's parameters are a JSON Schema object.
        (
            json!({"messages": [{"role": "user", "content": null}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": user("hi"), "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
            "tools[0].function.parameters",
        ),
    ];
    for (body, param) in cases {
        let (status, reply) = server.post(chat, &body);
        assert_api_error(status, &reply, 400, Some(param), None);
    }
    // Unknown model and route.
    let (status, reply) = server.post(chat, &json!({"model": "gpt-4o", "messages": user("hi")}));
    assert_api_error(status, &reply, 404, Some("model"), Some("model_not_found"));
    let (status, body) = server.call("/v1/nothing", None, None);
    assert_api_error(
        status,
        &serde_json::from_str(&body).unwrap(),
        404,
        None,
        None,
    );
    // Too many tokens for the 4096-token context (found by tokenizing) ...
    let long = "sea ".repeat(6000);
    let (status, reply) = server.post(chat, &json!({"messages": user(&long)}));
    assert_api_error(status, &reply, 400, None, Some("context_length_exceeded"));
    let (status, reply) = server.post("/v1/completions", &json!({"prompt": long, "stream": true}));
    assert_api_error(status, &reply, 400, None, Some("context_length_exceeded"));
    // ... and more bytes than any 4096-token prompt can take (refused before tokenizing).
    let huge = "x".repeat(1_500_000);
    let (status, reply) = server.post(chat, &json!({"messages": user(&huge)}));
    assert_api_error(status, &reply, 400, None, Some("context_length_exceeded"));
    // A body over --max-request-bytes, refused from its Content-Length before it is read
    // (the server closes the connection: write what it takes, then read the answer).
    let over = json!({"messages": user(&"y".repeat(2_100_000))}).to_string();
    let mut socket = TcpStream::connect(server.addr()).unwrap();
    let head = format!(
        "POST {chat} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        over.len()
    );
    let _ = socket
        .write_all(head.as_bytes())
        .and_then(|_| socket.write_all(over.as_bytes()));
    let mut reply = String::new();
    let _ = socket.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    let body: Json = serde_json::from_str(reply.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_api_error(413, &body, 413, None, None);
    // The server still answers.
    let (status, reply) = server.post(chat, &json!({"messages": user("hi"), "max_tokens": 2}));
    assert_eq!(status, 200, "{reply}");
}

#[test]
fn the_api_key_is_checked() {
    let server = Server::start(&["--api-key", "sekrit"], &[]);
    let body = json!({"prompt": "hi", "max_tokens": 1}).to_string();
    for key in [None, Some("wrong")] {
        let (status, reply) = server.call("/v1/completions", Some(&body), key);
        assert_api_error(
            status,
            &serde_json::from_str(&reply).unwrap(),
            401,
            None,
            None,
        );
        assert_eq!(server.call("/v1/models", None, key).0, 401);
    }
    assert_eq!(
        server
            .call("/v1/completions", Some(&body), Some("sekrit"))
            .0,
        200
    );
    assert_eq!(server.call("/v1/models", None, Some("sekrit")).0, 200);
    // Health checks stay open, as vLLM's.
    assert_eq!(server.call("/health", None, None).0, 200);
}

/// Runs `cmd`, which must fail at once (a settings error: nothing is loaded or served); a
/// server that starts instead is killed after 60 s and fails the test.
fn run_expecting_failure(mut cmd: std::process::Command) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("still running after 60 s: {}", stderr(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn an_empty_api_key_is_refused() {
    let out = run_expecting_failure(serve_command(&["--api-key", ""], &[]));
    assert_error(&out, &["--api-key", "empty"]);
    let out = run_expecting_failure(serve_command(&[], &[("QWEN_GDN_API_KEY", "")]));
    assert_error(&out, &["QWEN_GDN_API_KEY", "empty"]);
    let out = run_expecting_failure(serve_command(&["--api-key", "  "], &[]));
    assert_error(&out, &["--api-key", "empty"]);
}

/// `sh -c 'ulimit -n <n>; exec qwen-gdn serve …'`: the server under a descriptor limit.
fn serve_under_ulimit(descriptors: u32, extra: &[&str]) -> std::process::Command {
    let inner = serve_command(extra, &[]);
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -n {descriptors} && exec \"$0\" \"$@\""))
        .arg(inner.get_program())
        .args(inner.get_args());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd
}

/// The connection cap is read from the descriptor limit at start and printed; one that
/// does not fit is refused before anything is loaded.
#[test]
fn the_connection_cap_follows_the_descriptor_limit() {
    let server = Server::spawn(serve_under_ulimit(256, &[]));
    wait_for_log(
        &server,
        "at most 180 connections (open-file limit 256), 11 more for /health",
    );
    drop(server);
    let out = run_expecting_failure(serve_under_ulimit(256, &["--max-connections", "500"]));
    assert_error(&out, &["--max-connections 500", "256", "ulimit -n"]);
}

/// Reads from `socket` until the server closes it (EOF or a reset), for at most `limit`;
/// returns what arrived and when the connection ended, or None if it stayed open.
fn read_until_closed(socket: &mut TcpStream, limit: Duration) -> Option<(String, Instant)> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match socket.read(&mut buf) {
            Ok(0) => return Some((String::from_utf8_lossy(&seen).into_owned(), Instant::now())),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None
            }
            Err(_) => return Some((String::from_utf8_lossy(&seen).into_owned(), Instant::now())),
        }
    }
}

/// Slow and idle clients: a body that stops midway is answered 408, an idle kept-alive
/// connection is closed after its timeout, and a flood of half-sent request heads (ten times
/// the cap) neither shuts out /health nor stays open past the header timeout.
#[test]
fn slow_and_idle_clients_are_closed() {
    let header = Duration::from_secs(3);
    let server = Server::start(
        &[
            "--max-connections",
            "4",
            "--header-timeout",
            "3",
            "--body-timeout",
            "1",
            "--keep-alive-timeout",
            "1",
        ],
        &[],
    );
    wait_for_log(&server, "at most 4 connections");
    let connect = || TcpStream::connect(server.addr()).unwrap();
    // What a new connection that sends `request` reads until the server closes it, and how
    // long after the sending that was.
    let closed_after = |request: &[u8], what: &str| {
        let mut socket = connect();
        socket.write_all(request).unwrap();
        let sent = Instant::now();
        let (reply, closed) = read_until_closed(&mut socket, Duration::from_secs(10)).expect(what);
        (reply, closed - sent)
    };

    // A body that stops after 10 of its 100 bytes.
    let (reply, took) = closed_after(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":",
        "the slow body was not answered",
    );
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("--body-timeout"), "{reply}");
    assert!(took >= Duration::from_millis(900), "{took:?}");

    // An idle kept-alive connection, after one answered request.
    let (reply, took) = closed_after(
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "the idle connection stayed open",
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // The keep-alive timeout (1 s), well before the header timeout (3 s).
    assert!(
        took >= Duration::from_millis(900) && took < header,
        "{took:?}"
    );

    // The flood: request heads that never end.
    let opened = Instant::now();
    let mut slow: Vec<TcpStream> = (0..40)
        .map(|_| {
            let mut s = connect();
            s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
            s
        })
        .collect();
    for _ in 0..3 {
        let (status, body) = server.call("/health", None, None);
        assert_eq!(status, 200, "{body}");
    }
    // Past the cap, the rest of the API is answered 503 (in OpenAI's shape) at once.
    let (status, body) = server.call("/v1/models", None, None);
    if opened.elapsed() < header {
        assert_api_error(
            status,
            &serde_json::from_str(&body).unwrap(),
            503,
            None,
            None,
        );
    }
    // Every slow connection is closed by the header timeout (those over the cap earlier,
    // to make room); the first ones, served in full, not before it.
    for (i, socket) in slow.iter_mut().enumerate() {
        let left =
            (opened + header + Duration::from_secs(5)).saturating_duration_since(Instant::now());
        let (_, closed) = read_until_closed(socket, left)
            .unwrap_or_else(|| panic!("slow connection {i} still open"));
        if i == 0 {
            let after = closed - opened;
            assert!(after >= header - Duration::from_millis(200), "{after:?}");
        }
    }
    // And the server answers as before.
    assert_eq!(server.call("/health", None, None).0, 200);
    assert_eq!(server.call("/v1/models", None, None).0, 200);
}

/// Sends a completion request with `body` on a fresh raw socket (asking the server to close
/// it after the answer when `close`), and returns the socket.
fn post_raw(server: &Server, body: &Json, close: bool) -> TcpStream {
    let body = body.to_string();
    let close = if close { "Connection: close\r\n" } else { "" };
    let mut socket = TcpStream::connect(server.addr()).unwrap();
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{close}\r\n{body}",
        body.len()
    )
    .unwrap();
    socket
}

/// Sends a streamed request on a raw socket and returns it once the first text arrived.
fn start_stream(server: &Server, max_tokens: usize) -> TcpStream {
    let body = json!({"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": true});
    let mut socket = post_raw(server, &body, false);
    socket
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"text\"") {
        let n = socket.read(&mut buf).unwrap();
        assert!(n > 0, "stream closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    socket
}

/// Waits (bounded) until the server's log satisfies `done`.
fn wait_for_log_where(server: &Server, done: impl Fn(&[String]) -> bool) {
    let start = Instant::now();
    while !done(&server.log()) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{:?}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (bounded) for a log line containing `needle`.
fn wait_for_log(server: &Server, needle: &str) -> String {
    wait_for_log_where(server, |log| log.iter().any(|l| l.contains(needle)));
    server
        .log()
        .into_iter()
        .find(|l| l.contains(needle))
        .unwrap()
}

#[test]
fn a_client_that_disconnects_cancels_its_generation() {
    // 100 ms a token: the 10 000-token request would hold the worker for 17 minutes.
    let server = Server::start(&[], &[("QWEN_GDN_TEST_TOKEN_DELAY_MS", "100")]);
    let socket = start_stream(&server, 10_000);
    drop(socket);
    let line = wait_for_log(&server, "cancelled");
    let generated = leading_number(line.split(", ").nth(1).unwrap());
    assert!(generated < 100, "{line}");
    // The worker is free: the next request is served.
    let (status, reply) = server.post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 2}));
    assert_eq!(status, 200, "{reply}");
    // A request that is not streamed is cancelled as well when its client goes away.
    let body = json!({"prompt": "Once upon a time", "max_tokens": 10_000});
    let socket = post_raw(&server, &body, false);
    // Long enough for the idle worker to take the job up (a job whose client left while it
    // waited is skipped without a log line).
    std::thread::sleep(Duration::from_secs(1));
    drop(socket);
    wait_for_log_where(&server, |log| {
        log.iter().filter(|l| l.contains("cancelled")).count() >= 2
    });
}

#[test]
fn a_full_queue_answers_503() {
    let server = Server::start(
        &["--max-batch", "1", "--queue-size", "1"],
        &[("QWEN_GDN_TEST_TOKEN_DELAY_MS", "100")],
    );
    let running = start_stream(&server, 10_000);
    // One request runs (--max-batch 1); the second waits in the queue; further ones find it
    // full. (The first few tries may land before the waiting one, and then wait themselves.)
    let mut waiting = vec![];
    let rejected = (0..5).find_map(|_| {
        let body = json!({"prompt": "hi", "max_tokens": 10_000, "stream": true});
        let mut socket = post_raw(&server, &body, true);
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut reply = String::new();
        match socket.read_to_string(&mut reply) {
            Ok(_) if reply.starts_with("HTTP/1.1 503") => Some(reply),
            _ => {
                waiting.push(socket);
                None
            }
        }
    });
    let reply = rejected.expect("no 503 from a full queue");
    let body: Json = serde_json::from_str(reply.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_api_error(503, &body, 503, None, None);
    drop(running);
    drop(waiting);
    // The cancelled jobs leave the queue once the running one notices (at its next token).
    wait_for_log(&server, "cancelled");
    let served = (0..50).any(|_| {
        let (status, _) = server.post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 2}));
        std::thread::sleep(Duration::from_millis(100));
        status == 200
    });
    assert!(served, "{:?}", server.log());
}

#[test]
fn a_panic_is_answered_500_and_the_server_goes_on() {
    let server = Server::start(&[], &[("QWEN_GDN_TEST_PANIC", "PANIC-HERE")]);
    for stream in [false, true] {
        let (status, reply) = server.post(
            "/v1/chat/completions",
            &json!({"messages": user("please PANIC-HERE"), "stream": stream}),
        );
        assert_api_error(status, &reply, 500, None, None);
        let (status, reply) = server.post(
            "/v1/chat/completions",
            &json!({"messages": user("hello"), "max_tokens": 3}),
        );
        assert_eq!(status, 200, "{reply}");
    }
}

#[test]
fn a_template_past_its_limits_fails_only_its_request() {
    // The model's own template, preceded by a string doubled forty times (a terabyte) when
    // the last message says so.
    let (_tmp, dir) = copy_fixture(MODEL);
    let template = dir.join("chat_template.jinja");
    let own = std::fs::read_to_string(&template).unwrap();
    let bomb = "{% if messages[-1].content == 'explode' %}{% set ns = namespace(s='x') %}\
                {% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{% endif %}";
    std::fs::write(&template, format!("{bomb}{own}")).unwrap();
    let server = Server::start_on(&dir, &[], &[]);
    for stream in [false, true] {
        let (status, reply) = server.post(
            "/v1/chat/completions",
            &json!({"messages": user("explode"), "stream": stream}),
        );
        assert_api_error(status, &reply, 500, None, None);
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("chat template") && message.contains("QWEN_GDN_TEMPLATE_BYTES"),
            "{message}"
        );
        let (status, reply) = server.post(
            "/v1/chat/completions",
            &json!({"messages": user("hello"), "max_tokens": 3}),
        );
        assert_eq!(status, 200, "{reply}");
    }
}

fn weather_tool() -> Json {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}
        }, "required": ["city"]},
    }}])
}

/// `body` streamed from /v1/chat/completions: its chunks (`[DONE]` left out) and the
/// `tool_calls` of their deltas.
fn streamed_tool_calls(server: &Server, body: &Json) -> (Vec<Json>, Vec<Json>) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let events = server.stream("/v1/chat/completions", &body);
    let chunks: Vec<Json> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let calls = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"].get("tool_calls").cloned())
        .collect();
    (chunks, calls)
}

#[test]
fn tool_calls_come_back_in_openai_shape() {
    // The tiny models print gibberish: the reply is forced (a debug-build test switch) to a
    // Qwen3.5 XML call after some thinking.
    let forced = "Let me look.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis <Nord>\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    let server = Server::start(&[], &[("QWEN_GDN_TEST_FORCE_OUTPUT", forced)]);
    let body = json!({"messages": user("Weather in Paris?"), "tools": weather_tool()});
    let (status, reply) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    let message = &choice["message"];
    assert_eq!(message["reasoning_content"], "Let me look.");
    assert_eq!(message["content"], Json::Null);
    let call = &message["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Json = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris <Nord>", "days": 3}));

    // Streamed: one tool_calls delta with the whole call, then finish_reason tool_calls.
    let (chunks, calls) = streamed_tool_calls(&server, &body);
    assert_eq!(calls.len(), 1, "{chunks:?}");
    assert_eq!(calls[0][0]["index"], 0);
    assert_eq!(calls[0][0]["function"]["name"], "get_weather");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );

    // tool_choice "none": the same text is content, not a call.
    let body = json!({"messages": user("Weather?"), "tools": weather_tool(), "tool_choice": "none", "chat_template_kwargs": {"enable_thinking": false}});
    let (_, reply) = server.post("/v1/chat/completions", &body);
    assert_eq!(reply["choices"][0]["finish_reason"], "stop", "{reply}");
    assert!(
        reply["choices"][0]["message"].get("tool_calls").is_none(),
        "{reply}"
    );
    assert!(reply["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains("<tool_call>"));

    // The round trip: the call and its result go back through the template.
    let messages = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 C"},
    ]);
    let (status, reply) = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "tools": weather_tool()}),
    );
    assert_eq!(status, 200, "{reply}");
}

/// Tools whose every argument is bounded (lengths, ranges, enums, no extra keys): a call the
/// tiny model writes under the constraint always ends within a few dozen tokens.
fn bounded_tools() -> Json {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "where": {"type": "object", "properties": {
                    "zip": {"type": "integer", "minimum": 1000, "maximum": 9999}},
                    "required": ["zip"], "additionalProperties": false}},
            "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "set_alarm", "parameters": {
            "type": "object", "properties": {
                "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                "repeat": {"type": "boolean"},
                "on": {"type": "array", "items": {"enum": ["mon", "tue", "wed"]}, "maxItems": 3}},
            "required": ["hour", "repeat"], "additionalProperties": false}}},
    ])
}

/// Panics unless `name(arguments)` is a call to one of `tools` (to `named` when given) whose
/// arguments validate against that tool's schema.
fn assert_declared_call(
    name: &Json,
    arguments: &Json,
    tools: &Json,
    named: Option<&str>,
    at: &str,
) {
    let name = name.as_str().unwrap_or_else(|| panic!("{at}: no name"));
    if let Some(named) = named {
        assert_eq!(name, named, "{at}");
    }
    let tool = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("{at}: {name} was not declared"));
    assert_valid(arguments, &tool["function"]["parameters"], at);
}

#[test]
fn forced_tool_calls_are_well_formed_and_follow_the_schemas() {
    let tools = bounded_tools();
    // Both call formats: Qwen3.5's XML and Qwen3-Next's Hermes JSON.
    for model in [MODEL, "qwen3-next-tiny-4bit"] {
        let server = Server::start_on(&fixture(model), &[], &[]);
        let chat = "/v1/chat/completions";
        let ask = |choice: Json, temperature: u32, seed: u64| {
            json!({"messages": user("Weather in Paris?"), "tools": tools, "tool_choice": choice,
                   "max_tokens": 200, "temperature": temperature, "seed": seed})
        };
        // Bad choices and a schema the automaton refuses: 400s naming the field, in one line.
        let bad_schema = json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "strnig"}}, "required": ["x"]}}}]);
        for (body, param, says) in [
            (
                json!({"messages": user("hi"), "tool_choice": "required"}),
                "tool_choice",
                "tools",
            ),
            (
                json!({"messages": user("hi"), "tools": tools,
                       "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
                "nope",
            ),
            (
                json!({"messages": user("hi"), "tools": bad_schema, "tool_choice": "required"}),
                "tools",
                "strnig",
            ),
        ] {
            let (status, reply) = server.post(chat, &body);
            assert_api_error(status, &reply, 400, Some(param), None);
            let message = reply["error"]["message"].as_str().unwrap();
            assert!(
                message.contains(says) && !message.contains('\n'),
                "{message}"
            );
        }
        // Unconstrained, the random weights never write a call: only the constraint does.
        for seed in 0..3 {
            let mut body = ask(json!("auto"), 1, seed);
            body["chat_template_kwargs"] = json!({"enable_thinking": false});
            let (status, reply) = server.post(chat, &body);
            assert_eq!(status, 200, "{reply}");
            assert_ne!(
                reply["choices"][0]["finish_reason"], "tool_calls",
                "{model}: {reply}"
            );
        }
        let named = json!({"type": "function", "function": {"name": "set_alarm"}});
        for (choice, wanted) in [(json!("required"), None), (named, Some("set_alarm"))] {
            // Greedy, then sampled with three seeds.
            for (temperature, seed) in [(0, 0), (1, 0), (1, 1), (1, 2)] {
                let at = format!("{model} {choice} temperature {temperature} seed {seed}");
                let body = ask(choice.clone(), temperature, seed);
                let (status, reply) = server.post(chat, &body);
                assert_eq!(status, 200, "{at}: {reply}");
                let choice0 = &reply["choices"][0];
                assert_eq!(choice0["finish_reason"], "tool_calls", "{at}: {reply}");
                let calls = choice0["message"]["tool_calls"].as_array().unwrap();
                assert_eq!(calls.len(), 1, "{at}: {reply}");
                let function = &calls[0]["function"];
                let arguments: Json =
                    serde_json::from_str(function["arguments"].as_str().unwrap()).unwrap();
                assert_declared_call(&function["name"], &arguments, &tools, wanted, &at);

                // Streamed: the same call (the same seed samples the same tokens).
                let (chunks, streamed) = streamed_tool_calls(&server, &body);
                assert_eq!(streamed.len(), 1, "{at}: {chunks:?}");
                assert_eq!(streamed[0][0]["function"]["name"], function["name"], "{at}");
                assert_eq!(
                    streamed[0][0]["function"]["arguments"], function["arguments"],
                    "{at}"
                );
                assert_eq!(
                    chunks.last().unwrap()["choices"][0]["finish_reason"],
                    "tool_calls",
                    "{at}"
                );
            }
        }
    }
}

#[test]
fn anthropic_tool_choice_any_and_tool_are_constrained() {
    let server = Server::start(&[], &[]);
    let tools: Vec<Json> = bounded_tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let f = &t["function"];
            json!({"name": f["name"], "input_schema": f["parameters"]})
        })
        .collect();
    let declared = bounded_tools();
    for (choice, wanted) in [
        (json!({"type": "any"}), None),
        (
            json!({"type": "tool", "name": "get_weather"}),
            Some("get_weather"),
        ),
    ] {
        // Greedy, then sampled twice (Anthropic's API has no seed: any well-formed call passes).
        for (round, temperature) in [0, 1, 1].into_iter().enumerate() {
            let at = format!("{choice} temperature {temperature} round {round}");
            let body = json!({"model": fixture(MODEL), "max_tokens": 200,
                "temperature": temperature, "messages": [{"role": "user", "content": "Weather?"}],
                "tools": tools, "tool_choice": choice});
            let (status, reply) = server.post("/v1/messages", &body);
            assert_eq!(status, 200, "{at}: {reply}");
            assert_eq!(reply["stop_reason"], "tool_use", "{at}: {reply}");
            let calls: Vec<&Json> = reply["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .collect();
            assert_eq!(calls.len(), 1, "{at}: {reply}");
            assert_declared_call(
                &calls[0]["name"],
                &calls[0]["input"],
                &declared,
                wanted,
                &at,
            );

            let mut body = body.clone();
            body["stream"] = json!(true);
            let events: Vec<Json> = server
                .stream("/v1/messages", &body)
                .iter()
                .map(|e| serde_json::from_str(e).unwrap())
                .collect();
            let start = events
                .iter()
                .find(|e| {
                    e["type"] == "content_block_start" && e["content_block"]["type"] == "tool_use"
                })
                .unwrap_or_else(|| panic!("{at}: {events:?}"));
            let input: String = events
                .iter()
                .filter(|e| e["delta"]["type"] == "input_json_delta")
                .map(|e| e["delta"]["partial_json"].as_str().unwrap())
                .collect();
            let input: Json = serde_json::from_str(&input).unwrap();
            let name = &start["content_block"]["name"];
            assert_declared_call(name, &input, &declared, wanted, &at);
            let stop = events
                .iter()
                .find(|e| e["type"] == "message_delta")
                .unwrap_or_else(|| panic!("{at}: {events:?}"));
            assert_eq!(stop["delta"]["stop_reason"], "tool_use", "{at}");
        }
    }
    // Anthropic's error shape for a tool_choice that names no declared tool, or asks for any
    // call with no tools.
    for choice in [
        json!({"type": "tool", "name": "nope"}),
        json!({"type": "any"}),
    ] {
        let mut body = json!({"model": fixture(MODEL), "max_tokens": 20,
            "messages": [{"role": "user", "content": "Weather?"}], "tool_choice": choice});
        if choice["type"] == "tool" {
            body["tools"] = json!(tools);
        }
        let (status, reply) = server.post("/v1/messages", &body);
        assert_eq!(status, 400, "{reply}");
        assert_eq!(reply["type"], "error", "{reply}");
        assert_eq!(reply["error"]["type"], "invalid_request_error", "{reply}");
        assert!(
            reply["error"]["message"]
                .as_str()
                .unwrap()
                .contains("tool_choice"),
            "{reply}"
        );
    }
}

#[test]
fn log_probabilities_equal_evals_and_bad_ones_are_400s() {
    let server = Server::start(&[], &[]);
    // Completions with echo and max_tokens 0 score the prompt, as evaluation harnesses ask:
    // the values are `eval --json`'s for the same text.
    let text = "The quick brown fox jumps over the lazy dog";
    let (status, reply) = server.post(
        "/v1/completions",
        &json!({"prompt": text, "max_tokens": 0, "echo": true, "logprobs": 2}),
    );
    assert_eq!(status, 200, "{reply}");
    let choice = &reply["choices"][0];
    assert_eq!(choice["text"], text);
    let lp = &choice["logprobs"];
    let out = run_model("eval", &fixture(MODEL), &["--text", text, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let eval: Json = serde_json::from_slice(&out.stdout).unwrap();
    let want = eval["logprobs"].as_array().unwrap();
    let got = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(got.len(), want.len() + 1, "{lp}");
    assert!(got[0].is_null(), "{lp}");
    for (g, w) in got[1..].iter().zip(want) {
        let (g, w) = (g.as_f64().unwrap(), w.as_f64().unwrap());
        assert!((g - w).abs() <= 1e-5, "{g} vs eval's {w}");
    }
    // Each position lists its 2 most likely tokens and the chosen one; the most likely is
    // eval's argmax.
    for (i, top) in lp["top_logprobs"].as_array().unwrap()[1..]
        .iter()
        .enumerate()
    {
        let top = top.as_object().unwrap();
        assert!((2..=3).contains(&top.len()), "{top:?}");
        let token = lp["tokens"][i + 1].as_str().unwrap();
        assert_eq!(top[token], got[i + 1], "{top:?}");
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!(best >= got[i + 1].as_f64().unwrap(), "{top:?}");
    }
    // A chat reply's tokens, each with its log-probability.
    let (status, reply) = server.post(
        "/v1/chat/completions",
        &json!({"messages": user("hi"), "max_tokens": 3, "temperature": 0, "logprobs": true,
                "top_logprobs": 1}),
    );
    assert_eq!(status, 200, "{reply}");
    let content = reply["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert!(!content.is_empty() && content.len() <= 3, "{reply}");
    for t in content {
        // Greedy: the chosen token is the most likely one.
        assert_eq!(t["top_logprobs"][0]["token"], t["token"], "{t}");
        assert_eq!(t["top_logprobs"][0]["logprob"], t["logprob"], "{t}");
    }

    let chat = "/v1/chat/completions";
    let completions = "/v1/completions";
    for (path, body, param) in [
        (
            chat,
            json!({"messages": user("hi"), "logprobs": 1}),
            "logprobs",
        ),
        (
            chat,
            json!({"messages": user("hi"), "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            chat,
            json!({"messages": user("hi"), "logprobs": true, "top_logprobs": -1}),
            "top_logprobs",
        ),
        (
            chat,
            json!({"messages": user("hi"), "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            completions,
            json!({"prompt": "a", "logprobs": true}),
            "logprobs",
        ),
        (
            completions,
            json!({"prompt": "a", "logprobs": 1.5}),
            "logprobs",
        ),
        (
            completions,
            json!({"prompt": "a", "logprobs": 21}),
            "logprobs",
        ),
        (completions, json!({"prompt": "a", "echo": "yes"}), "echo"),
        // Nothing to generate is only a request when the prompt is echoed.
        (
            completions,
            json!({"prompt": "a", "max_tokens": 0, "logprobs": 1}),
            "max_tokens",
        ),
    ] {
        let (status, reply) = server.post(path, &body);
        assert_api_error(status, &reply, 400, Some(param), None);
    }
}

/// Checks `value` against the parts of JSON Schema the structured-output tests use (type,
/// properties, required, additionalProperties false, enum, items, min/maxItems,
/// min/maxLength, minimum/maximum); panics naming the first violation.
fn assert_valid(value: &Json, schema: &Json, at: &str) {
    if let Some(choices) = schema["enum"].as_array() {
        assert!(choices.contains(value), "{at}: {value} not in {choices:?}");
    }
    match schema["type"].as_str() {
        Some("object") => {
            let object = value
                .as_object()
                .unwrap_or_else(|| panic!("{at}: {value} is not an object"));
            for key in schema["required"].as_array().into_iter().flatten() {
                assert!(
                    object.contains_key(key.as_str().unwrap()),
                    "{at}: {key} missing"
                );
            }
            for (key, v) in object {
                match schema["properties"].get(key) {
                    Some(sub) => assert_valid(v, sub, &format!("{at}.{key}")),
                    None => assert!(schema["additionalProperties"] != false, "{at}: extra {key}"),
                }
            }
        }
        Some("array") => {
            let items = value
                .as_array()
                .unwrap_or_else(|| panic!("{at}: {value} is not an array"));
            if let Some(min) = schema["minItems"].as_u64() {
                assert!(items.len() as u64 >= min, "{at}: {} items", items.len());
            }
            if let Some(max) = schema["maxItems"].as_u64() {
                assert!(items.len() as u64 <= max, "{at}: {} items", items.len());
            }
            for (i, item) in items.iter().enumerate() {
                assert_valid(item, &schema["items"], &format!("{at}[{i}]"));
            }
        }
        Some("string") => {
            let s = value
                .as_str()
                .unwrap_or_else(|| panic!("{at}: {value} is not a string"));
            let n = s.chars().count() as u64;
            assert!(
                schema["minLength"].as_u64().is_none_or(|m| n >= m),
                "{at}: {s:?}"
            );
            assert!(
                schema["maxLength"].as_u64().is_none_or(|m| n <= m),
                "{at}: {s:?}"
            );
        }
        Some("integer") => {
            let i = value
                .as_i64()
                .unwrap_or_else(|| panic!("{at}: {value} is not an integer"));
            assert!(
                schema["minimum"].as_i64().is_none_or(|m| i >= m),
                "{at}: {i}"
            );
            assert!(
                schema["maximum"].as_i64().is_none_or(|m| i <= m),
                "{at}: {i}"
            );
        }
        Some("boolean") => assert!(value.is_boolean(), "{at}: {value}"),
        Some(other) => panic!("{at}: the test does not check type {other}"),
        None => {}
    }
}

#[test]
fn structured_output_always_parses_against_the_schema() {
    let server = Server::start(&[], &[]);
    let chat = "/v1/chat/completions";
    let city = json!({"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "zip": {"type": "integer", "minimum": 1000, "maximum": 99999}},
        "required": ["name", "zip"], "additionalProperties": false});
    let schemas = [
        // Nested objects, enums, arrays and required fields.
        json!({"type": "object", "properties": {
            "status": {"enum": ["ok", "failed", "pending"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 100},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3},
            "address": city,
            "active": {"type": "boolean"}},
            "required": ["status", "count", "tags", "address", "active"],
            "additionalProperties": false}),
        json!({"type": "array", "items": city, "minItems": 2, "maxItems": 2}),
        json!({"type": "object", "properties": {"answer": {"enum": ["yes", "no", 3, null]}},
               "required": ["answer"], "additionalProperties": false}),
    ];
    // The tiny model's weights are random: only the constraint makes the replies valid.
    for (i, schema) in schemas.iter().enumerate() {
        for seed in 0..3 {
            let (status, reply) = server.post(chat, &json!({
                "messages": user("Describe a city."), "max_tokens": 400, "temperature": 1,
                "seed": seed,
                "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
            }));
            assert_eq!(status, 200, "{reply}");
            let choice = &reply["choices"][0];
            let text = choice["message"]["content"].as_str().unwrap();
            assert_eq!(
                choice["finish_reason"], "stop",
                "schema {i} seed {seed}: {text:?}"
            );
            let value: Json = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("schema {i} seed {seed}: {e}: {text:?}"));
            assert_valid(&value, schema, &format!("schema {i} seed {seed}"));
        }
    }
    // json_object, and Ollama's `format` (a schema, and "json").
    let (status, reply) = server.post(
        chat,
        &json!({
        "messages": user("hi"), "max_tokens": 400, "temperature": 1, "seed": 5,
        "response_format": {"type": "json_object"}}),
    );
    assert_eq!(status, 200, "{reply}");
    let text = reply["choices"][0]["message"]["content"].as_str().unwrap();
    if reply["choices"][0]["finish_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Json>(text).unwrap().is_object(),
            "{text:?}"
        );
    } else {
        assert!(text.starts_with('{'), "{text:?}");
    }
    let (status, reply) = server.post(
        "/api/chat",
        &json!({
        "model": fixture(MODEL), "messages": user("hi"), "stream": false,
        "format": schemas[2], "options": {"num_predict": 100, "seed": 1}}),
    );
    assert_eq!(status, 200, "{reply}");
    let text = reply["message"]["content"].as_str().unwrap();
    assert_valid(
        &serde_json::from_str(text).unwrap(),
        &schemas[2],
        "ollama format",
    );

    // Bad schemas: 400s in each API's shape, naming the problem.
    let huge_enum: Vec<String> = (0..120_000).map(|i| format!("w{i:07}")).collect();
    for (schema, says) in [
        (json!({"type": "strnig"}), "strnig"),
        (
            json!({"type": "string", "minLength": 5, "maxLength": 2}),
            "Unsatisfiable",
        ),
        (
            json!({"allOf": [{"type": "string"}, {"type": "integer"}]}),
            "Unsatisfiable",
        ),
        (json!({"$ref": "#/definitions/missing"}), "missing"),
        (json!({"enum": huge_enum}), "limits"),
    ] {
        let (status, reply) = server.post(chat, &json!({
            "messages": user("hi"),
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}));
        assert_api_error(status, &reply, 400, Some("response_format"), None);
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
        let (status, reply) = server.post(
            "/api/chat",
            &json!({
            "model": fixture(MODEL), "messages": user("hi"), "stream": false, "format": schema}),
        );
        assert_eq!(status, 400, "{reply}");
        assert!(reply["error"].as_str().unwrap().contains(says), "{reply}");
    }
    for (format, param) in [
        (json!({"type": "xml"}), "response_format.type"),
        (
            json!({"type": "json_schema"}),
            "response_format.json_schema",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"schema": {}}}),
            "response_format.json_schema.name",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "s", "schema": "{}"}}),
            "response_format.json_schema.schema",
        ),
    ] {
        let (status, reply) = server.post(
            chat,
            &json!({"messages": user("hi"), "response_format": format}),
        );
        assert_api_error(status, &reply, 400, Some(param), None);
    }
}
