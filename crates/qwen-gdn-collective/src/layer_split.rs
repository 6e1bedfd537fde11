//! Which layers each pipeline stage owns, and which experts each rank of an expert-parallel
//! plan owns: one rule for both.

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
    Ok(split_contiguous(num_layers, ranks, "layers", "a layer")?
        .into_iter()
        .enumerate()
        .map(|(rank, layers)| Stage { rank, layers })
        .collect())
}

/// Splits `num_experts` experts of every MoE layer over `ranks` (an expert-parallel plan),
/// by the pipeline's rule: contiguous, `num_experts / ranks` each and the first
/// `num_experts % ranks` ranks one more; a rank left without an expert is refused.
pub fn split_experts(num_experts: usize, ranks: usize) -> Result<Vec<Range<usize>>> {
    ensure!(ranks > 0, "an expert-parallel plan needs at least one rank");
    split_contiguous(num_experts, ranks, "experts", "an expert")
}

/// Splits a mixer's `heads` output heads over `ranks` (a tensor-parallel plan), by the same
/// rule; a rank left without a head is refused.
pub fn split_heads(heads: usize, ranks: usize) -> Result<Vec<Range<usize>>> {
    ensure!(ranks > 0, "a tensor-parallel plan needs at least one rank");
    split_contiguous(heads, ranks, "heads", "a head")
}

/// `n` items over `ranks` contiguous ranges, the first `n % ranks` one longer.
fn split_contiguous(n: usize, ranks: usize, items: &str, one: &str) -> Result<Vec<Range<usize>>> {
    ensure!(
        ranks <= n,
        "{ranks} ranks for {n} {items} would leave a rank without {one} (use at most {n} ranks)"
    );
    let (base, extra) = (n / ranks, n % ranks);
    let mut start = 0;
    Ok((0..ranks)
        .map(|rank| {
            let len = base + usize::from(rank < extra);
            start += len;
            start - len..start
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
    fn experts_split_like_layers() {
        assert_eq!(split_experts(8, 3).unwrap(), vec![0..3, 3..6, 6..8]);
        assert_eq!(split_experts(4, 2).unwrap(), vec![0..2, 2..4]);
        let err = split_experts(2, 3).unwrap_err().to_string();
        assert!(err.contains("without an expert"), "{err}");
    }

    #[test]
    fn too_many_ranks_is_refused() {
        let err = split_layers(4, 5).unwrap_err().to_string();
        assert!(err.contains("without a layer"), "{err}");
    }
}
