//! The bodies of Ollama's `POST /api/chat` and `POST /api/generate`, translated into the
//! OpenAI requests every API is validated as:
//! - `options` map onto the sampling fields: temperature, top_p, top_k, min_p, seed,
//!   num_predict (-1 and -2: until the context is full), stop, repeat_penalty,
//!   presence_penalty, frequency_penalty. llama.cpp's hardware and runtime options (num_ctx,
//!   num_gpu, num_thread, ...) are accepted and have no effect; samplers this engine does not
//!   have (mirostat, typical_p) are 400s unless off; unknown options are 400s.
//! - `think` sets the template's `enable_thinking` (left out: the model's default);
//! - `/api/generate` renders `system` and `prompt` through the chat template, or with
//!   `raw: true` sends the prompt as it is;
//! - `keep_alive` is accepted (the model stays loaded for the server's life), `stream`
//!   defaults to true as in Ollama.

use super::reply::Endpoint;
use crate::serve::error::ApiError;
use crate::serve::generation::Output;
use crate::serve::openai::request::{
    json_object, typed, ChatRequest, Common, CompletionRequest, Limits, OneOrMany, Validated,
};
use serde::Deserialize;
use serde_json::{json, Map, Value as Json};

/// Declares the body of `/api/chat` or `/api/generate`: its own fields, then the ones both
/// share. (serde's `deny_unknown_fields` cannot take these from a flattened struct.)
macro_rules! ollama_body {
    ($name:ident { $($own:tt)* }) => {
        #[derive(Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($own)*
            pub format: Option<Json>,
            pub options: Option<Options>,
            pub stream: Option<bool>,
            /// Accepted: the model stays loaded for the server's life.
            #[serde(rename = "keep_alive")]
            _keep_alive: Option<KeepAlive>,
            pub think: Option<Think>,
            /// Accepted: a prompt past the context is refused (400), never cut.
            #[serde(rename = "truncate")]
            _truncate: Option<bool>,
            #[serde(rename = "shift")]
            _shift: Option<bool>,
            pub logprobs: Option<bool>,
            #[serde(rename = "top_logprobs")]
            _top_logprobs: Option<u64>,
        }
    };
}

ollama_body!(ChatBody {
    pub model: String,
    #[serde(default)]
    pub messages: Vec<Message>,
    pub tools: Option<Vec<Json>>,
});

ollama_body!(GenerateBody {
    pub model: String,
    #[serde(default)]
    pub prompt: String,
    pub suffix: Option<String>,
    pub system: Option<String>,
    pub template: Option<String>,
    pub context: Option<Vec<i64>>,
    pub raw: Option<bool>,
    pub images: Option<Vec<Json>>,
});

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    pub content: Option<String>,
    pub thinking: Option<String>,
    pub images: Option<Vec<Json>>,
    /// `[{"function": {"name", "arguments": {...}}}]`.
    pub tool_calls: Option<Vec<Json>>,
    pub tool_name: Option<String>,
    pub tool_call_id: Option<String>,
}

/// `true`/`false`, or a level ("high", "medium", "low"), which means on.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Think {
    Flag(bool),
    Level(String),
}

/// A duration ("5m", "1h") or seconds (0 unloads in Ollama; here the model always stays).
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum KeepAlive {
    Seconds(#[allow(dead_code)] f64),
    Duration(#[allow(dead_code)] String),
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct Options {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    /// Negative: a random seed.
    pub seed: Option<i64>,
    pub num_predict: Option<i64>,
    pub stop: Option<Vec<String>>,
    pub repeat_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub mirostat: Option<i64>,
    pub typical_p: Option<f64>,
    // Accepted without effect: the penalty window is 20 tokens (as mlx-lm's); tfs_z and
    // penalize_newline are gone from Ollama itself.
    #[serde(rename = "repeat_last_n")]
    _repeat_last_n: Option<i64>,
    #[serde(rename = "tfs_z")]
    _tfs_z: Option<f64>,
    #[serde(rename = "penalize_newline")]
    _penalize_newline: Option<bool>,
    #[serde(rename = "mirostat_tau")]
    _mirostat_tau: Option<f64>,
    #[serde(rename = "mirostat_eta")]
    _mirostat_eta: Option<f64>,
    // llama.cpp's hardware and runtime settings: nothing to set here.
    #[serde(rename = "num_ctx")]
    _num_ctx: Option<i64>,
    #[serde(rename = "num_batch")]
    _num_batch: Option<i64>,
    #[serde(rename = "num_gpu")]
    _num_gpu: Option<i64>,
    #[serde(rename = "main_gpu")]
    _main_gpu: Option<i64>,
    #[serde(rename = "num_thread")]
    _num_thread: Option<i64>,
    #[serde(rename = "num_keep")]
    _num_keep: Option<i64>,
    #[serde(rename = "numa")]
    _numa: Option<bool>,
    #[serde(rename = "low_vram")]
    _low_vram: Option<bool>,
    #[serde(rename = "f16_kv")]
    _f16_kv: Option<bool>,
    #[serde(rename = "logits_all")]
    _logits_all: Option<bool>,
    #[serde(rename = "vocab_only")]
    _vocab_only: Option<bool>,
    #[serde(rename = "use_mmap")]
    _use_mmap: Option<bool>,
    #[serde(rename = "use_mlock")]
    _use_mlock: Option<bool>,
    #[serde(rename = "embedding_only")]
    _embedding_only: Option<bool>,
}

fn bad(param: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_param(param, format!("invalid `{param}`: {why}"))
}

pub fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    typed(&json_object(body)?)
}

/// The served name `model` means: itself, or itself without Ollama's default tag `:latest`.
pub fn resolve_model(model: &str, limits: &Limits) -> Result<String, ApiError> {
    let names = &limits.model_names;
    if names.iter().any(|n| n == model) {
        return Ok(model.to_string());
    }
    match model.strip_suffix(":latest") {
        Some(bare) if names.iter().any(|n| n == bare) => Ok(bare.to_string()),
        _ => {
            let mut e = ApiError::model_not_found(model);
            e.message = format!(
                "model '{model}' not found; this server serves {} (GET /api/tags)",
                names.join(", ")
            );
            Err(e)
        }
    }
}

/// Ollama's `format` as OpenAI's `response_format`: `"json"` any JSON object, an object a
/// JSON schema the reply must follow; absent or `""` free text.
fn response_format(format: &Option<Json>) -> Result<Option<Json>, ApiError> {
    match format {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) if s.is_empty() => Ok(None),
        Some(Json::String(s)) if s == "json" => Ok(Some(json!({"type": "json_object"}))),
        Some(schema @ Json::Object(_)) => Ok(Some(json!({
            "type": "json_schema",
            "json_schema": {"name": "format", "schema": schema},
        }))),
        Some(other) => Err(bad(
            "format",
            format!("{other}: expected \"json\" or a JSON schema object"),
        )),
    }
}

/// The fields the two endpoints share that this server cannot honour, and the template
/// variables `think` sets.
fn common_checks(
    logprobs: Option<bool>,
    think: &Option<Think>,
) -> Result<Map<String, Json>, ApiError> {
    if logprobs == Some(true) {
        return Err(bad("logprobs", "log-probabilities are not supported yet"));
    }
    let mut vars = Map::new();
    match think {
        None => {}
        Some(Think::Flag(on)) => {
            vars.insert("enable_thinking".into(), (*on).into());
        }
        Some(Think::Level(level)) if ["high", "medium", "low"].contains(&level.as_str()) => {
            vars.insert("enable_thinking".into(), true.into());
        }
        Some(Think::Level(level)) => {
            return Err(bad(
                "think",
                format!("{level:?}: expected true, false, \"high\", \"medium\" or \"low\""),
            ))
        }
    }
    Ok(vars)
}

/// `options` as the OpenAI request's sampling fields.
fn sampling(
    model: String,
    options: Option<Options>,
    stream: Option<bool>,
    limits: &Limits,
) -> Result<Common, ApiError> {
    let o = options.unwrap_or_default();
    if o.mirostat.is_some_and(|m| m != 0) {
        return Err(bad(
            "options.mirostat",
            "mirostat sampling is not supported (0 = off)",
        ));
    }
    if o.typical_p.is_some_and(|p| p != 1.0) {
        return Err(bad(
            "options.typical_p",
            "typical sampling is not supported (1.0 = off)",
        ));
    }
    let max_tokens = match o.num_predict {
        None => None,
        // Ollama's "no limit" and "fill the context".
        Some(-1 | -2) => Some(limits.context as u64),
        Some(n) if n >= 0 => Some(n as u64),
        Some(n) => {
            return Err(bad(
                "options.num_predict",
                format!("{n}: expected a count, -1 (no limit) or -2 (fill the context)"),
            ))
        }
    };
    Ok(Common {
        model: Some(model),
        max_tokens,
        temperature: o.temperature,
        top_p: o.top_p,
        top_k: o.top_k,
        min_p: o.min_p,
        repetition_penalty: o.repeat_penalty,
        presence_penalty: o.presence_penalty,
        frequency_penalty: o.frequency_penalty,
        seed: o.seed.and_then(|s| u64::try_from(s).ok()),
        stop: o.stop.map(OneOrMany::Many),
        // Ollama streams unless told not to.
        stream: Some(stream.unwrap_or(true)),
        ..Default::default()
    })
}

/// OpenAI's names of the sampling fields turned back into Ollama's options.
fn ollama_names(mut e: ApiError) -> ApiError {
    let option = match e.param.as_deref() {
        Some("max_tokens") => Some(("max_tokens", "options.num_predict")),
        Some("repetition_penalty") => Some(("repetition_penalty", "options.repeat_penalty")),
        Some(
            p @ ("temperature" | "top_p" | "top_k" | "min_p" | "presence_penalty"
            | "frequency_penalty" | "stop" | "seed"),
        ) => Some((p, "")),
        _ => None,
    };
    if let Some((openai, ollama)) = option {
        let ollama = if ollama.is_empty() {
            format!("options.{openai}")
        } else {
            ollama.to_string()
        };
        e.message = e
            .message
            .replace(&format!("`{openai}`"), &format!("`{ollama}`"));
        e.param = Some(ollama);
    }
    e
}

fn translate(at: &str, m: &Message) -> Result<Json, ApiError> {
    if m.images.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(bad(
            &format!("{at}.images"),
            "images are not supported: this model reads text only",
        ));
    }
    let mut out = Map::new();
    out.insert("role".into(), m.role.clone().into());
    let calls = m.tool_calls.clone().unwrap_or_default();
    let content = m.content.clone().unwrap_or_default();
    out.insert(
        "content".into(),
        if content.is_empty() && !calls.is_empty() {
            Json::Null
        } else {
            content.into()
        },
    );
    if let Some(thinking) = m.thinking.as_ref().filter(|t| !t.is_empty()) {
        out.insert("reasoning_content".into(), thinking.clone().into());
    }
    if !calls.is_empty() {
        out.insert("tool_calls".into(), Json::Array(calls));
    }
    if let Some(name) = &m.tool_name {
        out.insert("name".into(), name.clone().into());
    }
    if let Some(id) = &m.tool_call_id {
        out.insert("tool_call_id".into(), id.clone().into());
    }
    Ok(Json::Object(out))
}

/// What the handlers need of a chat or generate request.
pub trait OllamaRequest {
    fn model(&self) -> &str;
    fn endpoint(&self) -> Endpoint;
    /// Nothing to generate: Ollama answers such a request by loading the model.
    fn is_load_only(&self) -> bool;
    /// The request, and how its output is read.
    fn validate(self, limits: &Limits) -> Result<(Validated, Output), ApiError>;
}

impl OllamaRequest for ChatBody {
    fn model(&self) -> &str {
        &self.model
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Chat
    }

    fn is_load_only(&self) -> bool {
        self.messages.is_empty()
    }

    fn validate(self, limits: &Limits) -> Result<(Validated, Output), ApiError> {
        self.validate_chat(limits).map(|v| (v, Output::Chat))
    }
}

impl OllamaRequest for GenerateBody {
    fn model(&self) -> &str {
        &self.model
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Generate
    }

    fn is_load_only(&self) -> bool {
        self.prompt.is_empty()
    }

    fn validate(self, limits: &Limits) -> Result<(Validated, Output), ApiError> {
        self.validate_generate(limits)
    }
}

impl ChatBody {
    fn validate_chat(self, limits: &Limits) -> Result<Validated, ApiError> {
        let model = resolve_model(&self.model, limits)?;
        let vars = common_checks(self.logprobs, &self.think)?;
        let format = response_format(&self.format)?;
        let common = sampling(model, self.options, self.stream, limits)?;
        let messages = self
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| translate(&format!("messages[{i}]"), m))
            .collect::<Result<Vec<_>, _>>()?;
        ChatRequest {
            common,
            messages,
            max_completion_tokens: None,
            tools: self.tools.filter(|t| !t.is_empty()),
            tool_choice: None,
            chat_template_kwargs: Some(vars),
            response_format: format,
            top_logprobs: None,
        }
        .validate(limits)
        .map_err(ollama_names)
    }
}

impl GenerateBody {
    /// Through the chat template (the output read as a chat reply, thinking split), or raw.
    fn validate_generate(self, limits: &Limits) -> Result<(Validated, Output), ApiError> {
        let model = resolve_model(&self.model, limits)?;
        let vars = common_checks(self.logprobs, &self.think)?;
        let format = response_format(&self.format)?;
        if self.images.as_ref().is_some_and(|i| !i.is_empty()) {
            return Err(bad(
                "images",
                "images are not supported: this model reads text only",
            ));
        }
        if self.template.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(bad(
                "template",
                "a template of the request's own is not supported: the model's chat template \
                 renders the prompt (or send `raw: true`)",
            ));
        }
        if self.context.as_ref().is_some_and(|c| !c.is_empty()) {
            return Err(bad(
                "context",
                "continuing from `context` tokens is not supported; use /api/chat for a \
                 conversation",
            ));
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(bad(
                "suffix",
                "fill-in-the-middle (`suffix`) is not supported",
            ));
        }
        let common = sampling(model, self.options, self.stream, limits)?;
        let raw = self.raw == Some(true);
        if raw && format.is_some() {
            return Err(bad(
                "format",
                "structured output needs the chat template: leave out `raw: true`",
            ));
        }
        let validated = if raw {
            CompletionRequest {
                common,
                prompt: OneOrMany::One(self.prompt),
                echo: None,
                suffix: None,
                best_of: None,
            }
            .validate(limits)
        } else {
            let mut messages = Vec::new();
            if let Some(system) = self.system.filter(|s| !s.is_empty()) {
                messages.push(json!({"role": "system", "content": system}));
            }
            messages.push(json!({"role": "user", "content": self.prompt}));
            ChatRequest {
                common,
                messages,
                max_completion_tokens: None,
                tools: None,
                tool_choice: None,
                chat_template_kwargs: Some(vars),
                response_format: format,
                top_logprobs: None,
            }
            .validate(limits)
        };
        let output = if raw { Output::Text } else { Output::Chat };
        validated.map(|v| (v, output)).map_err(ollama_names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::job::Prompt;

    fn limits() -> Limits {
        Limits::for_tests(10_000)
    }

    fn chat(body: Json) -> Result<Validated, ApiError> {
        parse::<ChatBody>(body.to_string().as_bytes())?.validate_chat(&limits())
    }

    #[test]
    fn options_map_onto_sampling() {
        let v = chat(json!({
            "model": "m:latest", "keep_alive": "5m", "think": false,
            "messages": [{"role": "user", "content": "hi"}],
            "options": {"temperature": 0, "top_p": 0.5, "top_k": 3, "min_p": 0.1, "seed": 42,
                        "num_predict": 9, "stop": ["x"], "repeat_penalty": 1.1,
                        "presence_penalty": 0.5, "frequency_penalty": 0.25, "num_ctx": 8192}
        }))
        .unwrap();
        let s = &v.job.sampling;
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.seed),
            (0.0, 0.5, 3, Some(42))
        );
        assert_eq!(s.min_p, 0.1);
        assert_eq!(s.repetition_penalty, Some(1.1));
        assert_eq!((s.presence_penalty, s.frequency_penalty), (0.5, 0.25));
        assert_eq!(v.job.max_tokens, 9);
        assert_eq!(v.job.stop, vec!["x"]);
        assert!(v.stream, "Ollama streams by default");
        match &v.job.prompt {
            Prompt::Chat { template_vars, .. } => {
                assert_eq!(template_vars["enable_thinking"], false)
            }
            p => panic!("{p:?}"),
        }
        let v = chat(
            json!({"model": "m", "stream": false, "messages": [{"role": "user", "content": "hi"}],
                            "options": {"num_predict": -1}}),
        )
        .unwrap();
        assert_eq!(v.job.max_tokens, 50);
        assert!(!v.stream);
    }

    #[test]
    fn a_tool_round_trip_translates() {
        let v = chat(json!({
            "model": "m",
            "tools": [{"type": "function", "function": {"name": "get_weather",
                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "thinking": "hmm",
                 "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "tool_name": "get_weather", "content": "21 C"}
            ]
        }))
        .unwrap();
        assert_eq!(v.tools.len(), 1);
        match &v.job.prompt {
            Prompt::Chat { messages, .. } => {
                assert_eq!(messages[1]["content"], Json::Null);
                assert_eq!(messages[1]["reasoning_content"], "hmm");
                assert_eq!(
                    messages[1]["tool_calls"][0]["function"]["arguments"]["city"],
                    "Paris"
                );
                assert_eq!(messages[2]["role"], "tool");
                assert_eq!(messages[2]["content"], "21 C");
            }
            p => panic!("{p:?}"),
        }
    }

    #[test]
    fn generate_renders_the_template_unless_raw() {
        let parse_generate = |body: Json| {
            parse::<GenerateBody>(body.to_string().as_bytes())
                .unwrap()
                .validate_generate(&limits())
        };
        let (v, output) =
            parse_generate(json!({"model": "m", "prompt": "hi", "system": "be brief"})).unwrap();
        assert_eq!(output, Output::Chat);
        match &v.job.prompt {
            Prompt::Chat { messages, .. } => {
                assert_eq!(
                    messages[0],
                    json!({"role": "system", "content": "be brief"})
                );
                assert_eq!(messages[1], json!({"role": "user", "content": "hi"}));
            }
            p => panic!("{p:?}"),
        }
        let (v, output) =
            parse_generate(json!({"model": "m", "prompt": "Once", "raw": true})).unwrap();
        assert_eq!(output, Output::Text);
        assert!(matches!(&v.job.prompt, Prompt::Text(t) if t == "Once"));
        for (body, param) in [
            (
                json!({"model": "m", "prompt": "a", "template": "{{ .Prompt }}"}),
                "template",
            ),
            (
                json!({"model": "m", "prompt": "a", "context": [1, 2]}),
                "context",
            ),
            (
                json!({"model": "m", "prompt": "a", "suffix": "b"}),
                "suffix",
            ),
            (
                json!({"model": "m", "prompt": "a", "images": ["aGk="]}),
                "images",
            ),
        ] {
            let e = parse_generate(body.clone()).expect_err(&body.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        }
    }

    #[test]
    fn bad_requests_name_the_field() {
        let hi = json!([{"role": "user", "content": "hi"}]);
        let cases = [
            (json!({"messages": hi}), None, "missing field `model`"),
            (
                json!({"model": "m", "messages": hi, "foo": 1}),
                Some("foo"),
                "unknown field `foo`",
            ),
            (
                json!({"model": "m", "messages": hi, "options": {"temprature": 1}}),
                Some("options.temprature"),
                "unknown field `temprature`",
            ),
            (
                json!({"model": "m", "messages": hi, "options": {"temperature": "hot"}}),
                Some("options.temperature"),
                "invalid type",
            ),
            (
                json!({"model": "m", "messages": hi, "options": {"temperature": -1}}),
                Some("options.temperature"),
                "`options.temperature`",
            ),
            (
                json!({"model": "m", "messages": hi, "options": {"num_predict": 0}}),
                Some("options.num_predict"),
                "at least 1",
            ),
            (
                json!({"model": "m", "messages": hi, "options": {"num_predict": -3}}),
                Some("options.num_predict"),
                "-3",
            ),
            (
                json!({"model": "m", "messages": hi, "options": {"repeat_penalty": 0}}),
                Some("options.repeat_penalty"),
                "repeat_penalty",
            ),
            (
                json!({"model": "m", "messages": hi, "options": {"mirostat": 2}}),
                Some("options.mirostat"),
                "mirostat",
            ),
            (
                json!({"model": "m", "messages": hi, "format": "yaml"}),
                Some("format"),
                "expected \"json\" or a JSON schema",
            ),
            (
                json!({"model": "m", "messages": hi, "think": "max"}),
                Some("think"),
                "\"max\"",
            ),
            (
                json!({"model": "m", "messages": hi, "stream": "yes"}),
                Some("stream"),
                "invalid type",
            ),
            (
                json!({"model": "m", "messages": hi, "keep_alive": [1]}),
                Some("keep_alive"),
                "did not match",
            ),
            (
                json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
                Some("messages[0].role"),
                "unknown role",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}),
                Some("messages[0].images"),
                "images",
            ),
            (
                json!({"model": "m", "messages": hi, "tools": [{"type": "function", "function": {"name": "a b"}}]}),
                Some("tools[0].function.name"),
                "letters",
            ),
        ];
        for (body, param, says) in cases {
            let e = chat(body.clone()).expect_err(&body.to_string());
            assert_eq!(e.status, 400, "{body}: {}", e.message);
            assert_eq!(e.param.as_deref(), param, "{body}: {}", e.message);
            assert!(e.message.contains(says), "{body}: {}", e.message);
        }
        let e = chat(json!({"model": "qwen3", "messages": hi})).unwrap_err();
        assert_eq!(e.status, 404);
        assert!(
            e.message.contains("model 'qwen3' not found"),
            "{}",
            e.message
        );
    }
}
