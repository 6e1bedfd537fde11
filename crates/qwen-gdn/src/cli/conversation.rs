//! The messages of a `chat` session, as the chat template and OpenAI's API take them.

use anyhow::Result;
use serde_json::{json, Value as Json};
use std::path::Path;

pub struct Conversation {
    system: Option<String>,
    messages: Vec<Json>,
}

impl Conversation {
    pub fn new(system: Option<String>) -> Self {
        let mut conversation = Self {
            system,
            messages: Vec::new(),
        };
        conversation.reset();
        conversation
    }

    /// Back to the system prompt alone.
    pub fn reset(&mut self) {
        self.messages.clear();
        if let Some(system) = &self.system {
            self.messages
                .push(json!({"role": "system", "content": system}));
        }
    }

    pub fn messages(&self) -> &[Json] {
        &self.messages
    }

    pub fn push_user(&mut self, text: &str) {
        self.messages.push(json!({"role": "user", "content": text}));
    }

    /// The reply as the model wrote it, thinking included: the chat template decides what
    /// later turns see of it (Qwen3.5's drops the thinking of earlier turns).
    pub fn push_assistant(&mut self, text: &str) {
        self.messages
            .push(json!({"role": "assistant", "content": text}));
    }

    /// Drops the last message (a user turn whose reply failed).
    pub fn pop(&mut self) {
        let keep = usize::from(self.system.is_some());
        if self.messages.len() > keep {
            self.messages.pop();
        }
    }

    /// Writes the messages as a JSON list to a new file `path`; an existing file (or link) is
    /// left untouched and is an error.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut text = serde_json::to_string_pretty(&self.messages)?;
        text.push('\n');
        // Never over an existing file, and never a partial file when the write fails.
        crate::atomic_file::write_new(path, text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_keeps_the_system_prompt_and_save_never_overwrites() {
        let mut c = Conversation::new(Some("be brief".into()));
        c.push_user("hi");
        c.push_assistant("hello");
        assert_eq!(c.messages().len(), 3);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chat.json");
        c.save(&path).unwrap();
        let saved: Json = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(saved, Json::Array(c.messages().to_vec()));
        assert_eq!(saved[2]["role"], "assistant");

        c.reset();
        assert_eq!(
            c.messages(),
            [json!({"role": "system", "content": "be brief"})]
        );
        let err = c.save(&path).unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
        // The first save is intact.
        let again: Json = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(again, saved);

        c.pop();
        assert_eq!(c.messages().len(), 1, "the system prompt is never popped");
        let mut bare = Conversation::new(None);
        bare.reset();
        assert!(bare.messages().is_empty());
    }
}
