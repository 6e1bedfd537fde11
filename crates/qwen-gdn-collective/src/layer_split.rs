//! Which layers each pipeline stage owns.

use anyhow::{ensure, Result};
use std::ops::Range;

/// One rank's part of a pipeline: a contiguous range of decoder layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub rank: usize,
    pub layers: Range<usize>,
}

/// Splits `num_layers` layers over `ranks` contiguous stages. Rule: every stage gets
/// `num_layers / ranks` layers and the first `num_layers % ranks` stages one more (the first
/// stages, because the last stage also runs the final norm and the output head). A split that
/// leaves a rank without a layer is refused.
pub fn split_layers(num_layers: usize, ranks: usize) -> Result<Vec<Stage>> {
    ensure!(ranks > 0, "a pipeline needs at least one rank");
    ensure!(
        ranks <= num_layers,
        "{ranks} ranks for {num_layers} layers would leave a rank without a layer (use at most {num_layers} ranks)"
    );
    let (base, extra) = (num_layers / ranks, num_layers % ranks);
    let mut start = 0;
    Ok((0..ranks)
        .map(|rank| {
            let len = base + usize::from(rank < extra);
            let stage = Stage {
                rank,
                layers: start..start + len,
            };
            start += len;
            stage
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_cover_every_layer_once_in_order() {
        for layers in 1..20 {
            for ranks in 1..=layers {
                let stages = split_layers(layers, ranks).unwrap();
                assert_eq!(stages.len(), ranks);
                assert_eq!(stages[0].layers.start, 0);
                assert_eq!(stages[ranks - 1].layers.end, layers);
                for pair in stages.windows(2) {
                    assert_eq!(pair[0].layers.end, pair[1].layers.start);
                    let (a, b) = (pair[0].layers.len(), pair[1].layers.len());
                    assert!(a == b || a == b + 1, "{layers} over {ranks}: {stages:?}");
                }
            }
        }
    }

    #[test]
    fn too_many_ranks_is_refused() {
        let err = split_layers(4, 5).unwrap_err().to_string();
        assert!(err.contains("without a layer"), "{err}");
    }
}
