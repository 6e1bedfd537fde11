//! What the unit tests share: the shipped tiny checkpoint (its mini Qwen3.5 tokenizer keeps
//! only the first 1984 BPE ranks, so CJK and emoji characters are split over several byte
//! tokens), and a text cut in pieces as a stream delivers it.

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

/// `text` in the pieces that the byte offsets `cuts` (ascending) make.
pub fn pieces<'a>(text: &'a str, cuts: &'a [usize]) -> impl Iterator<Item = &'a str> {
    let ends = cuts.iter().copied().chain([text.len()]);
    let starts = [0].into_iter().chain(cuts.iter().copied());
    starts.zip(ends).map(|(from, to)| &text[from..to])
}

pub fn tiny_template() -> ChatTemplate {
    ChatTemplate::from_dir(Path::new(TINY), None)
        .unwrap()
        .unwrap()
}
