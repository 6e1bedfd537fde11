//! Finding markup tags (`<think>`, `<tool_call>`, ...) in text that arrives in pieces.
//!
//! A streaming parser must hold back the end of its buffer only while it could still become a
//! tag: `"Hello <tool_"` can be followed by `"call>"`, so `"<tool_"` waits and `"Hello "` goes out.

/// Where the tail of `text` that is a proper prefix of `tag` starts (`text.len()` when no tail
/// could grow into `tag`). Tags start with an ASCII `<`, so the index is a char boundary.
pub fn held_tag_start(text: &str, tag: &str) -> usize {
    let bytes = text.as_bytes();
    let first = tag.as_bytes()[0];
    // Only the last tag.len() - 1 bytes can hold a proper prefix of tag.
    let earliest = bytes.len().saturating_sub(tag.len() - 1);
    (earliest..bytes.len())
        .find(|&i| bytes[i] == first && tag.as_bytes().starts_with(&bytes[i..]))
        .unwrap_or(bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_only_a_possible_tag_start() {
        assert_eq!(held_tag_start("Hello <tool_", "<tool_call>"), 6);
        assert_eq!(held_tag_start("Hello <", "<tool_call>"), 6);
        assert_eq!(held_tag_start("Hello <tool_x", "<tool_call>"), 13);
        assert_eq!(held_tag_start("a <b", "<tool_call>"), 4);
        // A complete tag is not a *proper* prefix: finding it is the caller's job.
        assert_eq!(held_tag_start("<think>", "<think>"), 7);
        assert_eq!(held_tag_start("", "<think>"), 0);
        assert_eq!(held_tag_start("é<", "</think>"), "é".len());
        assert_eq!(held_tag_start("<</", "</think>"), 1);
    }
}
