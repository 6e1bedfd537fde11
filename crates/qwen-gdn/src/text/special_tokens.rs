//! The special tokens a tokenizer_config.json names, which every chat template is given (the
//! engine also reads its end-of-sequence token from them).

use serde_json::{Map, Value as Json};

/// bos_token, eos_token, ... of tokenizer_config.json, which transformers passes to templates.
pub fn special_tokens(tokenizer_config: Option<&Json>) -> Map<String, Json> {
    let mut vars = Map::new();
    for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
        let value = tokenizer_config.and_then(|c| c.get(key));
        // Older files store {"content": "<s>", ...} instead of the string.
        if let Some(s) = value.and_then(|v| v.as_str().or_else(|| v.get("content")?.as_str())) {
            vars.insert(key.into(), s.into());
        }
    }
    vars
}
