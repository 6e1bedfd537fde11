//! Which part of the model this process loads: all of it, or one pipeline stage's layers
//! (with the embedding on the first stage and the final norm and output head on the last).

use std::ops::Range;

/// The part of the model a process holds. A stage reads only its own tensors from the
/// checkpoint: the others are dropped from its view at open, so that asking for one is an
/// error rather than a silent read (`Checkpoint::restrict_to`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ModelPart {
    #[default]
    Whole,
    /// Decoder layers `layers` (global indices); `first` adds the token embedding, `last` the
    /// final norm and the output head (a tied head reads the embedding table too).
    Stage {
        layers: Range<usize>,
        first: bool,
        last: bool,
    },
}

impl ModelPart {
    /// The decoder layers held, out of `num_layers`.
    pub fn layers(&self, num_layers: usize) -> Range<usize> {
        match self {
            Self::Whole => 0..num_layers,
            Self::Stage { layers, .. } => layers.clone(),
        }
    }

    /// Holds the token embedding (it embeds the tokens of a forward call).
    pub fn embeds(&self) -> bool {
        matches!(self, Self::Whole | Self::Stage { first: true, .. })
    }

    /// Holds the final norm and the output head (it computes logits).
    pub fn has_head(&self) -> bool {
        matches!(self, Self::Whole | Self::Stage { last: true, .. })
    }

    /// Whether the tensor of canonical name `name` belongs to this part. `tied`: the output
    /// head is the embedding table (config.json's `tie_word_embeddings`).
    pub fn owns(&self, name: &str, tied: bool) -> bool {
        let Self::Stage { layers, .. } = self else {
            return true;
        };
        if let Some(rest) = name.strip_prefix("model.layers.") {
            return rest
                .split('.')
                .next()
                .and_then(|i| i.parse::<usize>().ok())
                .is_some_and(|i| layers.contains(&i));
        }
        if name.starts_with("model.embed_tokens.") {
            return self.embeds() || (tied && self.has_head());
        }
        if name.starts_with("model.norm.") || name.starts_with("lm_head.") {
            return self.has_head();
        }
        // Anything else (a family's extra tensors) is refused at load by the caller.
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_owns_its_layers_and_its_ends_only() {
        let middle = ModelPart::Stage {
            layers: 2..4,
            first: false,
            last: false,
        };
        assert!(middle.owns("model.layers.2.mlp.gate.weight", true));
        assert!(middle.owns("model.layers.3.input_layernorm.weight", false));
        assert!(!middle.owns("model.layers.4.input_layernorm.weight", false));
        assert!(!middle.owns("model.layers.1.input_layernorm.weight", false));
        assert!(!middle.owns("model.embed_tokens.weight", true));
        assert!(!middle.owns("model.norm.weight", true));
        let last = ModelPart::Stage {
            layers: 4..6,
            first: false,
            last: true,
        };
        assert!(last.owns("model.embed_tokens.weight", true));
        assert!(!last.owns("model.embed_tokens.weight", false));
        assert!(last.owns("lm_head.weight", false));
        assert!(last.owns("model.norm.weight", false));
        assert!(ModelPart::Whole.owns("anything", false));
    }
}
