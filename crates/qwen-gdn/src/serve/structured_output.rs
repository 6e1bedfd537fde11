//! Structured output: a reply constrained to a JSON schema (OpenAI's `response_format`
//! json_schema / json_object), or to one tool call (`tool_choice` required or named). The
//! automaton is guidance-ai's `llguidance` (MIT, kept up by the people behind vLLM's and
//! llama.cpp's structured-output back ends, pure Rust): it compiles the schema or grammar and
//! computes, per token, the bitset of tokens that keep the text a prefix of a valid document,
//! walking the tokenizer's token trie. The engine masks the logits with that bitset on the
//! device (engine/constraint.rs).

use super::error::ApiError;
use crate::engine::constraint::LogitsConstraint;
use anyhow::{anyhow, Context, Result};
use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value as Json;
use std::path::Path;
use std::sync::Arc;

/// What the reply must be.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    /// A JSON document valid against this schema.
    JsonSchema(Json),
    /// Any JSON object.
    JsonObject,
}

impl OutputFormat {
    fn schema(&self) -> Json {
        compact_json(match self {
            OutputFormat::JsonSchema(schema) => schema.clone(),
            OutputFormat::JsonObject => serde_json::json!({"type": "object"}),
        })
    }
}

/// The schema llguidance compiles: compact JSON (`", "` and `": "` between items, no other
/// whitespace, as Python's `json.dumps` and the templates' `tojson` write it), unless the
/// schema sets llguidance's own `x-guidance` options. Flexible whitespace would let a model
/// pad the reply with blanks up to max_tokens.
pub fn compact_json(mut schema: Json) -> Json {
    if let Some(object) = schema.as_object_mut() {
        object.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

/// Builds the constraint of each request from the model's vocabulary (read once).
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// The vocabulary from `<dir>/tokenizer.json` (each token's bytes, as the tokenizer's
    /// decoder gives them); `eos` are the tokens that end a reply.
    pub fn new(dir: &Path, eos: &[u32]) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let json: Json = serde_json::from_str(&text)
            .with_context(|| format!("{}: not valid JSON", path.display()))?;
        let words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let first = *eos
            .first()
            .ok_or_else(|| anyhow!("the model has no end-of-sequence token"))?;
        let info = TokRxInfo::new(words.len() as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// The constraint for `format`; a schema that is not valid, that no document satisfies,
    /// or that is over the automaton's limits is a 400 on `param` (the message names no
    /// field: Ollama's `format` arrives here too).
    pub fn constraint(
        &self,
        format: &OutputFormat,
        param: &str,
    ) -> Result<GrammarConstraint, ApiError> {
        self.compile(
            TopLevelGrammar::from_json_schema(format.schema()),
            param,
            "schema",
        )
    }

    /// The constraint of a forced tool call: `grammar` (serve/tool_call_grammar.rs) embeds the
    /// tools' schemas, so a bad one is a 400 on `tools`.
    pub fn tool_call_constraint(&self, grammar: String) -> Result<GrammarConstraint, ApiError> {
        self.compile(TopLevelGrammar::from_lark(grammar), "tools", "tool schema")
    }

    fn compile(
        &self,
        grammar: TopLevelGrammar,
        param: &str,
        what: &str,
    ) -> Result<GrammarConstraint, ApiError> {
        let parser = self.factory.create_parser(grammar).map_err(|e| {
            // One line: the answer names the field and the problem.
            let why = format!("{e:#}")
                .lines()
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ");
            let message = if mentions_a_limit(&why) {
                format!(
                    "the {what} is over the structured-output automaton's limits ({}): {why}",
                    limits(self.factory.limits())
                )
            } else {
                format!("invalid {what}: {why}")
            };
            ApiError::invalid_param(param, message)
        })?;
        Ok(GrammarConstraint {
            matcher: Matcher::new(Ok(parser)),
        })
    }
}

/// Whether llguidance's error is about its limits (grammar size, lexer fuel, states, items).
fn mentions_a_limit(why: &str) -> bool {
    let why = why.to_lowercase();
    ["limit", "fuel", "too many", "too large", "max_"]
        .iter()
        .any(|k| why.contains(k))
}

fn limits(l: &ParserLimits) -> String {
    format!(
        "grammar size {}, lexer states {}, initial lexer fuel {}, lexer fuel per token {}, parser items per token {}",
        l.max_grammar_size, l.max_lexer_states, l.initial_lexer_fuel, l.step_lexer_fuel, l.step_max_items
    )
}

/// One reply's automaton.
pub struct GrammarConstraint {
    matcher: Matcher,
}

impl GrammarConstraint {
    /// An independent copy of the automaton in its current state (a request's choices each
    /// take one of the compiled, unstarted constraint instead of compiling it again).
    pub fn independent_copy(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
        }
    }
}

impl LogitsConstraint for GrammarConstraint {
    fn allowed(&mut self) -> Result<Vec<u32>> {
        // Once the document is complete only an end-of-sequence token is allowed.
        let mask = self.matcher.compute_mask_or_eos()?;
        Ok(mask.as_slice().to_vec())
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        self.matcher.consume_token(token)
    }
}
