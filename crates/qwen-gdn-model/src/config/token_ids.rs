//! The special token ids of a config file (`eos_token_id`, `bos_token_id`, `pad_token_id`):
//! each one id or a list of them, in config.json's top level, its `text_config` and
//! generation_config.json alike.

use anyhow::{bail, Result};
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// One token id or a list of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenIds(pub Vec<u64>);

impl TokenIds {
    pub fn first(&self) -> Option<u64> {
        self.0.first().copied()
    }
}

impl<'de> Deserialize<'de> for TokenIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct IdOrList;
        impl<'de> Visitor<'de> for IdOrList {
            type Value = TokenIds;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a token id or a list of them")
            }
            fn visit_u64<E>(self, id: u64) -> Result<TokenIds, E> {
                Ok(TokenIds(vec![id]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TokenIds, A::Error> {
                let mut ids = vec![];
                while let Some(id) = seq.next_element()? {
                    ids.push(id);
                }
                Ok(TokenIds(ids))
            }
        }
        d.deserialize_any(IdOrList)
    }
}

/// The special tokens of one object; the keys of the file that other structs read too.
#[derive(Debug, Default, Deserialize)]
pub struct SpecialTokens {
    pub eos_token_id: Option<TokenIds>,
    pub bos_token_id: Option<TokenIds>,
    pub pad_token_id: Option<TokenIds>,
}

impl SpecialTokens {
    /// Every id must be a token of the vocabulary: one past it would index past the
    /// embeddings, one past 2^32 would be wrapped into another token.
    pub fn validate(&self, origin: &str, vocab_size: usize) -> Result<()> {
        for (key, ids) in [
            ("eos_token_id", &self.eos_token_id),
            ("bos_token_id", &self.bos_token_id),
            ("pad_token_id", &self.pad_token_id),
        ] {
            for &id in ids.iter().flat_map(|ids| &ids.0) {
                if id >= vocab_size as u64 {
                    bail!("{origin}: `{key}` = {id} is not a token of the vocabulary (vocab_size = {vocab_size})");
                }
            }
        }
        Ok(())
    }

    /// `eos_token_id` as the engine keeps it (empty when absent); call after [`Self::validate`].
    pub fn eos(&self) -> Vec<u32> {
        let ids = self.eos_token_id.iter().flat_map(|ids| &ids.0);
        ids.map(|&id| id as u32).collect()
    }
}
