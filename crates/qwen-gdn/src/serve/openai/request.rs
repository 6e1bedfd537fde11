//! Request bodies of /v1/chat/completions and /v1/completions, and their validation into a
//! [`JobSpec`]. Fields the server cannot honour (n beyond --max-batch, best_of) are 400s
//! rather than silently ignored; numbers are checked against the ranges of `generate`'s flags.
//! The Anthropic and Ollama requests are translated into these two, so that every API is
//! validated here, once.

use crate::cli::arg_ranges;
use crate::serve::error::ApiError;
use crate::serve::job::{JobSpec, LogprobRequest, Prompt, Sampling};
use crate::serve::structured_output::OutputFormat;
use crate::tool_calls::{normalize_messages_for_template, ToolChoice};
use serde::Deserialize;
use serde_json::{Map, Value as Json};

/// A string or a list of strings (`stop`, a completion `prompt`).
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// The fields both endpoints share.
#[derive(Deserialize, Debug, Default)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<u64>,
    pub stop: Option<OneOrMany>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u64>,
    pub logprobs: Option<Json>,
}

#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    /// Read separately (serde's flatten would lose the path of a field at fault).
    #[serde(skip)]
    pub common: Common,
    /// Checked and rewritten by [`normalize_messages_for_template`].
    pub messages: Vec<Json>,
    pub max_completion_tokens: Option<u64>,
    pub tools: Option<Vec<Json>>,
    pub tool_choice: Option<Json>,
    pub chat_template_kwargs: Option<Map<String, Json>>,
    pub response_format: Option<Json>,
    pub top_logprobs: Option<Json>,
}

#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    /// Read separately (serde's flatten would lose the path of a field at fault).
    #[serde(skip)]
    pub common: Common,
    pub prompt: OneOrMany,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<u64>,
}

/// A validated chat or completion request.
#[derive(Debug)]
pub struct Validated {
    pub job: JobSpec,
    pub stream: bool,
    pub include_usage: bool,
    /// Tool definitions the output parser types arguments by (empty when tool_choice is none).
    pub tools: Vec<Json>,
    pub tool_choice: ToolChoice,
    /// Completions' `echo`: the prompt text, which the reply starts with.
    pub echo: Option<String>,
    /// `n`: replies to the prompt, generated together (serve/choices.rs).
    pub choices: usize,
}

/// The most likely tokens a request may ask for at each position (vLLM's default bound).
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// Server-wide settings requests are checked against.
pub struct Limits {
    /// Names accepted in `model`.
    pub model_names: Vec<String>,
    pub default_max_tokens: usize,
    /// Bytes of prompt text beyond which no prompt can fit the context (input.rs): checked
    /// before anything is tokenized.
    pub max_prompt_bytes: u64,
    pub context: usize,
    pub defaults: SamplingDefaults,
    /// The most choices (`n`) a request may ask for: they run together, so --max-batch.
    pub max_choices: usize,
}

#[cfg(test)]
impl Limits {
    /// The limits the unit tests check requests against: model `m`, 7 tokens by default, a
    /// context of 50 tokens.
    pub fn for_tests(max_prompt_bytes: u64) -> Self {
        Self {
            model_names: vec!["m".into()],
            default_max_tokens: 7,
            max_prompt_bytes,
            context: 50,
            defaults: SamplingDefaults::from_generation_config(None).0,
            max_choices: 4,
        }
    }
}

/// Sampling settings of a request that sets none: the checkpoint's generation_config.json
/// (as vLLM uses them), else OpenAI's defaults (temperature 1, no filtering).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: usize,
    pub min_p: f64,
}

impl SamplingDefaults {
    /// Values out of range in the file are left at OpenAI's defaults (named in the warnings).
    pub fn from_generation_config(config: Option<&Json>) -> (Self, Vec<String>) {
        let mut d = Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
        };
        let mut warnings = Vec::new();
        let Some(config) = config else {
            return (d, warnings);
        };
        let mut take = |key: &str, slot: &mut f64, parser: fn(&str) -> Result<f32, String>| {
            if let Some(v) = config.get(key).and_then(Json::as_f64) {
                match parser(&v.to_string()) {
                    Ok(_) => *slot = v,
                    Err(why) => warnings.push(format!(
                        "generation_config.json: {key} = {v}: {why}; ignored"
                    )),
                }
            }
        };
        take("temperature", &mut d.temperature, arg_ranges::non_negative);
        take("top_p", &mut d.top_p, arg_ranges::probability_above_zero);
        take("min_p", &mut d.min_p, arg_ranges::probability);
        if let Some(k) = config.get("top_k").and_then(Json::as_u64) {
            d.top_k = usize::try_from(k).unwrap_or(0);
        }
        (d, warnings)
    }
}

/// A request type that embeds [`Common`].
pub trait WithCommon: for<'de> Deserialize<'de> {
    fn set_common(&mut self, common: Common);
}

impl WithCommon for ChatRequest {
    fn set_common(&mut self, common: Common) {
        self.common = common;
    }
}

impl WithCommon for CompletionRequest {
    fn set_common(&mut self, common: Common) {
        self.common = common;
    }
}

/// Parses a body, naming the field at fault when it does not match the expected type.
pub fn parse<T: WithCommon>(body: &[u8]) -> Result<T, ApiError> {
    let value = json_object(body)?;
    let common: Common = typed(&value)?;
    let mut request: T = typed(&value)?;
    request.set_common(common);
    Ok(request)
}

/// The body as a JSON object. Malformed JSON is told first, so that its message is not mixed
/// up with a type error.
pub fn json_object(body: &[u8]) -> Result<Json, ApiError> {
    let value: Json = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("the request body must be a JSON object"));
    }
    Ok(value)
}

/// `value` as a `T`, or a 400 naming the field at fault (`param` its path).
pub fn typed<T: for<'de> Deserialize<'de>>(value: &Json) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            ApiError::invalid(format!("invalid request: {inner}"))
        } else {
            ApiError::invalid_param(&path, format!("invalid `{path}`: {inner}"))
        }
    })
}

fn check_model(common: &Common, limits: &Limits) -> Result<(), ApiError> {
    match &common.model {
        Some(m) if !limits.model_names.iter().any(|n| n == m) => Err(ApiError::model_not_found(m)),
        _ => Ok(()),
    }
}

/// Checks `value` with the parser of the matching `generate` flag, so that both accept the
/// same range and say the same about it.
fn range(
    param: &str,
    value: f64,
    parser: fn(&str) -> Result<f32, String>,
) -> Result<f32, ApiError> {
    parser(&value.to_string())
        .map_err(|why| ApiError::invalid_param(param, format!("`{param}` = {value}: {why}")))
}

fn sampling(c: &Common, d: &SamplingDefaults) -> Result<Sampling, ApiError> {
    let top_k = match c.top_k.unwrap_or(d.top_k as i64) {
        // vLLM's "off".
        -1 => 0,
        k if k >= 0 => k as usize,
        k => {
            return Err(ApiError::invalid_param(
                "top_k",
                format!("`top_k` = {k}: must be 0 or more (or -1 = off)"),
            ))
        }
    };
    let repetition_penalty = match c.repetition_penalty {
        None => None,
        Some(p) => Some(range("repetition_penalty", p, arg_ranges::positive)?),
    };
    Ok(Sampling {
        temperature: range(
            "temperature",
            c.temperature.unwrap_or(d.temperature),
            arg_ranges::non_negative,
        )?,
        top_p: range(
            "top_p",
            c.top_p.unwrap_or(d.top_p),
            arg_ranges::probability_above_zero,
        )?,
        top_k,
        min_p: range("min_p", c.min_p.unwrap_or(d.min_p), arg_ranges::probability)?,
        repetition_penalty,
        presence_penalty: range(
            "presence_penalty",
            c.presence_penalty.unwrap_or(0.0),
            arg_ranges::penalty,
        )?,
        frequency_penalty: range(
            "frequency_penalty",
            c.frequency_penalty.unwrap_or(0.0),
            arg_ranges::penalty,
        )?,
        seed: c.seed,
    })
}

fn max_tokens(param: &str, value: Option<u64>, limits: &Limits) -> Result<usize, ApiError> {
    match value {
        None => Ok(limits.default_max_tokens),
        Some(0) => Err(ApiError::invalid_param(
            param,
            format!("`{param}` must be at least 1"),
        )),
        // More than the context cannot be generated anyway.
        Some(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX).min(limits.context)),
    }
}

/// `n`: at least 1, and at most what runs together (the choices share one batch).
fn choices(c: &Common, limits: &Limits) -> Result<usize, ApiError> {
    match c.n {
        None => Ok(1),
        Some(0) => Err(ApiError::invalid_param("n", "`n` must be at least 1")),
        Some(n) if n > limits.max_choices as u64 => Err(ApiError::invalid_param(
            "n",
            format!(
                "`n` is {n}, more than the {} replies this server generates together (--max-batch)",
                limits.max_choices
            ),
        )),
        Some(n) => Ok(n as usize),
    }
}

/// A count of most likely tokens, `param` = `value`: a whole number up to [`MAX_TOP_LOGPROBS`].
fn top_count(param: &str, value: &Json) -> Result<usize, ApiError> {
    match value.as_u64() {
        Some(n) if n <= MAX_TOP_LOGPROBS => Ok(n as usize),
        _ => Err(ApiError::invalid_param(
            param,
            format!("`{param}` = {value}: must be a whole number from 0 to {MAX_TOP_LOGPROBS}"),
        )),
    }
}

/// Chat's `logprobs` (a boolean) and `top_logprobs` (which needs `logprobs: true`).
fn chat_logprobs(logprobs: Option<&Json>, top: Option<&Json>) -> Result<Option<usize>, ApiError> {
    let on = match logprobs {
        None | Some(Json::Null) => false,
        Some(Json::Bool(b)) => *b,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!("`logprobs` = {other}: expected a boolean"),
            ))
        }
    };
    let top = match top {
        None | Some(Json::Null) => None,
        Some(value) => Some(top_count("top_logprobs", value)?),
    };
    match (on, top) {
        (false, Some(_)) => Err(ApiError::invalid_param(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        )),
        (false, None) => Ok(None),
        (true, top) => Ok(Some(top.unwrap_or(0))),
    }
}

/// Completions' `logprobs`: the number of most likely tokens to list (0: only the chosen one's).
fn completion_logprobs(logprobs: Option<&Json>) -> Result<Option<usize>, ApiError> {
    match logprobs {
        None | Some(Json::Null) => Ok(None),
        Some(value) => top_count("logprobs", value).map(Some),
    }
}

fn stop(c: &mut Common) -> Result<Vec<String>, ApiError> {
    let stop = c.stop.take().map(OneOrMany::into_vec).unwrap_or_default();
    if stop.len() > 16 {
        return Err(ApiError::invalid_param("stop", "at most 16 stop strings"));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid_param("stop", "a stop string is empty"));
    }
    Ok(stop)
}

fn too_long(bytes: u64, limits: &Limits) -> Result<(), ApiError> {
    if bytes > limits.max_prompt_bytes {
        return Err(ApiError::context_length(format!(
            "the prompt is {bytes} bytes, more than a context of {} tokens can hold",
            limits.context
        )));
    }
    Ok(())
}

impl ChatRequest {
    pub fn validate(mut self, limits: &Limits) -> Result<Validated, ApiError> {
        check_model(&self.common, limits)?;
        let choices = choices(&self.common, limits)?;
        let format = output_format(self.response_format.as_ref())?;
        let logprobs = chat_logprobs(self.common.logprobs.as_ref(), self.top_logprobs.as_ref())?;
        let sampling = sampling(&self.common, &limits.defaults)?;
        let max_tokens = match self.max_completion_tokens {
            Some(n) => max_tokens("max_completion_tokens", Some(n), limits)?,
            None => max_tokens("max_tokens", self.common.max_tokens, limits)?,
        };
        let stop = stop(&mut self.common)?;
        let tools = self.tools.take().unwrap_or_default();
        for (i, tool) in tools.iter().enumerate() {
            check_tool(&format!("tools[{i}]"), tool)?;
        }
        let tool_choice = tool_choice(self.tool_choice.as_ref(), &tools)?;
        let shown: Vec<Json> = match &tool_choice {
            ToolChoice::None => vec![],
            ToolChoice::Function(name) => tools
                .iter()
                .filter(|t| t["function"]["name"].as_str() == Some(name))
                .cloned()
                .collect(),
            _ => tools,
        };
        let messages = normalize_messages_for_template(&self.messages).map_err(|e| {
            ApiError::invalid_param(&e.param, format!("invalid `{}`: {}", e.param, e.message))
        })?;
        // Messages and tools as JSON text: a little more than the text they put in the prompt.
        let bytes = serde_json::to_string(&messages).map_or(0, |t| t.len())
            + serde_json::to_string(&shown).map_or(0, |t| t.len());
        too_long(bytes as u64, limits)?;
        let template_vars = self.chat_template_kwargs.unwrap_or_default();
        if let Some(key) = crate::text::chat_template::RESERVED_VARIABLES
            .iter()
            .find(|k| template_vars.contains_key(**k))
        {
            return Err(ApiError::invalid_param(
                "chat_template_kwargs",
                format!("`{key}` is set by the server and cannot be overridden"),
            ));
        }
        Ok(Validated {
            job: JobSpec {
                prompt: Prompt::Chat {
                    messages,
                    tools: (!shown.is_empty()).then(|| Json::Array(shown.clone())),
                    template_vars,
                    tool_choice: tool_choice.clone(),
                },
                max_tokens,
                sampling,
                stop,
                logprobs: logprobs.map(|top| LogprobRequest { top, prompt: false }),
                format,
            },
            stream: self.common.stream.unwrap_or(false),
            include_usage: include_usage(&self.common),
            tools: shown,
            tool_choice,
            echo: None,
            choices,
        })
    }
}

/// A tool definition by OpenAI's rules: `{"type": "function", "function": {"name",
/// "description"?, "parameters"?, "strict"?}}`, the name of letters, digits, `_` and `-` (at most
/// 64), the parameters a JSON Schema object (`type` "object" when given). The template prints
/// the definition into the prompt, so a wrong shape would reach the model unnoticed.
fn check_tool(at: &str, tool: &Json) -> Result<(), ApiError> {
    let bad = |param: String, why: &str| {
        Err(ApiError::invalid_param(
            &param,
            format!("invalid `{param}`: {why}"),
        ))
    };
    let Some(tool) = tool.as_object() else {
        return bad(at.into(), "expected an object");
    };
    match tool.get("type") {
        Some(Json::String(t)) if t == "function" => {}
        Some(Json::String(_)) => {
            return bad(
                format!("{at}.type"),
                "only tools of type \"function\" are supported",
            )
        }
        _ => return bad(format!("{at}.type"), "required: \"function\""),
    }
    let at = format!("{at}.function");
    let Some(function) = tool.get("function").and_then(Json::as_object) else {
        return bad(at, "required: an object with the function's name");
    };
    match function.get("name") {
        Some(Json::String(name))
            if !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') => {}
        Some(Json::String(_)) => {
            return bad(
                format!("{at}.name"),
                "must be 1 to 64 letters, digits, underscores or dashes",
            )
        }
        _ => return bad(format!("{at}.name"), "required: a string"),
    }
    if !matches!(function.get("description"), None | Some(Json::String(_))) {
        return bad(format!("{at}.description"), "expected a string");
    }
    if !matches!(
        function.get("strict"),
        None | Some(Json::Null | Json::Bool(_))
    ) {
        return bad(format!("{at}.strict"), "expected a boolean");
    }
    match function.get("parameters") {
        None => Ok(()),
        Some(Json::Object(schema)) => check_parameters(&format!("{at}.parameters"), schema),
        Some(_) => bad(
            format!("{at}.parameters"),
            "expected a JSON Schema object (e.g. {\"type\": \"object\", \"properties\": {…}})",
        ),
    }
}

/// The top of a function's parameter schema: an object schema, as OpenAI requires.
fn check_parameters(at: &str, schema: &Map<String, Json>) -> Result<(), ApiError> {
    let bad = |param: String, why: &str| {
        Err(ApiError::invalid_param(
            &param,
            format!("invalid `{param}`: {why}"),
        ))
    };
    if !matches!(schema.get("type"), None | Some(Json::String(_)))
        || schema.get("type").is_some_and(|t| t != "object")
    {
        return bad(
            format!("{at}.type"),
            "the parameters' schema must be of type \"object\"",
        );
    }
    if !matches!(schema.get("properties"), None | Some(Json::Object(_))) {
        return bad(format!("{at}.properties"), "expected an object");
    }
    match schema.get("required") {
        None => Ok(()),
        Some(Json::Array(names)) if names.iter().all(Json::is_string) => Ok(()),
        Some(_) => bad(format!("{at}.required"), "expected a list of strings"),
    }
}

/// Chat's `response_format`: `{"type": "text"}` (free text), `{"type": "json_object"}`, or
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"?, "description"?}}`.
/// Whether the schema compiles is found when the job starts (structured_output.rs).
fn output_format(format: Option<&Json>) -> Result<Option<OutputFormat>, ApiError> {
    let bad = |param: &str, why: &str| {
        Err(ApiError::invalid_param(
            param,
            format!("invalid `{param}`: {why}"),
        ))
    };
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let Some(format) = format.as_object() else {
        return bad("response_format", "expected an object with a `type`");
    };
    match format.get("type").and_then(Json::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(OutputFormat::JsonObject)),
        Some("json_schema") => {
            let Some(spec) = format.get("json_schema").and_then(Json::as_object) else {
                return bad(
                    "response_format.json_schema",
                    "required: an object with `name` and `schema`",
                );
            };
            if !spec.get("name").is_some_and(Json::is_string) {
                return bad("response_format.json_schema.name", "required: a string");
            }
            if !matches!(spec.get("strict"), None | Some(Json::Null | Json::Bool(_))) {
                return bad("response_format.json_schema.strict", "expected a boolean");
            }
            match spec.get("schema") {
                Some(schema @ Json::Object(_)) => {
                    Ok(Some(OutputFormat::JsonSchema(schema.clone())))
                }
                _ => bad(
                    "response_format.json_schema.schema",
                    "required: a JSON Schema object",
                ),
            }
        }
        _ => bad(
            "response_format.type",
            "expected \"text\", \"json_object\" or \"json_schema\"",
        ),
    }
}

fn include_usage(c: &Common) -> bool {
    c.stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false)
}

fn tool_choice(choice: Option<&Json>, tools: &[Json]) -> Result<ToolChoice, ApiError> {
    let bad = |msg: &str| ApiError::invalid_param("tool_choice", msg.to_string());
    let choice = ToolChoice::from_request(choice).map_err(|e| bad(&e))?;
    match &choice {
        ToolChoice::Required if tools.is_empty() => {
            Err(bad("tool_choice \"required\" needs `tools`"))
        }
        ToolChoice::Function(name)
            if !tools
                .iter()
                .any(|t| t["function"]["name"].as_str() == Some(name)) =>
        {
            Err(bad(&format!(
                "tool_choice names `{name}`, which is not in `tools`"
            )))
        }
        _ => Ok(choice),
    }
}

impl CompletionRequest {
    pub fn validate(mut self, limits: &Limits) -> Result<Validated, ApiError> {
        check_model(&self.common, limits)?;
        let choices = choices(&self.common, limits)?;
        if self.suffix.is_some() {
            return Err(ApiError::invalid_param("suffix", "suffix is not supported"));
        }
        // best_of > n ranks candidates the reply does not show: not supported.
        if self.best_of.is_some_and(|b| b != choices as u64) {
            return Err(ApiError::invalid_param(
                "best_of",
                "only best_of = n is supported",
            ));
        }
        let mut prompts = std::mem::replace(&mut self.prompt, OneOrMany::Many(vec![])).into_vec();
        if prompts.len() != 1 {
            return Err(ApiError::invalid_param(
                "prompt",
                "expected one prompt string",
            ));
        }
        let prompt = prompts.remove(0);
        if prompt.is_empty() {
            return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
        }
        too_long(prompt.len() as u64, limits).map_err(|e| e.with_param("prompt"))?;
        let echo = self.echo.unwrap_or(false);
        let logprobs = completion_logprobs(self.common.logprobs.as_ref())?;
        let sampling = sampling(&self.common, &limits.defaults)?;
        // With echo, nothing need be generated: the prompt's log-probabilities are the answer
        // (how evaluation harnesses score a text).
        let max_tokens = match self.common.max_tokens {
            Some(0) if echo => 0,
            n => max_tokens("max_tokens", n, limits)?,
        };
        let stop = stop(&mut self.common)?;
        Ok(Validated {
            job: JobSpec {
                prompt: Prompt::Text(prompt.clone()),
                max_tokens,
                sampling,
                stop,
                logprobs: logprobs.map(|top| LogprobRequest { top, prompt: echo }),
                format: None,
            },
            stream: self.common.stream.unwrap_or(false),
            include_usage: include_usage(&self.common),
            tools: vec![],
            tool_choice: ToolChoice::None,
            echo: echo.then_some(prompt),
            choices,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::for_tests(1000)
    }

    fn chat(body: &str) -> Result<Validated, ApiError> {
        parse::<ChatRequest>(body.as_bytes())?.validate(&limits())
    }

    #[test]
    fn a_plain_chat_request_validates() {
        let v = chat(r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"stop":"x","temperature":0,"presence_penalty":1.5,"frequency_penalty":-0.5}"#).unwrap();
        assert_eq!(v.job.max_tokens, 7);
        assert_eq!(v.job.sampling.presence_penalty, 1.5);
        assert_eq!(v.job.sampling.frequency_penalty, -0.5);
        assert_eq!(v.job.stop, vec!["x"]);
        assert_eq!(v.job.sampling.temperature, 0.0);
        match v.job.prompt {
            Prompt::Chat {
                messages, tools, ..
            } => {
                assert_eq!(messages[0]["content"], "ab");
                assert!(tools.is_none());
            }
            p => panic!("{p:?}"),
        }
        assert_eq!(v.tool_choice, ToolChoice::Auto);
    }

    #[test]
    fn bad_requests_name_the_field() {
        // Fields added to a request of one user message.
        let fields = [
            (r#""temperature":"hot""#, "temperature"),
            (r#""temperature":-1"#, "temperature"),
            (r#""top_p":0"#, "top_p"),
            (r#""min_p":1.5"#, "min_p"),
            (r#""top_k":-2"#, "top_k"),
            (r#""presence_penalty":2.5"#, "presence_penalty"),
            (r#""frequency_penalty":-3"#, "frequency_penalty"),
            (r#""max_tokens":0"#, "max_tokens"),
            (r#""seed":-1"#, "seed"),
            (r#""n":0"#, "n"),
            (r#""n":5"#, "n"),
            (r#""tool_choice":"required""#, "tool_choice"),
            (
                r#""chat_template_kwargs":{"messages":1}"#,
                "chat_template_kwargs",
            ),
        ];
        let mut cases: Vec<(String, &str)> = fields
            .into_iter()
            .map(|(field, param)| {
                let body = format!(r#"{{"messages":[{{"role":"user","content":"a"}}],{field}}}"#);
                (body, param)
            })
            .collect();
        for (body, param) in [
            (
                r#"{"messages":[{"role":"robot","content":"a"}]}"#,
                "messages[0].role",
            ),
            (
                r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
                "messages[0].content[0]",
            ),
            (r#"{"messages":[]}"#, "messages"),
        ] {
            cases.push((body.to_string(), param));
        }
        for (body, param) in &cases {
            let e = chat(body).expect_err(body);
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(*param), "{body}: {}", e.message);
        }
        assert_eq!(chat("{").unwrap_err().status, 400);
        assert_eq!(chat("[1]").unwrap_err().status, 400);
        let e =
            chat(r#"{"model":"other","messages":[{"role":"user","content":"a"}]}"#).unwrap_err();
        assert_eq!(e.status, 404);
    }

    #[test]
    fn a_prompt_over_the_byte_bound_is_refused_before_tokenizing() {
        let long = "x".repeat(1001);
        let e = chat(&format!(
            r#"{{"messages":[{{"role":"user","content":"{long}"}}]}}"#
        ))
        .unwrap_err();
        assert_eq!(e.code, Some("context_length_exceeded"));
    }

    #[test]
    fn tools_and_tool_choice() {
        let tools = r#"[{"type":"function","function":{"name":"f","parameters":{}}},{"type":"function","function":{"name":"g"}}]"#;
        let v = chat(&format!(
            r#"{{"messages":[{{"role":"user","content":"a"}}],"tools":{tools}}}"#
        ))
        .unwrap();
        assert_eq!(v.tool_choice, ToolChoice::Auto);
        assert_eq!(v.tools.len(), 2);
        let v = chat(&format!(r#"{{"messages":[{{"role":"user","content":"a"}}],"tools":{tools},"tool_choice":{{"type":"function","function":{{"name":"g"}}}}}}"#)).unwrap();
        assert_eq!(v.tool_choice, ToolChoice::Function("g".into()));
        assert_eq!(v.tools.len(), 1);
        let v = chat(&format!(r#"{{"messages":[{{"role":"user","content":"a"}}],"tools":{tools},"tool_choice":"none"}}"#)).unwrap();
        assert!(v.tools.is_empty());
        let e = chat(&format!(r#"{{"messages":[{{"role":"user","content":"a"}}],"tools":{tools},"tool_choice":{{"type":"function","function":{{"name":"h"}}}}}}"#)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        // An assistant turn with a call (arguments as JSON text) and the tool's answer.
        let v = chat(r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]},{"role":"tool","tool_call_id":"c1","content":"2"}]}"#).unwrap();
        match v.job.prompt {
            Prompt::Chat { messages, .. } => {
                assert_eq!(
                    messages[1]["tool_calls"][0]["function"]["arguments"]["x"],
                    1
                );
                assert_eq!(messages[2]["role"], "tool");
            }
            p => panic!("{p:?}"),
        }
    }

    #[test]
    fn tool_schemas_follow_openai_rules() {
        let with_tool = |tool: &str| {
            chat(&format!(
                r#"{{"messages":[{{"role":"user","content":"a"}}],"tools":[{tool}]}}"#
            ))
        };
        let cases = [
            (r#""f""#, "tools[0]"),
            (r#"{"function":{"name":"f"}}"#, "tools[0].type"),
            (
                r#"{"type":"code","function":{"name":"f"}}"#,
                "tools[0].type",
            ),
            (r#"{"type":"function"}"#, "tools[0].function"),
            (
                r#"{"type":"function","function":{}}"#,
                "tools[0].function.name",
            ),
            (
                r#"{"type":"function","function":{"name":"get weather"}}"#,
                "tools[0].function.name",
            ),
            (
                r#"{"type":"function","function":{"name":"f","description":3}}"#,
                "tools[0].function.description",
            ),
            (
                r#"{"type":"function","function":{"name":"f","parameters":"{}"}}"#,
                "tools[0].function.parameters",
            ),
            (
                r#"{"type":"function","function":{"name":"f","parameters":[]}}"#,
                "tools[0].function.parameters",
            ),
            (
                r#"{"type":"function","function":{"name":"f","parameters":{"type":"string"}}}"#,
                "tools[0].function.parameters.type",
            ),
            (
                r#"{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":[]}}}"#,
                "tools[0].function.parameters.properties",
            ),
            (
                r#"{"type":"function","function":{"name":"f","parameters":{"type":"object","required":"x"}}}"#,
                "tools[0].function.parameters.required",
            ),
        ];
        for (tool, param) in cases {
            let e = with_tool(tool).expect_err(tool);
            assert_eq!(e.status, 400, "{tool}");
            assert_eq!(e.param.as_deref(), Some(param), "{tool}: {}", e.message);
            assert!(e.message.contains(param), "{}", e.message);
        }
        with_tool(r#"{"type":"function","function":{"name":"get_weather-2","description":"d","strict":true,"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}"#).unwrap();
    }

    #[test]
    fn message_content_follows_openai_rules() {
        for (messages, param) in [
            (r#"[{"role":"user","content":null}]"#, "messages[0].content"),
            (r#"[{"role":"user"}]"#, "messages[0].content"),
            (
                r#"[{"role":"system","content":null},{"role":"user","content":"a"}]"#,
                "messages[0].content",
            ),
            (
                r#"[{"role":"user","content":"a"},{"role":"assistant","content":null}]"#,
                "messages[1].content",
            ),
        ] {
            let e = chat(&format!(r#"{{"messages":{messages}}}"#)).expect_err(messages);
            assert_eq!(e.status, 400, "{messages}");
            assert_eq!(e.param.as_deref(), Some(param), "{messages}: {}", e.message);
        }
        // An assistant turn that only calls a tool has no content.
        chat(r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"2"}]}"#).unwrap();
    }

    #[test]
    fn defaults_come_from_generation_config() {
        let config =
            serde_json::json!({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 7});
        let (d, warnings) = SamplingDefaults::from_generation_config(Some(&config));
        assert_eq!(
            (d.temperature, d.top_p, d.top_k, d.min_p),
            (0.6, 0.95, 20, 0.0)
        );
        assert!(warnings[0].contains("min_p"), "{warnings:?}");
        let mut l = limits();
        l.defaults = d;
        let v =
            parse::<ChatRequest>(br#"{"messages":[{"role":"user","content":"a"}],"top_p":0.5}"#)
                .unwrap()
                .validate(&l)
                .unwrap();
        assert_eq!(v.job.sampling.temperature, 0.6);
        assert_eq!(v.job.sampling.top_p, 0.5);
        assert_eq!(v.job.sampling.top_k, 20);
    }

    #[test]
    fn log_probability_requests() {
        let with = |extra: &str| {
            chat(&format!(
                r#"{{"messages":[{{"role":"user","content":"a"}}]{extra}}}"#
            ))
        };
        assert_eq!(with("").unwrap().job.logprobs, None);
        assert_eq!(with(r#","logprobs":false"#).unwrap().job.logprobs, None);
        let l = with(r#","logprobs":true,"top_logprobs":20"#)
            .unwrap()
            .job
            .logprobs;
        assert_eq!(
            l,
            Some(LogprobRequest {
                top: 20,
                prompt: false
            })
        );
        let l = with(r#","logprobs":true"#).unwrap().job.logprobs;
        assert_eq!(
            l,
            Some(LogprobRequest {
                top: 0,
                prompt: false
            })
        );
        for (extra, param) in [
            (r#","logprobs":"yes""#, "logprobs"),
            (r#","logprobs":true,"top_logprobs":21"#, "top_logprobs"),
            (r#","logprobs":true,"top_logprobs":2.5"#, "top_logprobs"),
            (r#","logprobs":false,"top_logprobs":2"#, "top_logprobs"),
        ] {
            let e = with(extra).expect_err(extra);
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
        }
        let completion =
            |body: &str| parse::<CompletionRequest>(body.as_bytes())?.validate(&limits());
        let v = completion(r#"{"prompt":"hi","echo":true,"logprobs":3,"max_tokens":0}"#).unwrap();
        assert_eq!(
            v.job.logprobs,
            Some(LogprobRequest {
                top: 3,
                prompt: true
            })
        );
        assert_eq!((v.job.max_tokens, v.echo.as_deref()), (0, Some("hi")));
        let v = completion(r#"{"prompt":"hi","logprobs":0}"#).unwrap();
        assert_eq!(
            v.job.logprobs,
            Some(LogprobRequest {
                top: 0,
                prompt: false
            })
        );
        assert_eq!(v.echo, None);
        for (body, param) in [
            (r#"{"prompt":"hi","logprobs":-1}"#, "logprobs"),
            (r#"{"prompt":"hi","logprobs":true}"#, "logprobs"),
            (r#"{"prompt":"hi","max_tokens":0}"#, "max_tokens"),
        ] {
            let e = completion(body).expect_err(body);
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn completions() {
        let v = parse::<CompletionRequest>(br#"{"prompt":["hi"],"max_tokens":1000,"stream":true}"#)
            .unwrap()
            .validate(&limits())
            .unwrap();
        assert_eq!(v.job.max_tokens, 50);
        assert!(v.stream);
        let e = parse::<CompletionRequest>(br#"{"prompt":["a","b"]}"#)
            .unwrap()
            .validate(&limits())
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        let e = parse::<CompletionRequest>(br#"{"prompt":5}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }
}
