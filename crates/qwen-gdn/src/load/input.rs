//! Prompt and text inputs, bounded by what the model's context can hold.
//!
//! No tokenizer token stands for more input bytes than its own spelling takes (a byte-level
//! token spells each byte as one character of one or two UTF-8 bytes); normalization can
//! shrink text, at most [`NORMALIZATION_SLACK`]-fold. So an input longer than
//! `max_position_embeddings × longest token × slack` bytes cannot fit, and reading stops
//! there (`/dev/zero` as a prompt file ends with an error, not with the memory). Within that
//! bound, [`InputLimit::check_tokens`] counts tokens piece by piece and stops as soon as the
//! count passes the context, so a long input costs about one context's worth of tokenizing.

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::Path;
use tokenizers::Tokenizer;

/// How many times fewer bytes a text may take after the tokenizer's normalization (NFC
/// composes a Hangul syllable from three jamo: 9 bytes to 3).
pub const NORMALIZATION_SLACK: u64 = 4;

/// Bytes tokenized at a time by [`InputLimit::check_tokens`].
const PIECE_BYTES: usize = 64 << 10;

/// The most an input may hold for a model.
pub struct InputLimit {
    pub max_tokens: usize,
    pub max_bytes: u64,
    /// config.json, named in errors.
    pub config: String,
}

impl InputLimit {
    pub fn new(tokenizer: &Tokenizer, max_tokens: usize, config: &Path) -> Self {
        let longest = tokenizer
            .get_vocab(true)
            .keys()
            .map(|t| t.len() as u64)
            .max()
            .unwrap_or(1)
            .max(1);
        Self {
            max_tokens,
            max_bytes: (max_tokens as u64)
                .saturating_mul(longest)
                .saturating_mul(NORMALIZATION_SLACK),
            config: config.display().to_string(),
        }
    }

    /// The error for `what` (named in it), too long for the context by `detail`.
    pub fn too_long(&self, what: &str, detail: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "{what} is {detail}, more than the context holds: max_position_embeddings = {} in {}",
            self.max_tokens,
            self.config
        )
    }

    /// Errors when `text` has more tokens than the context holds, tokenizing at most about
    /// that many. Pieces are cut before a whitespace that follows a non-whitespace, where
    /// GPT-style pre-tokenizers cut too, so their counts add up to the whole text's; one
    /// token per cut is allowed for tokenizers where they do not. The exact count comes from
    /// the full encoding afterwards.
    pub fn check_tokens(&self, tokenizer: &Tokenizer, text: &str, what: &str) -> Result<()> {
        let (mut count, mut cuts, mut rest) = (0usize, 0usize, text);
        while !rest.is_empty() {
            let piece = next_piece(rest);
            rest = &rest[piece.len()..];
            let tokens = tokenizer
                .encode_fast(piece, false)
                .map_err(|e| anyhow::anyhow!("tokenizing {what}: {e}"))?;
            count += tokens.len();
            if count > self.max_tokens + cuts {
                let detail = format!("over {} tokens (counted so far)", self.max_tokens);
                return Err(self.too_long(what, &detail));
            }
            cuts += 1;
        }
        Ok(())
    }

    /// Errors unless `n` tokens fit the context.
    pub fn check_fits(&self, n: usize, what: &str) -> Result<()> {
        if n > self.max_tokens {
            return Err(self.too_long(what, &format!("{n} tokens")));
        }
        Ok(())
    }

    /// The text of `--flag` (`-` = stdin) or of `--flag-file`, with a name for it in errors.
    /// Blank input and input past [`InputLimit::max_bytes`] are errors.
    pub fn read(
        &self,
        text: Option<&str>,
        file: Option<&Path>,
        flag: &str,
    ) -> Result<(String, String)> {
        let (bytes, what) = match (text, file) {
            (Some("-"), _) => {
                let what = format!("{flag} from stdin");
                let bytes = self.read_bounded(std::io::stdin().lock(), &what)?;
                (bytes, what)
            }
            (Some(t), _) => (t.as_bytes().to_vec(), flag.to_string()),
            (None, Some(f)) => {
                let what = format!("{flag}-file {}", f.display());
                let file = std::fs::File::open(f).with_context(|| format!("cannot read {what}"))?;
                (self.read_bounded(file, &what)?, what)
            }
            (None, None) => bail!("pass {flag} or {flag}-file"),
        };
        if bytes.len() as u64 > self.max_bytes {
            return Err(self.too_long(&what, &format!("more than {} bytes", self.max_bytes)));
        }
        let body = String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{what} is not UTF-8"))?;
        if body.trim().is_empty() {
            bail!("{what} is empty");
        }
        Ok((body, what))
    }

    /// Up to one byte more than the limit, so that "at the limit" and "past it" differ.
    fn read_bounded(&self, source: impl Read, what: &str) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        source
            .take(self.max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read {what}"))?;
        Ok(bytes)
    }
}

/// The first piece of `text`: about [`PIECE_BYTES`], cut before a whitespace character that
/// follows a non-whitespace one (or, in a text without such a place, at a character boundary).
fn next_piece(text: &str) -> &str {
    if text.len() <= PIECE_BYTES {
        return text;
    }
    let mut end = PIECE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let head = &text[..end];
    let mut prev_is_space = true;
    let mut cut = None;
    for (i, c) in head.char_indices() {
        if c.is_whitespace() && !prev_is_space && i > 0 {
            cut = Some(i);
        }
        prev_is_space = c.is_whitespace();
    }
    &text[..cut.unwrap_or(end)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::tiny_tokenizer;

    #[test]
    fn pieces_cut_before_whitespace_and_cover_the_text() {
        let text = "word ".repeat(50_000);
        let mut rest = text.as_str();
        let mut joined = String::new();
        while !rest.is_empty() {
            let piece = next_piece(rest);
            assert!(piece.len() <= PIECE_BYTES && !piece.is_empty());
            rest = &rest[piece.len()..];
            assert!(rest.is_empty() || rest.starts_with(' '), "{:?}", &rest[..8]);
            joined.push_str(piece);
        }
        assert_eq!(joined, text);
        let cjk = "世".repeat(100_000);
        assert!(next_piece(&cjk).len() <= PIECE_BYTES);
    }

    #[test]
    fn piecewise_count_matches_the_whole_text() {
        let tok = tiny_tokenizer();
        let text = "Hello there, how are you?\n  Fine. 世界 🦀 ".repeat(5_000);
        let whole = tok.encode(text.as_str(), false).unwrap().len();
        let limit = InputLimit {
            max_tokens: whole,
            max_bytes: u64::MAX,
            config: "config.json".into(),
        };
        limit.check_tokens(&tok, &text, "--text").unwrap();
        let limit = InputLimit {
            max_tokens: whole - 20,
            ..limit
        };
        let err = limit.check_tokens(&tok, &text, "--text").unwrap_err();
        assert!(
            format!("{err}").contains("max_position_embeddings"),
            "{err}"
        );
    }
}
