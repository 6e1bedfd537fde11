//! Which part of the model this process loads: all of it, one pipeline stage's layers (with
//! the embedding on the first stage and the final norm and output head on the last), or every
//! layer with only its share of each MoE block's experts (expert parallel).

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
    /// Every layer and both ends, and of each MoE block only the experts `share` (global
    /// expert indices; an expert-parallel rank's, `expert_parallel.rs`). The other experts'
    /// bytes are never read: stacked expert tensors are read for the share's rows only, and
    /// one-tensor-per-expert checkpoints drop the other experts' tensors from view.
    Experts { share: Range<usize> },
}

impl ModelPart {
    /// The decoder layers held, out of `num_layers`.
    pub fn layers(&self, num_layers: usize) -> Range<usize> {
        match self {
            Self::Whole | Self::Experts { .. } => 0..num_layers,
            Self::Stage { layers, .. } => layers.clone(),
        }
    }

    /// Holds the token embedding (it embeds the tokens of a forward call).
    pub fn embeds(&self) -> bool {
        matches!(
            self,
            Self::Whole | Self::Experts { .. } | Self::Stage { first: true, .. }
        )
    }

    /// Holds the final norm and the output head (it computes logits).
    pub fn has_head(&self) -> bool {
        matches!(
            self,
            Self::Whole | Self::Experts { .. } | Self::Stage { last: true, .. }
        )
    }

    /// Whether the tensor of canonical name `name` belongs to this part. `tied`: the output
    /// head is the embedding table (config.json's `tie_word_embeddings`).
    pub fn owns(&self, name: &str, tied: bool) -> bool {
        let layers = match self {
            Self::Whole => return true,
            Self::Experts { share } => {
                return expert_index(name).is_none_or(|e| share.contains(&e));
            }
            Self::Stage { layers, .. } => layers,
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

    /// The experts of each MoE block this part holds, when it holds only some of them.
    pub fn expert_share(&self) -> Option<Range<usize>> {
        match self {
            Self::Experts { share } => Some(share.clone()),
            _ => None,
        }
    }

    /// Whether this part is one pipeline stage (which splits the layers).
    pub fn is_stage(&self) -> bool {
        matches!(self, Self::Stage { .. })
    }
}

/// The expert index of a one-tensor-per-expert weight (`...mlp.experts.7.gate_proj.weight`);
/// `None` for any other tensor, stacked experts included.
fn expert_index(name: &str) -> Option<usize> {
    let (_, rest) = name.split_once(".experts.")?;
    rest.split('.').next()?.parse().ok()
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

    #[test]
    fn an_expert_share_owns_every_layer_but_only_its_own_experts() {
        let share = ModelPart::Experts { share: 2..4 };
        assert_eq!(share.layers(6), 0..6);
        assert!(share.embeds() && share.has_head() && !share.is_stage());
        assert_eq!(share.expert_share(), Some(2..4));
        assert!(share.owns("model.layers.5.mlp.experts.2.gate_proj.weight", false));
        assert!(share.owns("model.layers.5.mlp.experts.3.down_proj.scales", false));
        assert!(!share.owns("model.layers.5.mlp.experts.4.up_proj.weight", false));
        assert!(!share.owns("model.layers.0.mlp.experts.1.up_proj.weight", false));
        // Stacked stacks, fused gate-and-up stacks and everything else: read in part or whole.
        assert!(share.owns("model.layers.5.mlp.switch_mlp.gate_proj.weight", false));
        assert!(share.owns("model.layers.5.mlp.experts.gate_up_proj", false));
        assert!(share.owns("model.layers.5.mlp.shared_expert.up_proj.weight", false));
        assert!(share.owns("model.embed_tokens.weight", false));
        assert_eq!(ModelPart::Whole.expert_share(), None);
    }
}
