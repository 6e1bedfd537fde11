//! Response bodies in OpenAI's shapes: chat.completion, chat.completion.chunk,
//! text_completion, usage.

use crate::serve::job::Usage;
use serde_json::{json, Value as Json};
use std::time::{SystemTime, UNIX_EPOCH};

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh id such as `chatcmpl-3f2a…`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

pub fn usage(u: &Usage) -> Json {
    let mut usage = json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    });
    if let Some(d) = &u.drafts {
        // OpenAI's names for predicted tokens that did and did not make it into the reply.
        usage["completion_tokens_details"] = json!({
            "accepted_prediction_tokens": d.accepted,
            "rejected_prediction_tokens": d.proposed - d.accepted,
        });
    }
    usage
}

/// Choice `index` of a whole chat completion; `message` holds role, content,
/// reasoning_content, tool_calls.
pub fn chat_choice(index: usize, message: Json, finish_reason: &str) -> Json {
    json!({"index": index, "message": message, "logprobs": null, "finish_reason": finish_reason})
}

/// Choice `index` of a text completion, whole or a streamed piece.
pub fn completion_choice(index: usize, text: &str, finish_reason: Option<&str>) -> Json {
    json!({"index": index, "text": text, "logprobs": null, "finish_reason": finish_reason})
}

/// Fields every response object of one request shares.
pub struct Header {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Header {
    pub fn new(prefix: &str, model: &str) -> Self {
        Self {
            id: new_id(prefix),
            created: unix_now(),
            model: model.to_string(),
        }
    }

    fn object(&self, object: &str, choices: Json) -> Json {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        })
    }

    /// A whole chat completion of `choices` ([`chat_choice`]).
    pub fn chat(&self, choices: Vec<Json>, u: &Usage) -> Json {
        let mut body = self.object("chat.completion", Json::Array(choices));
        body["usage"] = usage(u);
        body
    }

    /// One streamed chat chunk, of choice `index`.
    pub fn chat_chunk(&self, index: usize, delta: Json, finish_reason: Option<&str>) -> Json {
        self.object(
            "chat.completion.chunk",
            json!([{"index": index, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]),
        )
    }

    /// A whole text completion of `choices` ([`completion_choice`]), or (with `usage` None)
    /// one streamed piece of one.
    pub fn completion(&self, choices: Vec<Json>, u: Option<&Usage>) -> Json {
        let mut body = self.object("text_completion", Json::Array(choices));
        if let Some(u) = u {
            body["usage"] = usage(u);
        }
        body
    }

    /// The last streamed chunk when stream_options.include_usage is set: no choices, the usage.
    pub fn usage_chunk(&self, object: &str, u: &Usage) -> Json {
        let mut body = self.object(object, json!([]));
        body["usage"] = usage(u);
        body
    }
}
