//! Streaming detokenizer. A byte-level BPE token can hold part of a UTF-8 character (emoji, CJK),
//! so decoding token by token prints U+FFFD garbage. This keeps a small window of tokens and
//! emits only text that a full decode would also produce: the concatenated output equals
//! `decode(all ids)`. The stream does not hold the tokenizer (a server keeps one stream per
//! running request beside the model that owns it): each call is given it.

use anyhow::Result;
use tokenizers::Tokenizer;

#[derive(Default)]
pub struct TokenStream {
    ids: Vec<u32>,
    /// Start of the window that is decoded again for context (a decoder may treat the first
    /// token specially, e.g. strip a leading space).
    prefix: usize,
    /// Tokens before this index have been emitted.
    read: usize,
}

impl TokenStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a token; returns the text it completes, if any.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let (done, text) = self.pending(tokenizer)?;
        // A trailing U+FFFD is a character still missing its continuation bytes: wait for them.
        if text.len() > done.len() && !text.ends_with('\u{FFFD}') {
            self.prefix = self.read;
            self.read = self.ids.len();
            return Ok(Some(text[done.len()..].to_string()));
        }
        Ok(None)
    }

    /// Whatever is still held back (an incomplete character at the very end).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let (done, text) = self.pending(tokenizer)?;
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        Ok(text.get(done.len()..).unwrap_or_default().to_string())
    }

    /// (already emitted part of the window, whole window), decoded.
    fn pending(&self, tokenizer: &Tokenizer) -> Result<(String, String)> {
        let decode = |ids: &[u32]| tokenizer.decode(ids, false).map_err(anyhow::Error::msg);
        let done = decode(&self.ids[self.prefix..self.read])?;
        let text = decode(&self.ids[self.prefix..])?;
        // A decoder that rewrites earlier text would make the difference meaningless; decode
        // everything and take the unseen tail instead (rare; costs one full decode).
        if !text.starts_with(&done) {
            let emitted = decode(&self.ids[..self.read])?;
            let all = decode(&self.ids)?;
            let cut = (0..=emitted.len().min(all.len()))
                .rev()
                .find(|&i| all.is_char_boundary(i))
                .unwrap_or(0);
            return Ok((all[..cut].to_string(), all));
        }
        Ok((done, text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::tiny_tokenizer;

    #[test]
    fn multibyte_characters_are_never_split() {
        let tok = tiny_tokenizer();
        let text = "Hello 世界! 🦀🎨 naïve — «ok» 你好吗？";
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        // The test only means something if some token is a fragment of a character.
        assert!(ids
            .iter()
            .any(|&id| tok.decode(&[id], false).unwrap().contains('\u{FFFD}')));
        let mut stream = TokenStream::new();
        let mut out = String::new();
        for &id in &ids {
            if let Some(piece) = stream.push(&tok, id).unwrap() {
                assert!(!piece.contains('\u{FFFD}'), "{piece:?}");
                out.push_str(&piece);
            }
        }
        out.push_str(&stream.finish(&tok).unwrap());
        assert_eq!(out, text);
    }

    #[test]
    fn output_equals_full_decode_for_any_ids() {
        // Random-model output: lone continuation bytes, special tokens, ids without a token.
        let tok = tiny_tokenizer();
        let ids = [
            1573, 1255, 162, 2047, 1459, 1924, 1932, 7, 896, 1997, 1986, 230, 129, 1381, 98,
        ];
        let mut stream = TokenStream::new();
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&stream.push(&tok, id).unwrap().unwrap_or_default());
        }
        out.push_str(&stream.finish(&tok).unwrap());
        assert_eq!(out, tok.decode(&ids, false).unwrap());
    }
}
