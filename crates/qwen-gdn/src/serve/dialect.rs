//! Which API a request speaks, told by its path, and so in which shape its errors are
//! answered: OpenAI's `{"error": {...}}`, Anthropic's `{"type": "error", "error": {...}}`, or
//! Ollama's `{"error": "..."}`. Every error the server makes is an [`ApiError`]; only its last
//! step, the body, differs between the APIs.

use super::error::ApiError;
use axum::response::{IntoResponse, Response};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
    Ollama,
}

/// The message of an error response, left in its extensions for the request log.
#[derive(Clone, Debug)]
pub struct ErrorMessage(pub String);

impl Dialect {
    pub fn of_path(path: &str) -> Self {
        if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            Self::Anthropic
        } else if path.starts_with("/api/") {
            Self::Ollama
        } else {
            Self::OpenAi
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
            Self::Ollama => "ollama",
        }
    }

    pub fn error(self, e: ApiError) -> Response {
        let message = e.message.clone();
        let mut response = match self {
            Self::OpenAi => e.into_response(),
            Self::Anthropic => super::anthropic::error::error_response(&e),
            Self::Ollama => super::ollama::error::error_response(&e),
        };
        response.extensions_mut().insert(ErrorMessage(message));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_pick_the_api() {
        assert_eq!(Dialect::of_path("/v1/messages"), Dialect::Anthropic);
        assert_eq!(
            Dialect::of_path("/v1/messages/count_tokens"),
            Dialect::Anthropic
        );
        assert_eq!(Dialect::of_path("/v1/messagesx"), Dialect::OpenAi);
        assert_eq!(Dialect::of_path("/api/chat"), Dialect::Ollama);
        assert_eq!(Dialect::of_path("/v1/chat/completions"), Dialect::OpenAi);
        assert_eq!(Dialect::of_path("/metrics"), Dialect::OpenAi);
    }
}
