//! The body of Anthropic's `POST /v1/messages`, checked as Anthropic checks it (unknown fields
//! and block types are 400s) and translated into the OpenAI chat request that every API is
//! validated as:
//! - `system` becomes a system message; text blocks are joined with newlines;
//! - an assistant turn's `text`, `thinking` and `tool_use` blocks become its content,
//!   `reasoning_content` and `tool_calls`;
//! - a user turn's `tool_result` blocks become `tool` messages (before the turn's text, as
//!   they answer the calls just made);
//! - `tools` (`input_schema`) become functions, `tool_choice` auto/any/tool/none becomes
//!   auto/required/the function/none, `thinking` becomes the template's `enable_thinking`
//!   (off unless enabled, adaptive or between tools), `stop_sequences` the stop strings;
//!   `temperature`, `top_p` and `top_k` (gone from Anthropic's current API, still sent by
//!   older clients) set the sampling.
//!
//! The fields of anthropic-sdk-python 2.14's `messages.create` that concern Anthropic's
//! service (metadata, service tier, workspace, ...) are accepted and ignored; any other field
//! is refused, as Anthropic refuses it.

use crate::serve::error::ApiError;
use crate::serve::openai::request::{
    json_object, typed, ChatRequest, Common, Limits, OneOrMany, Validated,
};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Map, Value as Json};

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    pub model: String,
    pub max_tokens: u64,
    pub messages: Vec<InputMessage>,
    /// A string or a list of text blocks.
    pub system: Option<Json>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    /// Read one by one: a server tool (`web_search_…`) has other fields than a custom one.
    pub tools: Option<Vec<Json>>,
    pub tool_choice: Option<ToolChoiceParam>,
    pub thinking: Option<Thinking>,
    /// Asks for structured output (`format`), which is not supported yet, or an effort level,
    /// which is accepted (the model decides how long it thinks).
    pub output_config: Option<OutputConfig>,
    // About Anthropic's service rather than the model (the fields of anthropic-sdk-python
    // 2.14's `messages.create`): accepted, ignored. `cache_control` asks for prompt caching,
    // which the prompt cache does for every request anyway.
    #[serde(rename = "cache_control")]
    _cache_control: Option<IgnoredAny>,
    #[serde(rename = "container")]
    _container: Option<IgnoredAny>,
    #[serde(rename = "diagnostics")]
    _diagnostics: Option<IgnoredAny>,
    #[serde(rename = "inference_geo")]
    _inference_geo: Option<IgnoredAny>,
    #[serde(rename = "metadata")]
    _metadata: Option<IgnoredAny>,
    #[serde(rename = "service_tier")]
    _service_tier: Option<IgnoredAny>,
    #[serde(rename = "speed")]
    _speed: Option<IgnoredAny>,
    #[serde(rename = "user_profile_id")]
    _user_profile_id: Option<IgnoredAny>,
    #[serde(rename = "workspace_id")]
    _workspace_id: Option<IgnoredAny>,
    /// Asks to clear old tool results from long contexts; the context is kept whole instead.
    #[serde(rename = "context_management")]
    _context_management: Option<IgnoredAny>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    #[serde(rename = "effort")]
    _effort: Option<IgnoredAny>,
    pub format: Option<Json>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    pub role: Role,
    /// A string or a list of content blocks (read by [`blocks`], which names the block at
    /// fault).
    pub content: Json,
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

#[derive(Deserialize, Debug)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Block {
    Text {
        text: String,
        #[serde(rename = "cache_control")]
        _cache_control: Option<IgnoredAny>,
        #[serde(rename = "citations")]
        _citations: Option<IgnoredAny>,
    },
    ToolUse {
        id: String,
        name: String,
        input: Map<String, Json>,
        #[serde(rename = "cache_control")]
        _cache_control: Option<IgnoredAny>,
        #[serde(rename = "caller")]
        _caller: Option<IgnoredAny>,
        #[serde(rename = "toolset_name")]
        _toolset_name: Option<IgnoredAny>,
    },
    ToolResult {
        tool_use_id: String,
        /// A string or a list of text blocks.
        content: Option<Json>,
        is_error: Option<bool>,
        #[serde(rename = "cache_control")]
        _cache_control: Option<IgnoredAny>,
        #[serde(rename = "toolset_name")]
        _toolset_name: Option<IgnoredAny>,
    },
    Thinking {
        thinking: String,
        #[serde(rename = "signature")]
        _signature: Option<String>,
    },
    RedactedThinking {
        #[serde(rename = "data")]
        _data: String,
    },
}

#[derive(Deserialize, Debug)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolChoiceParam {
    /// `disable_parallel_tool_use` is accepted: the Qwen templates leave the number of calls
    /// to the model.
    Auto {
        #[serde(rename = "disable_parallel_tool_use")]
        _disable_parallel_tool_use: Option<bool>,
    },
    Any {
        #[serde(rename = "disable_parallel_tool_use")]
        _disable_parallel_tool_use: Option<bool>,
    },
    Tool {
        name: String,
        #[serde(rename = "disable_parallel_tool_use")]
        _disable_parallel_tool_use: Option<bool>,
    },
    None {},
}

#[derive(Deserialize, Debug)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Thinking {
    /// The budget is accepted, not enforced: the model ends its thinking itself. The thinking
    /// is always shown in full (`display`).
    Enabled {
        #[serde(rename = "budget_tokens")]
        _budget_tokens: u64,
        #[serde(rename = "display")]
        _display: Option<IgnoredAny>,
    },
    Disabled {},
    Adaptive {
        #[serde(rename = "display")]
        _display: Option<IgnoredAny>,
    },
    BetweenTools {},
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct CustomTool {
    name: String,
    description: Option<String>,
    input_schema: Json,
    #[serde(rename = "type")]
    _type: Option<String>,
    #[serde(rename = "cache_control")]
    _cache_control: Option<IgnoredAny>,
    #[serde(rename = "strict")]
    _strict: Option<bool>,
    #[serde(rename = "allowed_callers")]
    _allowed_callers: Option<IgnoredAny>,
    #[serde(rename = "defer_loading")]
    _defer_loading: Option<IgnoredAny>,
    #[serde(rename = "eager_input_streaming")]
    _eager_input_streaming: Option<IgnoredAny>,
    #[serde(rename = "input_examples")]
    _input_examples: Option<IgnoredAny>,
}

/// Block types of Anthropic's API that carry what a text model cannot read.
const UNREADABLE_BLOCKS: [&str; 5] = [
    "image",
    "document",
    "search_result",
    "server_tool_use",
    "web_search_tool_result",
];

pub fn parse(body: &[u8]) -> Result<MessagesRequest, ApiError> {
    typed(&json_object(body)?)
}

/// `typed`, the path of the field at fault put after `at`.
fn typed_at<T: for<'de> Deserialize<'de>>(value: &Json, at: &str) -> Result<T, ApiError> {
    typed(value).map_err(|e| match &e.param {
        None => ApiError::invalid_param(at, format!("invalid `{at}`: {}", e.message)),
        Some(inner) => {
            let path = format!("{at}.{inner}");
            let message = e
                .message
                .replacen(&format!("`{inner}`"), &format!("`{path}`"), 1);
            ApiError::invalid_param(&path, message)
        }
    })
}

fn bad(param: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_param(param, format!("invalid `{param}`: {why}"))
}

/// A message's content: a string, or a list of blocks.
fn blocks(at: &str, content: &Json) -> Result<Vec<Block>, ApiError> {
    match content {
        Json::String(text) => Ok(vec![Block::Text {
            text: text.clone(),
            _cache_control: None,
            _citations: None,
        }]),
        Json::Array(items) => items
            .iter()
            .enumerate()
            .map(|(j, item)| {
                let at = format!("{at}[{j}]");
                match item.get("type").and_then(Json::as_str) {
                    Some(kind) if UNREADABLE_BLOCKS.contains(&kind) => Err(bad(
                        &at,
                        format!("{kind} blocks are not supported: this model reads text only"),
                    )),
                    _ => typed_at(item, &at),
                }
            })
            .collect(),
        _ => Err(bad(at, "expected a string or a list of content blocks")),
    }
}

/// The text of a `system` value or of a tool result's `content`: a string, or text blocks
/// (joined with newlines).
fn text_of(at: &str, value: &Json) -> Result<String, ApiError> {
    match blocks(at, value)?
        .into_iter()
        .enumerate()
        .map(|(j, block)| match block {
            Block::Text { text, .. } => Ok(text),
            _ => Err(bad(
                &format!("{at}[{j}]"),
                "only text blocks are allowed here",
            )),
        })
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(texts) => Ok(texts.join("\n")),
        Err(e) => Err(e),
    }
}

/// One Anthropic message as OpenAI messages (a user turn with tool results gives several).
fn translate(at: &str, message: &InputMessage) -> Result<Vec<Json>, ApiError> {
    let blocks = blocks(&format!("{at}.content"), &message.content)?;
    let mut text = Vec::new();
    let mut thinking = Vec::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for (j, block) in blocks.into_iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        let misplaced = |kind: &str| {
            let role = match message.role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            bad(
                &here,
                format!("a {kind} block cannot be in a {role} message"),
            )
        };
        match block {
            Block::Text { text: t, .. } => text.push(t),
            Block::Thinking { thinking: t, .. } if message.role == Role::Assistant => {
                thinking.push(t)
            }
            Block::Thinking { .. } => return Err(misplaced("thinking")),
            // Encrypted thinking of Anthropic's models: nothing this model can read.
            Block::RedactedThinking { .. } => {}
            Block::ToolUse {
                id, name, input, ..
            } if message.role == Role::Assistant => calls.push(json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": input},
            })),
            Block::ToolUse { .. } => return Err(misplaced("tool_use")),
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
                ..
            } if message.role == Role::User => {
                let mut answer = match &content {
                    None | Some(Json::Null) => String::new(),
                    Some(c) => text_of(&format!("{here}.content"), c)?,
                };
                if is_error == Some(true) {
                    answer = format!("Error: {answer}");
                }
                results
                    .push(json!({"role": "tool", "tool_call_id": tool_use_id, "content": answer}));
            }
            Block::ToolResult { .. } => return Err(misplaced("tool_result")),
        }
    }
    let text = text.join("\n");
    Ok(match message.role {
        Role::User => {
            let mut out = results;
            if !text.is_empty() || out.is_empty() {
                out.push(json!({"role": "user", "content": text}));
            }
            out
        }
        Role::Assistant => {
            let mut m = Map::new();
            m.insert("role".into(), "assistant".into());
            m.insert(
                "content".into(),
                if text.is_empty() && !calls.is_empty() {
                    Json::Null
                } else {
                    text.into()
                },
            );
            if !thinking.is_empty() {
                m.insert("reasoning_content".into(), thinking.join("\n").into());
            }
            if !calls.is_empty() {
                m.insert("tool_calls".into(), Json::Array(calls));
            }
            vec![Json::Object(m)]
        }
    })
}

/// A tool as an OpenAI function. Server tools (web search, code execution, ...) run on
/// Anthropic's side and are refused.
fn tool(at: &str, value: &Json) -> Result<Json, ApiError> {
    if let Some(kind) = value.get("type").and_then(Json::as_str) {
        if kind != "custom" {
            return Err(bad(
                &format!("{at}.type"),
                format!("server tool {kind:?} is not supported; give custom tools (name, description, input_schema)"),
            ));
        }
    }
    let t: CustomTool = typed_at(value, at)?;
    let mut function = Map::new();
    function.insert("name".into(), t.name.into());
    if let Some(d) = t.description {
        function.insert("description".into(), d.into());
    }
    function.insert("parameters".into(), t.input_schema);
    Ok(json!({"type": "function", "function": function}))
}

impl MessagesRequest {
    /// The request translated and validated; `stream` and the stop strings go along.
    pub fn validate(self, limits: &Limits) -> Result<Validated, ApiError> {
        if self.messages.is_empty() {
            return Err(bad("messages", "must not be empty"));
        }
        if self.messages.last().map(|m| m.role) == Some(Role::Assistant) {
            return Err(bad(
                "messages",
                "the last message is the assistant's: continuing a prefilled reply is not \
                 supported; end with a user message",
            ));
        }
        let mut messages = Vec::new();
        if let Some(system) = &self.system {
            messages.push(json!({"role": "system", "content": text_of("system", system)?}));
        }
        for (i, m) in self.messages.iter().enumerate() {
            messages.extend(translate(&format!("messages[{i}]"), m)?);
        }
        let tools = match &self.tools {
            None => None,
            Some(tools) => Some(
                tools
                    .iter()
                    .enumerate()
                    .map(|(i, t)| tool(&format!("tools[{i}]"), t))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let tool_choice = self.tool_choice.as_ref().map(|c| match c {
            ToolChoiceParam::Auto { .. } => json!("auto"),
            ToolChoiceParam::Any { .. } => json!("required"),
            ToolChoiceParam::Tool { name, .. } => {
                json!({"type": "function", "function": {"name": name}})
            }
            ToolChoiceParam::None {} => json!("none"),
        });
        if self
            .output_config
            .as_ref()
            .is_some_and(|c| !matches!(c.format, None | Some(Json::Null)))
        {
            return Err(bad(
                "output_config.format",
                "structured output is not supported yet; leave `format` out",
            ));
        }
        let thinking = matches!(
            self.thinking,
            Some(Thinking::Enabled { .. } | Thinking::Adaptive { .. } | Thinking::BetweenTools {})
        );
        let mut template_vars = Map::new();
        template_vars.insert("enable_thinking".into(), thinking.into());
        let request = ChatRequest {
            common: Common {
                model: Some(self.model),
                max_tokens: Some(self.max_tokens),
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k,
                stop: self.stop_sequences.map(OneOrMany::Many),
                stream: self.stream,
                ..Default::default()
            },
            messages,
            max_completion_tokens: None,
            tools,
            tool_choice,
            chat_template_kwargs: Some(template_vars),
            response_format: None,
            top_logprobs: None,
        };
        request.validate(limits).map_err(anthropic_names)
    }
}

/// The OpenAI names of translated fields turned back into Anthropic's.
fn anthropic_names(mut e: ApiError) -> ApiError {
    let rename = |s: &str| {
        s.replace(".function.parameters", ".input_schema")
            .replace(".function.", ".")
            .replace("`stop`", "`stop_sequences`")
    };
    e.message = rename(&e.message);
    e.param = e.param.as_deref().map(|p| {
        if p == "stop" {
            "stop_sequences".to_string()
        } else {
            rename(p)
        }
    });
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::job::Prompt;
    use crate::tool_calls::ToolChoice;

    fn limits() -> Limits {
        Limits::for_tests(10_000)
    }

    fn validate(body: Json) -> Result<Validated, ApiError> {
        parse(body.to_string().as_bytes())?.validate(&limits())
    }

    fn messages(v: &Validated) -> (&Vec<Json>, &Map<String, Json>) {
        match &v.job.prompt {
            Prompt::Chat {
                messages,
                template_vars,
                ..
            } => (messages, template_vars),
            p => panic!("{p:?}"),
        }
    }

    #[test]
    fn a_conversation_with_tools_translates() {
        let v = validate(json!({
            "model": "m", "max_tokens": 30, "stop_sequences": ["END"], "temperature": 0,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "get_weather", "description": "d",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "any"},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Let me look.", "signature": "x"},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 C"}]},
                    {"type": "text", "text": "And tomorrow?"}]}
            ]
        }))
        .unwrap();
        assert_eq!(v.job.max_tokens, 30);
        assert_eq!(v.job.stop, vec!["END"]);
        assert_eq!(v.job.sampling.temperature, 0.0);
        assert_eq!(v.tool_choice, ToolChoice::Required);
        assert_eq!(
            v.tools[0]["function"]["parameters"]["properties"]["city"]["type"],
            "string"
        );
        let (m, vars) = messages(&v);
        assert_eq!(vars["enable_thinking"], true);
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            m[1],
            json!({"role": "user", "content": "Weather in Paris?"})
        );
        assert_eq!(m[2]["content"], "Looking.");
        assert_eq!(m[2]["reasoning_content"], "Let me look.");
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"]["city"],
            "Paris"
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "21 C"})
        );
        assert_eq!(m[4], json!({"role": "user", "content": "And tomorrow?"}));
        assert_eq!(m.len(), 5);
    }

    #[test]
    fn thinking_is_off_unless_enabled() {
        let v = validate(json!({"model": "m", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}]}))
        .unwrap();
        assert_eq!(messages(&v).1["enable_thinking"], false);
        assert!(!v.stream);
        // The current SDK's service fields are accepted.
        let v = validate(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "adaptive", "display": "summarized"}, "output_config": {"effort": "high"},
            "cache_control": {"type": "ephemeral"}, "speed": "standard", "metadata": {"user_id": "u"}}))
        .unwrap();
        assert_eq!(messages(&v).1["enable_thinking"], true);
    }

    #[test]
    fn bad_requests_name_the_field() {
        let hi = json!([{"role": "user", "content": "hi"}]);
        let cases = [
            (json!({"max_tokens": 5, "messages": hi}), None, "model"),
            (json!({"model": "m", "messages": hi}), None, "max_tokens"),
            (
                json!({"model": "m", "max_tokens": 0, "messages": hi}),
                Some("max_tokens"),
                "at least 1",
            ),
            (
                json!({"model": "m", "max_tokens": "5", "messages": hi}),
                Some("max_tokens"),
                "invalid type",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": hi, "foo": 1}),
                Some("foo"),
                "unknown field `foo`",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": []}),
                Some("messages"),
                "must not be empty",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "bot", "content": "x"}]}),
                Some("messages[0].role"),
                "unknown variant",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                Some("messages[0].content[0]"),
                "image blocks are not supported",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]}),
                Some("messages[0].content[0]"),
                "unknown field `x`",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]}),
                Some("messages[0].content[0]"),
                "cannot be in a user message",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}),
                Some("messages"),
                "prefilled",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": hi, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                Some("tools[0].type"),
                "server tool",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": hi, "tools": [{"name": "f"}]}),
                Some("tools[0]"),
                "missing field `input_schema`",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": hi, "tools": [{"name": "f", "input_schema": {"type": "string"}}]}),
                Some("tools[0].input_schema.type"),
                "object",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": hi, "tools": [{"name": "a b", "input_schema": {}}]}),
                Some("tools[0].name"),
                "letters",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": hi, "tool_choice": {"type": "tool", "name": "g"}}),
                Some("tool_choice"),
                "`g`",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": hi, "stop_sequences": [""]}),
                Some("stop_sequences"),
                "empty",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": hi, "temperature": -1}),
                Some("temperature"),
                "temperature",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": hi, "thinking": {"type": "on"}}),
                Some("thinking.type"),
                "unknown variant",
            ),
        ];
        for (body, param, says) in cases {
            let e = validate(body.clone()).expect_err(&body.to_string());
            assert_eq!(e.status, 400, "{body}: {}", e.message);
            assert_eq!(e.param.as_deref(), param, "{body}: {}", e.message);
            assert!(e.message.contains(says), "{body}: {}", e.message);
        }
        let e = validate(json!({"model": "other", "max_tokens": 5, "messages": hi})).unwrap_err();
        assert_eq!(e.status, 404);
    }
}
