//! Text in and out of the model: chat templates and the special tokens they are given, the
//! streaming detokenizer, the thinking split of a reply, markup tags in streamed text, and a
//! templated prompt cut around its user text.

pub mod chat_template;
pub mod prompt_split;
pub mod reasoning;
pub mod special_tokens;
pub mod stream;
pub mod tag_scan;
