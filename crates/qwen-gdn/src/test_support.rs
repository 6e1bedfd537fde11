//! The shipped tiny checkpoint the unit tests read. Its mini Qwen3.5 tokenizer keeps only the
//! first 1984 BPE ranks, so CJK and emoji characters are split over several byte tokens.

use crate::text::chat_template::ChatTemplate;
use std::path::Path;
use tokenizers::Tokenizer;

pub const TINY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../models/qwen3.5-tiny-4bit"
);

pub fn tiny_tokenizer() -> Tokenizer {
    Tokenizer::from_file(Path::new(TINY).join("tokenizer.json")).unwrap()
}

pub fn tiny_template() -> ChatTemplate {
    ChatTemplate::from_dir(Path::new(TINY), None)
        .unwrap()
        .unwrap()
}
