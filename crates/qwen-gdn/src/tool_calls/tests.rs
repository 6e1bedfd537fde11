//! The parser on written replies in both formats: what each reply parses to; that feeding it in
//! any pieces gives the same events; that every cut-off prefix parses without losing text; and
//! that calls and OpenAI messages go back through the real Qwen templates unchanged.

use super::*;
use crate::text::chat_template::ChatTemplate;
use crate::text::reasoning::ReasoningMode;
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::{json, Map, Value as Json};

fn tools() -> Vec<Json> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "opts": {"type": "object"},
        }}}}),
        json!({"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
            "path": {"type": "string"},
            "content": {"type": "string"},
            "overwrite": {"type": "boolean"},
            "options": {"type": "object"},
        }}}}),
        json!({"type": "function", "function": {"name": "search_web", "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
        }}}}),
    ]
}

const THINKING: ReasoningMode = ReasoningMode::On {
    starts_in_thinking: true,
};
const MAY_THINK: ReasoningMode = ReasoningMode::On {
    starts_in_thinking: false,
};

fn with_tools(reasoning: ReasoningMode) -> ParserOptions {
    ParserOptions {
        reasoning,
        tools: Some(ToolSchemas::from_tools(&tools())),
    }
}

fn without_tools(reasoning: ReasoningMode) -> ParserOptions {
    ParserOptions {
        reasoning,
        tools: None,
    }
}

/// A written reply and what it must parse to: (reasoning, content, [(name, arguments)]).
struct Case {
    name: &'static str,
    options: ParserOptions,
    text: String,
    reasoning: Option<String>,
    /// The exact `content` of the parsed message (None: only calls).
    content: Option<String>,
    calls: Vec<(&'static str, Json)>,
}

fn corpus() -> Vec<Case> {
    let xml_two_calls = "The user wants weather in two cities.\n</think>\n\nLet me check both.\n\n\
        <tool_call>\n<function=get_weather>\n<parameter=city>\n北京\n</parameter>\n\
        <parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n\
        <tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo 🌧\n</parameter>\n\
        <parameter=days>\n1\n</parameter>\n<parameter=opts>\n{\"units\": [\"C\", {\"rain\": null}]}\n</parameter>\n\
        </function>\n</tool_call>";
    let xml_tricky_value = "<tool_call>\n<function=write_file>\n<parameter=path>\nnotes/a<b>.md\n</parameter>\n\
        <parameter=content>\n# Tags\nx < y && y > z\n</parameter> is how a value ends,\n\
        </tool_call> is how a call ends\n<tool_call> opens one\n\n</parameter>\n\
        <parameter=overwrite>\nfalse\n</parameter>\n\
        <parameter=options>\n{\"mode\": 420, \"tags\": [\"a\", {\"b\": [null, 1.5]}]}\n</parameter>\n\
        </function>\n</tool_call>\nDone.";
    let hermes_two_calls = "Need the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \
        \"arguments\": {\"city\": \"Zürich\", \"days\": 2, \"opts\": {\"units\": [\"C\", \"mm\"], \"alerts\": true}}}\n\
        </tool_call>\n<tool_call>\n{\"name\": \"search_web\", \"arguments\": {\"query\": \
        \"a < b </tool_call> \\\"quoted\\\"\\nnewline 🙂\"}}\n</tool_call>";
    let hermes_instruct = "I'll look it up.\n<tool_call>\n{\"name\": \"search_web\", \"arguments\": {\"query\": \"qwen\"}}\n</tool_call>";
    let malformed_then_good = "Before <tool_call>\n{\"name\": oops}\n</tool_call> after\n\
        <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
    let cut_in_call = "Calling.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
    let call_text =
        "<tool_call>\n{\"name\": \"search_web\", \"arguments\": {\"query\": \"q\"}}\n</tool_call>";
    vec![
        Case {
            name: "xml: thinking, content, two calls, unicode, nested object",
            options: with_tools(THINKING),
            text: xml_two_calls.into(),
            reasoning: Some("The user wants weather in two cities.".into()),
            content: Some("Let me check both.".into()),
            calls: vec![
                ("get_weather", json!({"city": "北京", "days": 3})),
                (
                    "get_weather",
                    json!({"city": "São Paulo 🌧", "days": 1, "opts": {"units": ["C", {"rain": null}]}}),
                ),
            ],
        },
        Case {
            name: "xml: a value holding <, newlines, </parameter> and </tool_call>",
            options: with_tools(MAY_THINK),
            text: xml_tricky_value.into(),
            reasoning: None,
            content: Some("Done.".into()),
            calls: vec![(
                "write_file",
                json!({
                    "path": "notes/a<b>.md",
                    "content": "# Tags\nx < y && y > z\n</parameter> is how a value ends,\n</tool_call> is how a call ends\n<tool_call> opens one\n",
                    "overwrite": false,
                    "options": {"mode": 420, "tags": ["a", {"b": [null, 1.5]}]},
                }),
            )],
        },
        Case {
            name: "hermes: thinking, two calls, nested JSON, escapes in a string",
            options: with_tools(THINKING),
            text: hermes_two_calls.into(),
            reasoning: Some("Need the weather.".into()),
            content: None,
            calls: vec![
                (
                    "get_weather",
                    json!({"city": "Zürich", "days": 2, "opts": {"units": ["C", "mm"], "alerts": true}}),
                ),
                (
                    "search_web",
                    json!({"query": "a < b </tool_call> \"quoted\"\nnewline 🙂"}),
                ),
            ],
        },
        Case {
            name: "hermes: an instruct model, content then a call",
            options: with_tools(MAY_THINK),
            text: hermes_instruct.into(),
            reasoning: None,
            content: Some("I'll look it up.".into()),
            calls: vec![("search_web", json!({"query": "qwen"}))],
        },
        Case {
            name: "a malformed call is content, the good one after it is a call",
            options: with_tools(MAY_THINK),
            text: malformed_then_good.into(),
            reasoning: None,
            content: Some("Before <tool_call>\n{\"name\": oops}\n</tool_call> after".into()),
            calls: vec![("get_weather", json!({"city": "Paris"}))],
        },
        Case {
            name: "a call cut off by max_tokens is content",
            options: with_tools(MAY_THINK),
            text: cut_in_call.into(),
            reasoning: None,
            content: Some(cut_in_call.into()),
            calls: vec![],
        },
        Case {
            name: "no tools in the request: a call is content",
            options: without_tools(MAY_THINK),
            text: call_text.into(),
            reasoning: None,
            content: Some(call_text.into()),
            calls: vec![],
        },
        Case {
            name: "tool_choice none: a call is content",
            options: ParserOptions::for_request(
                "<|im_start|>assistant\n",
                &tools(),
                &ToolChoice::None,
            ),
            text: call_text.into(),
            reasoning: None,
            content: Some(call_text.into()),
            calls: vec![],
        },
        Case {
            name: "thinking off: think tags are content",
            options: with_tools(ReasoningMode::Off),
            text: "<think>\nx\n</think>\n\ny".into(),
            reasoning: None,
            content: Some("<think>\nx\n</think>\n\ny".into()),
            calls: vec![],
        },
        Case {
            name: "a call inside the thinking is thinking; cut off in the thinking",
            options: with_tools(THINKING),
            text: format!("Maybe {call_text} then\n</thi"),
            reasoning: Some(format!("Maybe {call_text} then\n</thi")),
            content: Some(String::new()),
            calls: vec![],
        },
        Case {
            name: "plain text with < and a trailing partial tag",
            options: with_tools(MAY_THINK),
            text: "a <b> c\n\n<tool".into(),
            reasoning: None,
            content: Some("a <b> c\n\n<tool".into()),
            calls: vec![],
        },
        Case {
            name: "an empty call and a call that is not one",
            options: with_tools(MAY_THINK),
            text: "<tool_call></tool_call>\n<tool_call>\nhello\n</tool_call>".into(),
            reasoning: None,
            content: Some("<tool_call></tool_call>\n<tool_call>\nhello\n</tool_call>".into()),
            calls: vec![],
        },
    ]
}

/// Parses `text` fed in the pieces that `cuts` (byte offsets) make.
fn feed(options: &ParserOptions, text: &str, cuts: &[usize]) -> Vec<Event> {
    let mut parser = OutputParser::new(options.clone()).with_call_id_base("t");
    let mut events = Vec::new();
    for piece in crate::test_support::pieces(text, cuts) {
        events.extend(parser.push(piece));
    }
    events.extend(parser.finish());
    output_parser::coalesce(events)
}

fn char_bounds(text: &str) -> Vec<usize> {
    (1..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect()
}

#[test]
fn each_written_reply_parses_to_what_it_says() {
    for case in corpus() {
        let got = parse_complete(&case.text, case.options.clone());
        assert_eq!(got.reasoning_content, case.reasoning, "{}", case.name);
        assert_eq!(got.content, case.content, "{}", case.name);
        let calls: Vec<(String, Json)> = got
            .tool_calls
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    serde_json::from_str(&c.arguments_json).unwrap(),
                )
            })
            .collect();
        let want: Vec<(String, Json)> = case
            .calls
            .iter()
            .map(|(n, a)| (n.to_string(), a.clone()))
            .collect();
        assert_eq!(calls, want, "{}", case.name);
        for (i, c) in got.tool_calls.iter().enumerate() {
            assert_eq!(c.index, i, "{}", case.name);
            assert!(c.id.starts_with("call_") && c.id.ends_with(&format!("_{i}")));
        }
        assert_eq!(
            got.finish_reason("stop"),
            if case.calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            }
        );
    }
}

#[test]
fn arguments_keep_the_models_key_order_in_compact_json() {
    let got = parse_complete(&corpus()[1].text, with_tools(MAY_THINK));
    assert!(
        got.tool_calls[0]
            .arguments_json
            .starts_with(r##"{"path":"notes/a<b>.md","content":"# Tags\nx < y"##),
        "{}",
        got.tool_calls[0].arguments_json
    );
}

#[test]
fn every_split_into_two_or_three_pieces_gives_the_same_events() {
    for case in corpus() {
        let whole = feed(&case.options, &case.text, &[]);
        let bounds = char_bounds(&case.text);
        for (n, &i) in bounds.iter().enumerate() {
            assert_eq!(
                feed(&case.options, &case.text, &[i]),
                whole,
                "{}: cut at {i}",
                case.name
            );
            // Every second cut after i (all pairs would take too long on long texts).
            for &j in bounds[n + 1..].iter().step_by(3) {
                assert_eq!(
                    feed(&case.options, &case.text, &[i, j]),
                    whole,
                    "{}: cut at {i}, {j}",
                    case.name
                );
            }
        }
        assert_eq!(
            feed(&case.options, &case.text, &bounds),
            whole,
            "{}: char by char",
            case.name
        );
    }
}

#[test]
fn random_splits_into_many_pieces_give_the_same_events() {
    let mut rng = StdRng::seed_from_u64(16);
    for case in corpus() {
        let whole = feed(&case.options, &case.text, &[]);
        let bounds = char_bounds(&case.text);
        for _ in 0..300 {
            let mut cuts: Vec<usize> = bounds
                .iter()
                .copied()
                .filter(|_| rng.random_bool(0.3))
                .collect();
            cuts.dedup();
            assert_eq!(
                feed(&case.options, &case.text, &cuts),
                whole,
                "{}: cuts {cuts:?}",
                case.name
            );
        }
    }
}

/// The reply text with its markup taken out, as the parser should see it: `<think>` tags
/// removed, each complete call replaced by a marker. Whitespace is not compared (the parser
/// drops the template's layout newlines).
fn expected_stream(case: &Case, prefix_len: usize) -> String {
    let mut rest = &case.text[..prefix_len];
    let mut out = String::new();
    let opens_thinking =
        case.options.reasoning == MAY_THINK && rest.trim_start().starts_with("<think>");
    if case.options.reasoning == THINKING || opens_thinking {
        let body = rest.trim_start().strip_prefix("<think>").unwrap_or(rest);
        let Some(p) = body.find("</think>") else {
            return squeeze(body);
        };
        out.push_str(&body[..p]);
        rest = &body[p + "</think>".len()..];
    }
    out.push('|');
    let mut index = 0;
    while let Some((start, end)) = next_call_span(case, rest) {
        out.push_str(&rest[..start]);
        out.push_str(&format!("#{index}#"));
        rest = &rest[end..];
        index += 1;
    }
    out.push_str(rest);
    squeeze(&out)
}

/// The first `<tool_call>…</tool_call>` block of `rest` that is, on its own, exactly one call.
fn next_call_span(case: &Case, rest: &str) -> Option<(usize, usize)> {
    let options = case.options_without_reasoning();
    for (start, _) in rest.match_indices("<tool_call>") {
        for (close, tag) in rest[start..].match_indices("</tool_call>") {
            let end = start + close + tag.len();
            let p = parse_complete(&rest[start..end], options.clone());
            if p.tool_calls.len() == 1 && p.content.is_none() {
                return Some((start, end));
            }
        }
    }
    None
}

impl Case {
    fn options_without_reasoning(&self) -> ParserOptions {
        ParserOptions {
            reasoning: ReasoningMode::Off,
            tools: self.options.tools.clone(),
        }
    }
}

fn squeeze(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

/// The events in the form of [`expected_stream`]: thinking, `|`, content with call markers.
fn events_stream(events: &[Event], ended_thinking: bool) -> String {
    let mut out = String::new();
    for e in events {
        if let Event::Reasoning(s) = e {
            out.push_str(s);
        }
    }
    if ended_thinking {
        out.push('|');
    }
    for e in events {
        match e {
            Event::Reasoning(_) => {}
            Event::Content(s) => out.push_str(s),
            Event::ToolCall(c) => out.push_str(&format!("#{}#", c.index)),
        }
    }
    squeeze(&out)
}

#[test]
fn every_cut_off_prefix_parses_without_losing_text() {
    for case in corpus() {
        let mut prefixes = char_bounds(&case.text);
        prefixes.push(case.text.len());
        for len in prefixes {
            let events = feed(&case.options, &case.text[..len], &[]);
            let want = expected_stream(&case, len);
            let got = events_stream(&events, want.contains('|'));
            // Reasoning must come before everything else.
            let first_other = events
                .iter()
                .position(|e| !matches!(e, Event::Reasoning(_)));
            let last_reasoning = events
                .iter()
                .rposition(|e| matches!(e, Event::Reasoning(_)));
            if let (Some(o), Some(r)) = (first_other, last_reasoning) {
                assert!(
                    r < o,
                    "{}: reasoning after content in {events:?}",
                    case.name
                );
            }
            assert_eq!(
                got,
                want,
                "{}: prefix of {len} bytes {:?}",
                case.name,
                &case.text[..len]
            );
        }
    }
}

#[test]
fn streaming_emits_all_but_what_may_be_markup() {
    let mut p = OutputParser::new(with_tools(MAY_THINK)).with_call_id_base("t");
    assert_eq!(p.push("Hello"), vec![Event::Content("Hello".into())]);
    assert_eq!(p.push(" wor"), vec![Event::Content(" wor".into())]);
    assert_eq!(p.push("ld <tool_"), vec![Event::Content("ld".into())]);
    assert_eq!(
        p.push("x"),
        vec![Event::Content(" <tool_x".into())],
        "not a tag after all"
    );
    assert_eq!(p.push("\n<tool_call>\n<function=search_web>\n"), vec![]);
    assert_eq!(
        p.push("<parameter=query>\nq\n</parameter>\n</function>\n"),
        vec![]
    );
    assert_eq!(p.tool_call_count(), 0);
    let call = p.push("</tool_call>");
    assert_eq!(
        call,
        vec![Event::ToolCall(ToolCall {
            index: 0,
            id: "call_t_0".into(),
            name: "search_web".into(),
            arguments_json: r#"{"query":"q"}"#.into(),
        })]
    );
    assert_eq!(p.tool_call_count(), 1);
    assert_eq!(p.push("\n"), vec![]);
    assert_eq!(
        p.finish(),
        vec![],
        "whitespace after the last call is layout"
    );
    // Without tools nothing is held at all.
    let mut p = OutputParser::new(ParserOptions::plain());
    assert_eq!(p.push("a <tool_"), vec![Event::Content("a <tool_".into())]);
    assert_eq!(p.push("\n"), vec![Event::Content("\n".into())]);
}

#[test]
fn options_for_a_request() {
    let o = ParserOptions::for_request(
        "x<|im_start|>assistant\n<think>\n",
        &tools(),
        &ToolChoice::Auto,
    );
    assert_eq!(o.reasoning, THINKING);
    assert!(o.tools.as_ref().unwrap().has_tool("write_file"));
    let o = ParserOptions::for_request("<think>\n\n</think>\n\n", &[], &ToolChoice::Required);
    assert_eq!(o.reasoning, ReasoningMode::Off);
    assert!(o.tools.is_none());
    let o = ParserOptions::for_request("", &tools(), &ToolChoice::Function("search_web".into()));
    assert!(o.tools.is_some());
}

#[test]
fn openai_message_of_a_reply() {
    let mut p = OutputParser::new(with_tools(THINKING)).with_call_id_base("t");
    let mut events = p.push(&corpus()[0].text);
    events.extend(p.finish());
    let m = from_events(events).to_openai_message();
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["content"], "Let me check both.");
    assert_eq!(
        m["reasoning_content"],
        "The user wants weather in two cities."
    );
    assert_eq!(m["tool_calls"][1]["id"], "call_t_1");
    assert_eq!(
        m["tool_calls"][0]["function"]["arguments"],
        r#"{"city":"北京","days":3}"#
    );
    let only_calls = parse_complete(&corpus()[2].text, with_tools(THINKING)).to_openai_message();
    assert_eq!(only_calls["content"], Json::Null);
    let plain = parse_complete("Hi", ParserOptions::plain()).to_openai_message();
    assert_eq!(plain, json!({"role": "assistant", "content": "Hi"}));
}

// --- Through the real templates ---------------------------------------------------------------

fn template_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/chat-templates")
}

fn vectors() -> Vec<Json> {
    let doc: Json = serde_json::from_str(
        &std::fs::read_to_string(template_dir().join("vectors.json")).unwrap(),
    )
    .unwrap();
    doc["vectors"].as_array().unwrap().clone()
}

fn template(file: &str) -> ChatTemplate {
    let source = std::fs::read_to_string(template_dir().join(file)).unwrap();
    ChatTemplate::new(file.into(), source).unwrap()
}

fn render(v: &Json, messages: &[Json]) -> anyhow::Result<String> {
    let t = template(v["template"].as_str().unwrap());
    t.render(
        messages,
        Some(&v["tools"]).filter(|t| !t.is_null()),
        v["add_generation_prompt"].as_bool().unwrap(),
        v["kwargs"].as_object().unwrap(),
    )
}

/// A vector's messages as an OpenAI client sends them: arguments as compact JSON strings,
/// string content split into two text parts.
fn as_openai_wire(messages: &[Json]) -> Vec<Json> {
    messages
        .iter()
        .map(|m| {
            let mut m = m.as_object().unwrap().clone();
            if let Some(Json::String(s)) = m.get("content") {
                let mid = (0..=s.len() / 2).rev().find(|&i| s.is_char_boundary(i)).unwrap();
                m.insert(
                    "content".into(),
                    json!([{"type": "text", "text": &s[..mid]}, {"type": "text", "text": &s[mid..]}]),
                );
            }
            if let Some(Json::Array(calls)) = m.get_mut("tool_calls") {
                for c in calls {
                    let f = c.get_mut("function").unwrap_or_else(|| unreachable!());
                    if let Some(args @ Json::Object(_)) = f.get_mut("arguments") {
                        *args = Json::String(serde_json::to_string(args).unwrap());
                    }
                }
            }
            Json::Object(m)
        })
        .collect()
}

fn has_non_text_parts(messages: &[Json]) -> bool {
    messages.iter().any(|m| m["content"].is_array())
}

/// OpenAI-shaped messages, normalized, render exactly as transformers renders the original
/// messages (every text vector of the four real templates).
#[test]
fn normalized_openai_messages_render_like_the_references() {
    let mut checked = 0;
    for v in vectors() {
        let Some(want) = v.get("expected_text").and_then(Json::as_str) else {
            continue;
        };
        let messages = v["messages"].as_array().unwrap();
        if has_non_text_parts(messages)
            || v["id"]
                .as_str()
                .unwrap()
                .ends_with("tools_string_arguments")
        {
            continue;
        }
        let wire = as_openai_wire(messages);
        let normalized = normalize_messages_for_template(&wire).unwrap();
        let got = render(&v, &normalized).unwrap();
        assert_eq!(got, want, "{}", v["id"]);
        checked += 1;
    }
    assert_eq!(checked, 73, "vectors.json changed size");
}

/// The Qwen3.5/3.6 templates fail on arguments given as a string (the reference is a
/// TypeError); normalized, they render as the same call with object arguments.
#[test]
fn string_arguments_render_once_normalized() {
    for v in vectors() {
        let id = v["id"].as_str().unwrap();
        if !id.ends_with("tools_string_arguments") {
            continue;
        }
        let messages = v["messages"].as_array().unwrap();
        let raw = render(&v, messages);
        let normalized = normalize_messages_for_template(messages).unwrap();
        let got = render(&v, &normalized).unwrap();
        assert!(got.contains("Paris"), "{id}");
        if id.starts_with("qwen3.5") || id.starts_with("qwen3.6") {
            assert!(raw.is_err(), "{id}: the raw string arguments should fail");
            assert!(
                got.contains("<function=get_weather>\n<parameter=city>\nParis\n</parameter>"),
                "{id}: {got}"
            );
        } else {
            assert_eq!(got, v["expected_text"].as_str().unwrap(), "{id}");
        }
    }
}

#[test]
fn image_parts_are_refused_clearly() {
    let v = vectors()
        .into_iter()
        .find(|v| v["id"] == "qwen3.5/content_parts_image")
        .unwrap();
    let e = normalize_messages_for_template(v["messages"].as_array().unwrap()).unwrap_err();
    assert!(
        e.message
            .contains("is not supported: this model reads text only"),
        "{e}"
    );
}

/// The assistant turns of the reference renderings are model replies: parsed and sent back as
/// OpenAI messages, the conversation renders byte for byte the same again. This ties the
/// parser to the templates: both formats, thinking, content before calls, typed values.
#[test]
fn parsed_replies_render_back_unchanged() {
    let mut checked = 0;
    for v in vectors() {
        let id = v["id"].as_str().unwrap();
        let Some(want) = v.get("expected_text").and_then(Json::as_str) else {
            continue;
        };
        let messages = v["messages"].as_array().unwrap();
        let Some(tools) = v["tools"].as_array().filter(|t| !t.is_empty()) else {
            continue;
        };
        if !messages.iter().any(|m| m.get("tool_calls").is_some())
            || id.ends_with("tools_string_arguments")
        {
            continue;
        }
        // Each assistant turn with calls, as rendered, is what a model would have written.
        let mut turns: Vec<&str> = want
            .split("<|im_start|>assistant\n")
            .skip(1)
            .map(|t| t.split("<|im_end|>").next().unwrap())
            .collect();
        if v["add_generation_prompt"] == true {
            turns.pop(); // the generation prompt opens a turn that no message fills
        }
        let assistant_at: Vec<usize> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m["role"] == "assistant")
            .map(|(i, _)| i)
            .collect();
        assert_eq!(turns.len(), assistant_at.len(), "{id}");
        let mut rebuilt = messages.to_vec();
        for (turn, &at) in turns.iter().zip(&assistant_at) {
            let parsed = parse_complete(
                turn,
                ParserOptions {
                    reasoning: MAY_THINK,
                    tools: Some(ToolSchemas::from_tools(tools)),
                },
            );
            let original = &messages[at];
            let want_calls = original["tool_calls"].as_array().map_or(0, Vec::len);
            assert_eq!(parsed.tool_calls.len(), want_calls, "{id}: {turn:?}");
            for (call, orig) in parsed
                .tool_calls
                .iter()
                .zip(original["tool_calls"].as_array().into_iter().flatten())
            {
                assert_eq!(call.name, orig["function"]["name"], "{id}");
                let args: Map<String, Json> = serde_json::from_str(&call.arguments_json).unwrap();
                for (k, want) in orig["function"]["arguments"].as_object().unwrap() {
                    let typed = tool_param_is_declared(tools, &call.name, k);
                    if typed {
                        assert_eq!(&args[k], want, "{id}: {k}");
                    }
                }
            }
            let mut message = parsed.to_openai_message();
            // What the client sends back: its own content (templates render null as '').
            if message["content"].is_null() {
                message["content"] = original["content"].clone();
            }
            rebuilt[at] = message;
        }
        let normalized = normalize_messages_for_template(&rebuilt).unwrap();
        assert_eq!(render(&v, &normalized).unwrap(), want, "{id}");
        checked += 1;
    }
    assert_eq!(
        checked, 8,
        "tools_full_cycle and tools_multi_step of 4 templates"
    );
}

fn tool_param_is_declared(tools: &[Json], tool: &str, param: &str) -> bool {
    tools.iter().any(|t| {
        t["function"]["name"] == tool
            && t["function"]["parameters"]["properties"]
                .get(param)
                .is_some()
    })
}
