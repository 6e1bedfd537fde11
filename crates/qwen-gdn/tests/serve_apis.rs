//! `qwen-gdn serve`'s Anthropic Messages and Ollama APIs, /metrics and the JSON request log,
//! end to end: the built binary on a free port with a tiny checkpoint, driven over HTTP.

mod common;

use common::serve_server::Server;
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;

/// A conversation with a system prompt and an earlier exchange, in OpenAI's shape.
fn conversation() -> Vec<Json> {
    vec![
        json!({"role": "system", "content": "You are a terse assistant."}),
        json!({"role": "user", "content": "Hello there"}),
        json!({"role": "assistant", "content": "Hi. What do you need?"}),
        json!({"role": "user", "content": "Tell me about the sea"}),
    ]
}

/// `(event, data)` of a server-sent event stream.
fn sse_events(text: &str) -> Vec<(String, Json)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = Json::Null;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap_or_else(|_| panic!("{d}"));
                }
            }
            (name, data)
        })
        .collect()
}

fn ndjson(text: &str) -> Vec<Json> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect()
}

fn post(
    server: &Server,
    path: &str,
    body: &Json,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    server.request(path, Some(&body.to_string()), headers)
}

fn json_of(text: &str) -> Json {
    serde_json::from_str(text).unwrap_or_else(|_| panic!("not JSON: {text}"))
}

/// The text of an Anthropic message's text blocks.
fn anthropic_text(message: &Json) -> String {
    message["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap())
        .collect()
}

/// The Anthropic messages of [`conversation`].
fn anthropic_conversation() -> (Json, Json) {
    let c = conversation();
    let system = c[0]["content"].clone();
    let messages: Vec<Json> = c[1..].to_vec();
    (system, Json::Array(messages))
}

#[test]
fn the_same_greedy_text_through_every_api() {
    let server = Server::start(&[], &[]);
    let n = 12;
    let (status, openai) = server.post(
        "/v1/chat/completions",
        &json!({"messages": conversation(), "max_tokens": n, "temperature": 0,
                "chat_template_kwargs": {"enable_thinking": false}}),
    );
    assert_eq!(status, 200, "{openai}");
    let text = openai["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let generated = &openai["usage"]["completion_tokens"];
    assert!(!text.is_empty(), "{openai}");

    // Anthropic, plain: thinking is off unless enabled, as in Anthropic's API.
    let (system, messages) = anthropic_conversation();
    let model = common::fixture(common::serve_server::MODEL);
    let model = model.to_str().unwrap();
    let request = json!({"model": model, "system": system, "messages": messages,
                         "max_tokens": n, "temperature": 0});
    let (status, body, _) = post(&server, "/v1/messages", &request, &[]);
    assert_eq!(status, 200, "{body}");
    let message = json_of(&body);
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(anthropic_text(&message), text, "{message}");
    assert_eq!(&message["usage"]["output_tokens"], generated, "{message}");
    let prompt = openai["usage"]["prompt_tokens"].as_u64().unwrap();
    let usage = &message["usage"];
    assert_eq!(
        usage["input_tokens"].as_u64().unwrap()
            + usage["cache_read_input_tokens"].as_u64().unwrap(),
        prompt,
        "{usage}"
    );
    // The same prompt again: now all but its last token come from the prompt cache.
    assert!(
        usage["cache_read_input_tokens"].as_u64().unwrap() > 0,
        "{usage}"
    );
    let want_stop = if generated.as_u64() == Some(n) {
        "max_tokens"
    } else {
        "end_turn"
    };
    assert_eq!(message["stop_reason"], want_stop, "{message}");

    // Anthropic, streamed.
    let mut streamed = request.clone();
    streamed["stream"] = true.into();
    let (status, body, content_type) = post(&server, "/v1/messages", &streamed, &[]);
    assert_eq!(status, 200, "{body}");
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let events = sse_events(&body);
    let text_deltas: String = events
        .iter()
        .filter(|(_, d)| d["type"] == "content_block_delta" && d["delta"]["type"] == "text_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text_deltas, text);

    // Ollama, plain and streamed (its default).
    let request = json!({"model": model, "messages": conversation(), "think": false,
                         "stream": false, "options": {"temperature": 0, "num_predict": n}});
    let (status, body, _) = post(&server, "/api/chat", &request, &[]);
    assert_eq!(status, 200, "{body}");
    let reply = json_of(&body);
    assert_eq!(reply["message"]["content"], text.as_str(), "{reply}");
    assert_eq!(&reply["eval_count"], generated, "{reply}");
    assert_eq!(reply["done"], true);
    let mut streamed = request.clone();
    streamed.as_object_mut().unwrap().remove("stream");
    let (status, body, content_type) = post(&server, "/api/chat", &streamed, &[]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(content_type, "application/x-ndjson");
    let lines = ndjson(&body);
    let joined: String = lines
        .iter()
        .map(|l| l["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(joined, text);
    assert!(lines.len() >= 2, "{body}");
    assert!(
        lines[..lines.len() - 1].iter().all(|l| l["done"] == false),
        "{body}"
    );
    let last = lines.last().unwrap();
    assert_eq!(last["done"], true);
    assert_eq!(
        last["done_reason"],
        if generated.as_u64() == Some(n) {
            "length"
        } else {
            "stop"
        }
    );
    assert_eq!(&last["eval_count"], generated);
    assert_eq!(last["prompt_eval_count"].as_u64(), Some(prompt));
}

#[test]
fn anthropic_streams_events_in_order_with_thinking_and_stop_sequences() {
    let server = Server::start(&[], &[]);
    let hi = json!([{"role": "user", "content": "Write a story"}]);
    // Thinking on: the tiny model's greedy reply starts in the thinking block.
    let request = json!({"model": common::fixture(common::serve_server::MODEL), "messages": hi,
                         "max_tokens": 10, "temperature": 0, "stream": true,
                         "thinking": {"type": "enabled", "budget_tokens": 1024}});
    let (status, body, _) = post(&server, "/v1/messages", &request, &[]);
    assert_eq!(status, 200, "{body}");
    let events = sse_events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "{body}");
    }
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(
        names[names.len() - 2..],
        ["message_delta", "message_stop"],
        "{names:?}"
    );
    assert_eq!(events[0].1["message"]["content"], json!([]));
    // Blocks: start, deltas, stop, with indices counting up from 0.
    let mut open: Option<u64> = None;
    let mut next = 0;
    for (name, data) in &events[2..events.len() - 2] {
        match name.as_str() {
            "content_block_start" => {
                assert!(open.is_none(), "{body}");
                assert_eq!(data["index"], next, "{body}");
                open = Some(next);
                next += 1;
            }
            "content_block_delta" => assert_eq!(data["index"].as_u64(), open, "{body}"),
            "content_block_stop" => {
                assert_eq!(data["index"].as_u64(), open, "{body}");
                open = None;
            }
            other => panic!("unexpected event {other}: {body}"),
        }
    }
    assert!(open.is_none() && next >= 1, "{body}");
    let first_block = events
        .iter()
        .find(|(n, _)| n == "content_block_start")
        .map(|(_, d)| d["content_block"]["type"].clone());
    assert_eq!(first_block, Some(json!("thinking")), "{body}");
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens", "{delta}");
    assert_eq!(delta["usage"]["output_tokens"], 10, "{delta}");

    // Thinking off: the greedy text, then a stop sequence cut from its middle (two characters
    // that are not whitespace, which the reply's layout could move).
    let plain_request = json!({"model": request["model"], "messages": hi, "max_tokens": 16,
                               "temperature": 0});
    let (status, body, _) = post(&server, "/v1/messages", &plain_request, &[]);
    assert_eq!(status, 200, "{body}");
    let text = anthropic_text(&json_of(&body));
    let chars: Vec<char> = text.chars().collect();
    let at = (chars.len() / 2..chars.len().saturating_sub(1))
        .find(|&i| !chars[i].is_whitespace() && !chars[i + 1].is_whitespace())
        .unwrap_or_else(|| panic!("no two visible characters in {text:?}"));
    let stop: String = chars[at..at + 2].iter().collect();
    let before = &text[..text.find(&stop).unwrap()];
    let mut stopped = plain_request.clone();
    stopped["stop_sequences"] = json!([stop]);
    let (status, body, _) = post(&server, "/v1/messages", &stopped, &[]);
    assert_eq!(status, 200, "{body}");
    let message = json_of(&body);
    assert_eq!(message["stop_reason"], "stop_sequence", "{message}");
    assert_eq!(message["stop_sequence"], stop.as_str(), "{message}");
    assert_eq!(anthropic_text(&message), before, "{message}");
}

#[test]
fn tool_calls_round_trip_through_anthropic_and_ollama() {
    let forced = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    let server = Server::start(&[], &[("QWEN_GDN_TEST_FORCE_OUTPUT", forced)]);
    let model = common::fixture(common::serve_server::MODEL);
    let model = model.to_str().unwrap();
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]});
    let tools =
        json!([{"name": "get_weather", "description": "The weather", "input_schema": schema}]);
    let ask = json!([{"role": "user", "content": "Weather in Paris for 3 days?"}]);
    let request = json!({"model": model, "messages": ask, "tools": tools, "max_tokens": 64});
    let (status, body, _) = post(&server, "/v1/messages", &request, &[]);
    assert_eq!(status, 200, "{body}");
    let message = json_of(&body);
    assert_eq!(message["stop_reason"], "tool_use", "{message}");
    let call = message["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{message}"))
        .clone();
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["input"], json!({"city": "Paris", "days": 3}));
    // Streamed: the block opens with the call's name and its input comes as one JSON delta.
    let mut streamed = request.clone();
    streamed["stream"] = true.into();
    let (_, body, _) = post(&server, "/v1/messages", &streamed, &[]);
    let events = sse_events(&body);
    let start = events
        .iter()
        .find(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{body}"));
    assert_eq!(start.1["content_block"]["name"], "get_weather");
    let input: String = events
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert_eq!(json_of(&input), json!({"city": "Paris", "days": 3}));
    // The call and its result go back: the template renders them (the reply is forced again).
    let round = json!({"model": model, "tools": tools, "max_tokens": 64, "messages": [
        ask[0],
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "sunny, 21 C"}]}
    ]});
    let (status, body, _) = post(&server, "/v1/messages", &round, &[]);
    assert_eq!(status, 200, "{body}");

    // Ollama: tools in OpenAI's shape, the call with an arguments object.
    let tools =
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": schema}}]);
    let request = json!({"model": model, "messages": ask, "tools": tools, "stream": false,
                         "think": false});
    let (status, body, _) = post(&server, "/api/chat", &request, &[]);
    assert_eq!(status, 200, "{body}");
    let reply = json_of(&body);
    let call = &reply["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{reply}");
    assert_eq!(
        call["arguments"],
        json!({"city": "Paris", "days": 3}),
        "{reply}"
    );
    let round = json!({"model": model, "tools": tools, "stream": false, "think": false, "messages": [
        ask[0],
        {"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
        {"role": "tool", "tool_name": "get_weather", "content": "sunny, 21 C"}
    ]});
    let (status, body, _) = post(&server, "/api/chat", &round, &[]);
    assert_eq!(status, 200, "{body}");
}

#[test]
fn ollama_endpoints() {
    let server = Server::start(&["--served-model-name", "tiny"], &[]);
    let (status, body, _) = server.request("/api/tags", None, &[]);
    assert_eq!(status, 200, "{body}");
    let tags = json_of(&body);
    let entry = &tags["models"][0];
    assert_eq!(entry["name"], "tiny");
    assert_eq!(entry["details"]["family"], "qwen3_5");
    assert_eq!(entry["details"]["quantization_level"], "4-bit");
    assert!(entry["size"].as_u64().unwrap() > 100_000, "{entry}");
    assert!(
        entry["modified_at"].as_str().unwrap().ends_with('Z'),
        "{entry}"
    );
    let (status, body, _) = server.request("/api/version", None, &[]);
    assert_eq!(status, 200);
    assert!(json_of(&body)["version"].is_string());
    let (status, body, _) = post(&server, "/api/show", &json!({"model": "tiny:latest"}), &[]);
    assert_eq!(status, 200, "{body}");
    let show = json_of(&body);
    assert_eq!(
        show["capabilities"],
        json!(["completion", "tools", "thinking"]),
        "{show}"
    );
    assert!(
        show["template"].as_str().unwrap().contains("<|im_start|>"),
        "{show}"
    );
    assert_eq!(show["model_info"]["qwen3_5.context_length"], 4096, "{show}");
    assert!(
        show["parameters"]
            .as_str()
            .unwrap()
            .contains("temperature 0.7"),
        "{show}"
    );

    // Generate through the template, streamed by default; num_predict caps it.
    let request = json!({"model": "tiny", "prompt": "Why is the sky blue?", "think": false,
                         "options": {"temperature": 0, "num_predict": 5}, "keep_alive": "5m"});
    let (status, body, _) = post(&server, "/api/generate", &request, &[]);
    assert_eq!(status, 200, "{body}");
    let lines = ndjson(&body);
    let last = lines.last().unwrap();
    assert_eq!(last["done"], true, "{body}");
    assert_eq!(last["done_reason"], "length", "{body}");
    assert_eq!(last["eval_count"], 5, "{body}");
    assert!(last["total_duration"].as_u64().unwrap() > 0, "{body}");
    let text: String = lines
        .iter()
        .map(|l| l["response"].as_str().unwrap())
        .collect();
    // The same through /api/chat, and raw text through /v1/completions and raw generate.
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "Why is the sky blue?"}],
                      "think": false, "stream": false, "options": {"temperature": 0, "num_predict": 5}});
    let (_, body, _) = post(&server, "/api/chat", &chat, &[]);
    assert_eq!(
        json_of(&body)["message"]["content"],
        text.as_str(),
        "{body}"
    );
    let (_, completion) = server.post(
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}),
    );
    let raw = json!({"model": "tiny", "prompt": "Once upon a time", "raw": true, "stream": false,
                     "options": {"temperature": 0, "num_predict": 5}});
    let (status, body, _) = post(&server, "/api/generate", &raw, &[]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        json_of(&body)["response"],
        completion["choices"][0]["text"],
        "{body}"
    );
    // Nothing to generate: the model "loads".
    let (status, body, _) = post(&server, "/api/generate", &json!({"model": "tiny"}), &[]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["done_reason"], "load");
    let (_, body, _) = post(
        &server,
        "/api/chat",
        &json!({"model": "tiny", "messages": []}),
        &[],
    );
    assert_eq!(json_of(&body)["done_reason"], "load");
}

/// (status, body) of a POST of `size` bytes, which the server refuses from its Content-Length
/// and then closes (so the body is written raw: what it takes, then the answer read).
fn refused_from_its_length(
    server: &Server,
    path: &str,
    size: usize,
    header: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut socket = std::net::TcpStream::connect(server.addr()).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\n{header}\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    );
    let _ = socket
        .write_all(head.as_bytes())
        .and_then(|_| socket.write_all("x".repeat(size).as_bytes()));
    let mut reply = String::new();
    let _ = socket.read_to_string(&mut reply);
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (
        status,
        reply
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_string(),
    )
}

/// Ollama's error shape: `{"error": "..."}` and nothing else.
fn assert_ollama_error(status: u16, body: &str, want: u16, says: &str) {
    assert_eq!(status, want, "{body}");
    let e = json_of(body);
    let message = e["error"].as_str().unwrap_or_else(|| panic!("{body}"));
    assert!(message.contains(says), "{body}");
    assert_eq!(e.as_object().unwrap().len(), 1, "{body}");
}

/// Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}`.
fn assert_anthropic_error(status: u16, body: &str, want: u16, kind: &str) {
    assert_eq!(status, want, "{body}");
    let e = json_of(body);
    assert_eq!(e["type"], "error", "{body}");
    assert_eq!(e["error"]["type"], kind, "{body}");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[test]
fn malformed_requests_get_each_apis_error_shape() {
    let server = Server::start(
        &["--api-key", "sekrit", "--max-request-bytes", "100000"],
        &[("QWEN_GDN_TEST_PANIC", "PANIC-HERE")],
    );
    let key = [("x-api-key", "sekrit")];
    let bearer = [("Authorization", "Bearer sekrit")];
    let hi = json!([{"role": "user", "content": "hi"}]);
    let model = common::fixture(common::serve_server::MODEL);
    let model = model.to_str().unwrap();
    let anthropic =
        |body: &str, headers: &[(&str, &str)]| server.request("/v1/messages", Some(body), headers);
    // The key: x-api-key or a bearer token; neither, or a wrong one, is a 401.
    let ok = json!({"model": model, "messages": hi, "max_tokens": 2}).to_string();
    let (s, b, _) = anthropic(&ok, &key);
    assert_eq!(s, 200, "{b}");
    let (s, b, _) = anthropic(&ok, &bearer);
    assert_eq!(s, 200, "{b}");
    let (s, b, _) = anthropic(&ok, &[]);
    assert_anthropic_error(s, &b, 401, "authentication_error");
    let (s, b, _) = anthropic(&ok, &[("x-api-key", "nope")]);
    assert_anthropic_error(s, &b, 401, "authentication_error");
    let (s, b, _) = server.request("/api/tags", None, &[]);
    assert_ollama_error(s, &b, 401, "API key");
    let (s, b, _) = server.request("/metrics", None, &[]);
    assert_eq!(s, 401, "{b}");
    let (s, _, _) = server.request("/health", None, &[]);
    assert_eq!(s, 200);

    let cases: [(&str, u16, &str); 9] = [
        ("{", 400, "invalid_request_error"),
        ("[1]", 400, "invalid_request_error"),
        (
            r#"{"model": "m", "max_tokens": 5}"#,
            400,
            "invalid_request_error",
        ),
        (
            &format!(
                r#"{{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}]}}"#
            ),
            400,
            "invalid_request_error",
        ),
        (
            &format!(
                r#"{{"model": "{model}", "max_tokens": "many", "messages": [{{"role": "user", "content": "hi"}}]}}"#
            ),
            400,
            "invalid_request_error",
        ),
        (
            &format!(
                r#"{{"model": "{model}", "max_tokens": 5, "surprise": 1, "messages": [{{"role": "user", "content": "hi"}}]}}"#
            ),
            400,
            "invalid_request_error",
        ),
        (
            &format!(
                r#"{{"model": "{model}", "max_tokens": 5, "messages": [{{"role": "user", "content": [{{"type": "image", "source": {{}}}}]}}]}}"#
            ),
            400,
            "invalid_request_error",
        ),
        (
            r#"{"model": "claude-opus", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}"#,
            404,
            "not_found_error",
        ),
        (
            &format!(
                r#"{{"model": "{model}", "max_tokens": 5, "messages": [{{"role": "user", "content": "{}"}}]}}"#,
                "sea ".repeat(6000)
            ),
            400,
            "invalid_request_error",
        ),
    ];
    for (body, status, kind) in cases {
        let (s, b, _) = anthropic(body, &key);
        assert_anthropic_error(s, &b, status, kind);
    }
    let (s, b) = refused_from_its_length(&server, "/v1/messages", 200_000, "x-api-key: sekrit");
    assert_anthropic_error(s, &b, 413, "request_too_large");
    let (s, b) = refused_from_its_length(
        &server,
        "/api/chat",
        200_000,
        "Authorization: Bearer sekrit",
    );
    assert_ollama_error(s, &b, 413, "--max-request-bytes");
    let (s, b, _) = server.request("/v1/messages", None, &key);
    assert_anthropic_error(s, &b, 405, "invalid_request_error");
    let (s, b, _) = server.request("/v1/messages/batches", None, &key);
    assert_anthropic_error(s, &b, 404, "not_found_error");
    // A panic on the worker is a 500 in the API's shape, and the server goes on.
    let panics = json!({"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "PANIC-HERE"}]});
    let (s, b, _) = anthropic(&panics.to_string(), &key);
    assert_anthropic_error(s, &b, 500, "api_error");

    let ollama = |path: &str, body: &str| server.request(path, Some(body), &bearer);
    for (path, body, status, says) in [
        ("/api/chat", "{".to_string(), 400, "not valid JSON"),
        ("/api/chat", json!({"messages": hi}).to_string(), 400, "model"),
        ("/api/chat", json!({"model": model, "messages": "hi"}).to_string(), 400, "messages"),
        ("/api/chat", json!({"model": model, "messages": hi, "options": {"temprature": 0}}).to_string(), 400, "temprature"),
        ("/api/chat", json!({"model": model, "messages": hi, "options": {"top_k": "ten"}}).to_string(), 400, "options.top_k"),
        ("/api/chat", json!({"model": model, "messages": hi, "format": 5}).to_string(), 400, "format"),
        ("/api/chat", json!({"model": "llama3", "messages": hi}).to_string(), 404, "model 'llama3' not found"),
        ("/api/generate", json!({"model": model, "prompt": "a", "template": "x"}).to_string(), 400, "template"),
        ("/api/show", json!({"model": "llama3"}).to_string(), 404, "not found"),
        ("/api/show", json!({}).to_string(), 400, "model"),
        ("/api/chat", json!({"model": model, "stream": false, "messages": [{"role": "user", "content": "PANIC-HERE"}]}).to_string(), 500, "panic"),
    ] {
        let (s, b, _) = ollama(path, &body);
        assert_ollama_error(s, &b, status, says);
    }
    let (s, b, _) = server.request("/api/embed", Some("{}"), &bearer);
    assert_ollama_error(s, &b, 404, "no route");
    let (s, b, _) = server.request("/api/chat", None, &bearer);
    assert_ollama_error(s, &b, 405, "GET");
    // Still serving.
    let (s, b, _) = ollama(
        "/api/chat",
        &json!({"model": model, "messages": hi, "stream": false, "options": {"num_predict": 2}})
            .to_string(),
    );
    assert_eq!(s, 200, "{b}");
}

/// The value of each sample line of the metrics text, by its name and labels.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn metrics_and_the_json_request_log() {
    let server = Server::start(&["--log-format", "json"], &[]);
    let model = common::fixture(common::serve_server::MODEL);
    let system = "You are a helpful assistant who answers in French. ".repeat(8);
    let mut tokens = 0;
    let mut usages = vec![];
    for question in ["What is the sea?", "What is the sky?"] {
        let (s, body) = server.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                    "max_tokens": 3, "temperature": 0}),
        );
        assert_eq!(s, 200, "{body}");
        tokens += body["usage"]["completion_tokens"].as_u64().unwrap();
        usages.push(body["usage"].clone());
    }
    let (s, body, _) = post(
        &server,
        "/v1/messages",
        &json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
        &[],
    );
    assert_eq!(s, 200, "{body}");
    tokens += json_of(&body)["usage"]["output_tokens"].as_u64().unwrap();
    let (s, _, _) = post(
        &server,
        "/api/chat",
        &json!({"model": "nope", "messages": []}),
        &[],
    );
    assert_eq!(s, 404);

    let (s, text, content_type) = server.request("/metrics", None, &[]);
    assert_eq!(s, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    let m = samples(&text);
    let get = |name: &str| {
        *m.get(name)
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    assert_eq!(
        get(
            r#"qwen_gdn_http_requests_total{api="openai",route="/v1/chat/completions",status="200"}"#
        ),
        2.0
    );
    assert_eq!(
        get(r#"qwen_gdn_http_requests_total{api="anthropic",route="/v1/messages",status="200"}"#),
        1.0
    );
    assert_eq!(
        get(r#"qwen_gdn_http_requests_total{api="ollama",route="/api/chat",status="404"}"#),
        1.0
    );
    let ended = |finish: &str| {
        m.get(&format!(
            "qwen_gdn_generations_total{{finish=\"{finish}\"}}"
        ))
        .copied()
        .unwrap_or(0.0)
    };
    assert_eq!(ended("stop") + ended("length"), 3.0, "{text}");
    assert_eq!(get("qwen_gdn_generation_tokens_total"), tokens as f64);
    assert!(get("qwen_gdn_prompt_cache_hits_total") >= 1.0, "{text}");
    assert!(get("qwen_gdn_prompt_cache_tokens_total") > 0.0, "{text}");
    assert!(get("qwen_gdn_prompt_cache_bytes") > 0.0, "{text}");
    assert!(get("qwen_gdn_prompt_cache_entries") >= 1.0, "{text}");
    assert_eq!(get("qwen_gdn_queue_depth"), 0.0);
    assert_eq!(get("qwen_gdn_requests_running"), 0.0);
    assert_eq!(get("qwen_gdn_time_to_first_token_seconds_count"), 3.0);
    assert!(get("qwen_gdn_time_to_first_token_seconds_sum") > 0.0);
    assert!(
        get("qwen_gdn_generation_tokens_per_second_count") >= 1.0,
        "{text}"
    );

    // One JSON line per request, written once its response is over.
    let start = std::time::Instant::now();
    let lines = loop {
        let lines: Vec<Json> = server
            .log()
            .iter()
            .filter(|l| l.starts_with('{'))
            .map(|l| json_of(l))
            .collect();
        if lines.len() >= 4 || start.elapsed().as_secs() > 60 {
            break lines;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(
        !server.log().iter().any(|l| l.starts_with("request: ")),
        "the text line is off with --log-format json: {:?}",
        server.log()
    );
    let chats: Vec<&Json> = lines
        .iter()
        .filter(|l| l["path"] == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), 2, "{lines:?}");
    for (l, usage) in chats.iter().zip(&usages) {
        assert_eq!(l["method"], "POST");
        assert_eq!(l["status"], 200);
        assert_eq!(l["api"], "openai");
        assert_eq!(l["completion_tokens"], usage["completion_tokens"], "{l}");
        assert_eq!(l["prompt_tokens"], usage["prompt_tokens"], "{l}");
        assert_eq!(
            l["cached_tokens"], usage["prompt_tokens_details"]["cached_tokens"],
            "{l}"
        );
        assert!(l["time_to_first_token_ms"].as_f64().unwrap() > 0.0, "{l}");
        assert!(l["time"].as_str().unwrap().ends_with('Z'), "{l}");
    }
    assert!(
        chats[1]["cached_tokens"].as_u64().unwrap() > 0,
        "{:?}",
        chats[1]
    );
    let missing = lines
        .iter()
        .find(|l| l["path"] == "/api/chat")
        .expect("the 404 is logged");
    assert_eq!(missing["status"], 404);
    assert!(
        missing["error"].as_str().unwrap().contains("not found"),
        "{missing}"
    );
}
