//! The chat-template flags shared by `generate` and `chat`, and the template variables they
//! give.

use crate::load::Checkpoint;
use crate::text::chat_template::RESERVED_VARIABLES;
use crate::text::special_tokens::special_tokens;
use serde_json::{Map, Value as Json};

#[derive(clap::Args, Debug, Clone)]
pub struct TemplateArgs {
    /// System message placed before the prompt (with a chat template)
    #[arg(long)]
    pub system_prompt: Option<String>,
    /// Feed the prompt as raw text instead of through the model's chat template
    #[arg(long)]
    pub ignore_chat_template: bool,
    /// Passed to the chat template as `enable_thinking` [default: true when the vocabulary
    /// has <think>]
    #[arg(long, value_name = "true|false", value_parser = clap::value_parser!(bool))]
    pub enable_thinking: Option<bool>,
    /// Extra chat-template variables as a JSON object, e.g. '{"enable_thinking": false}'
    #[arg(long, alias = "chat-template-config", value_name = "JSON", value_parser = template_args)]
    pub chat_template_args: Option<Map<String, Json>>,
}

impl TemplateArgs {
    /// The variables the template is rendered with besides the messages: the special tokens,
    /// `enable_thinking` (on when the vocabulary has think tags, as mlx-lm does), then
    /// --chat-template-args and --enable-thinking.
    pub fn vars(&self, checkpoint: &Checkpoint) -> Map<String, Json> {
        let tokenizer = &checkpoint.tokenizer;
        let mut vars = special_tokens(checkpoint.tokenizer_config.as_ref());
        if tokenizer.token_to_id("<think>").is_some() && tokenizer.token_to_id("</think>").is_some()
        {
            vars.insert("enable_thinking".into(), true.into());
        }
        vars.extend(self.chat_template_args.clone().unwrap_or_default());
        if let Some(on) = self.enable_thinking {
            vars.insert("enable_thinking".into(), on.into());
        }
        vars
    }
}

/// `--chat-template-args`: a JSON object that leaves the variables we fill in alone.
fn template_args(s: &str) -> Result<Map<String, Json>, String> {
    match serde_json::from_str(s) {
        Ok(Json::Object(map)) => match RESERVED_VARIABLES.iter().find(|k| map.contains_key(**k)) {
            Some(key) => Err(format!(
                "`{key}` is set by qwen-gdn (from --prompt and --system-prompt) and cannot be overridden"
            )),
            None => Ok(map),
        },
        Ok(_) => Err("expected a JSON object".into()),
        Err(e) => Err(format!("invalid JSON: {e}")),
    }
}
