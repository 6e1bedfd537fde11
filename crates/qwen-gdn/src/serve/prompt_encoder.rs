//! How the server turns a request's prompt into tokens, for the engine in this process
//! (backend.rs) and for the ranks of a job (ranked_backend.rs): the chat template with the
//! model's special tokens and thinking switch, the tokenizer, the context's limits, the
//! opening of a forced tool call and its grammar, and the structured output's automata.

use super::error::ApiError;
use super::job::{Prompt, PromptInfo};
use super::model_facts::ModelFacts;
use super::structured_output::Grammars;
use super::tool_call_grammar::tool_call_grammar;
use crate::engine::{render_conversation, PromptTokens};
use crate::load::Checkpoint;
use crate::text::chat_template::{ChatTemplate, TemplateLimit};
use crate::text::reasoning::ReasoningMode;
use crate::text::special_tokens::special_tokens;
use crate::tool_calls::{ToolCallFormat, ToolChoice};
use anyhow::Result;
use serde_json::{Map, Value as Json};

/// Bytes a chat template may add around the messages and tools.
const TEMPLATE_OVERHEAD: usize = 1 << 20;

pub struct PromptEncoder {
    template: Option<ChatTemplate>,
    /// The tool-call format the template teaches (None: it shows none, so a call cannot be
    /// forced).
    call_format: Option<ToolCallFormat>,
    /// Template variables every chat gets (special tokens, enable_thinking when the
    /// vocabulary has think tags, as `generate` does); chat_template_kwargs override them.
    base_vars: Map<String, Json>,
    /// Structured output's automata, or why there are none (read from tokenizer.json).
    grammars: std::result::Result<Grammars, String>,
}

impl PromptEncoder {
    /// `eos`: the model's end-of-sequence tokens (which end a constrained reply).
    pub fn new(checkpoint: &Checkpoint, eos: &[u32]) -> Result<Self> {
        let max_bytes = usize::try_from(checkpoint.input_limit.max_bytes).unwrap_or(usize::MAX);
        let template =
            ChatTemplate::from_dir(&checkpoint.dir, checkpoint.tokenizer_config.as_ref())?
                .map(|t| t.limit_output(max_bytes.saturating_add(TEMPLATE_OVERHEAD)));
        let mut base_vars = special_tokens(checkpoint.tokenizer_config.as_ref());
        let tokenizer = &checkpoint.tokenizer;
        if tokenizer.token_to_id("<think>").is_some() && tokenizer.token_to_id("</think>").is_some()
        {
            base_vars.insert("enable_thinking".into(), true.into());
        }
        let call_format = template
            .as_ref()
            .and_then(|t| ToolCallFormat::detect(&t.source()));
        let grammars = Grammars::new(&checkpoint.dir, eos).map_err(|e| format!("{e:#}"));
        Ok(Self {
            template,
            call_format,
            base_vars,
            grammars,
        })
    }

    /// The prompt's tokens, what the output parser must know about its end, and the grammar of
    /// the call when `tool_choice` forces one (serve/tool_call_grammar.rs).
    /// `structured`: the reply is constrained to a format, so an open thinking block is closed
    /// (the constraint starts with the answer).
    pub fn encode(
        &self,
        checkpoint: &Checkpoint,
        prompt: &Prompt,
        structured: bool,
    ) -> Result<(PromptTokens, PromptInfo, Option<String>), ApiError> {
        let (limit, tokenizer) = (&checkpoint.input_limit, &checkpoint.tokenizer);
        let too_long = |e: anyhow::Error| ApiError::context_length(format!("{e:#}"));
        let (mut tokens, text, tool_choice, tools) = match prompt {
            Prompt::Text(text) => {
                // Tokenizes at most about a context's worth before giving up.
                limit
                    .check_tokens(tokenizer, text, "the prompt")
                    .map_err(too_long)?;
                let ids = tokenizer
                    .encode(text.as_str(), true)
                    .map_err(|e| ApiError::invalid(format!("tokenizing the prompt: {e}")))?
                    .get_ids()
                    .to_vec();
                (PromptTokens::plain(ids), text.clone(), None, None)
            }
            Prompt::Chat {
                messages,
                tools,
                template_vars,
                tool_choice,
            } => {
                let template = self.template.as_ref().ok_or_else(|| {
                    ApiError::invalid("this model has no chat template; use /v1/completions")
                })?;
                let mut vars = self.base_vars.clone();
                vars.extend(template_vars.clone());
                // A template that runs out of its limits is the server's fault (500); one that
                // refuses the messages (raise_exception, a missing field) the request's (400).
                let template_error = |e: anyhow::Error| {
                    let message = format!("the chat template failed: {e:#}");
                    if e.downcast_ref::<TemplateLimit>().is_some() {
                        ApiError::internal(message)
                    } else {
                        ApiError::invalid(message)
                    }
                };
                let text = template
                    .render(messages, tools.as_ref(), true, &vars)
                    .map_err(template_error)?;
                limit
                    .check_tokens(tokenizer, &text, "the prompt")
                    .map_err(too_long)?;
                let tokens =
                    render_conversation(template, tokenizer, messages, tools.as_ref(), true, &vars)
                        .map_err(template_error)?;
                (tokens, text, Some(tool_choice), tools.as_ref())
            }
        };
        let mut info = PromptInfo {
            prompt_tokens: 0,
            reasoning: match tool_choice {
                Some(_) => ReasoningMode::from_prompt(&text),
                None => ReasoningMode::Off,
            },
            forced_opening: None,
        };
        let function = match tool_choice {
            Some(ToolChoice::Required) => Some(None),
            Some(ToolChoice::Function(name)) => Some(Some(name.as_str())),
            _ => None,
        };
        let mut call_grammar = None;
        if let (Some(function), Some(format)) = (function, self.call_format) {
            // The Qwen templates have no tool_choice: a call is forced by writing its opening
            // after the generation prompt, and the rest of it is constrained to the grammar of
            // a call to the request's tools (or, with no automaton for this vocabulary, only
            // the opening is written, the function's name included). An open thinking block is
            // closed first (as the template does with thinking off), so the call is the answer.
            let mut appended = String::new();
            if text.trim_end().ends_with("<think>") {
                appended.push_str("\n</think>\n\n");
            }
            info.reasoning = ReasoningMode::from_prompt(&(text.clone() + &appended));
            let opening = if self.grammars.is_ok() {
                let tools = tools
                    .and_then(Json::as_array)
                    .map_or(&[][..], Vec::as_slice);
                call_grammar = Some(tool_call_grammar(format, tools, function));
                format.call_opening(None)
            } else {
                format.call_opening(function)
            };
            appended.push_str(&opening);
            let ids = tokenizer
                .encode(appended.as_str(), false)
                .map_err(|e| ApiError::invalid(format!("tokenizing the prompt: {e}")))?;
            tokens.ids.extend_from_slice(ids.get_ids());
            info.forced_opening = Some(opening);
        } else if structured && tool_choice.is_some() && text.trim_end().ends_with("<think>") {
            let closing = "\n</think>\n\n";
            info.reasoning = ReasoningMode::from_prompt(&(text.clone() + closing));
            let ids = tokenizer
                .encode(closing, false)
                .map_err(|e| ApiError::invalid(format!("tokenizing the prompt: {e}")))?;
            tokens.ids.extend_from_slice(ids.get_ids());
        }
        if tokens.ids.is_empty() {
            return Err(ApiError::invalid("the prompt has no tokens"));
        }
        info.prompt_tokens = tokens.ids.len();
        // At least one position must be left to generate into.
        limit
            .check_fits(tokens.ids.len() + 1, "the prompt")
            .map_err(too_long)?;
        Ok((tokens, info, call_grammar))
    }

    pub fn grammars(&self) -> Result<&Grammars, ApiError> {
        self.grammars.as_ref().map_err(|why| {
            ApiError::invalid_param(
                "response_format",
                format!("structured output is not available for this model: {why}"),
            )
        })
    }

    /// What the Ollama API's /api/tags and /api/show tell about the model.
    pub fn model_facts(&self, checkpoint: &Checkpoint) -> ModelFacts {
        let config = crate::load::read_json_opt(&checkpoint.dir.join("config.json"))
            .ok()
            .flatten()
            .unwrap_or_default();
        ModelFacts::read(
            &checkpoint.dir,
            &config,
            self.template.as_ref().map(|t| t.source()),
            self.call_format.is_some(),
            self.base_vars.contains_key("enable_thinking"),
        )
    }
}
