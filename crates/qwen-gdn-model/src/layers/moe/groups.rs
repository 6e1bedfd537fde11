//! A prefill chunk's (token, slot) pairs of a MoE layer grouped by expert, so that an expert
//! chosen by many of the chunk's tokens reads its weights once for all of them instead of
//! once per pair.
//!
//! The expert ids are read back to the host once (one sync per MoE layer of a prefill chunk)
//! to form the groups; the activations never leave the device. Pairs are put in the order
//! the products compute them ([`ExpertGroups::gather`]), each group's product runs on its
//! rows ([`ExpertGroups::products`]), and the results are put back in pair order
//! ([`ExpertGroups::scatter`]): a permutation, so every pair's value lands in exactly one
//! place and the weighted sum over a token's slots runs in slot order, as with the per-pair
//! products — the result does not depend on how the pairs were grouped.

use crate::candle_ops::{cat, index_select};
use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use gdn_ops::ops::moe_combine;

/// One expert's pairs: rows `start .. start + len` of the grouped order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub expert: usize,
    pub start: usize,
    pub len: usize,
}

/// The grouped order of a chunk's pairs, and the index tensors that move rows into and out
/// of it on the device.
#[derive(Debug)]
pub struct ExpertGroups {
    /// Slots per token.
    slots: usize,
    /// Experts the ids may name.
    experts: usize,
    /// Pair indices `t·slots + s` in grouped order: first the *loose* pairs (those of experts
    /// chosen fewer than `min_tokens` times, in pair order), then each grouped expert's
    /// pairs (experts ascending, pairs ascending within an expert).
    order: Vec<u32>,
    /// How many leading entries of `order` are loose.
    loose: usize,
    groups: Vec<Group>,
    /// Device copies: the token row each grouped position reads, `[P]`; the grouped
    /// position of each pair, `[P]`; the loose pairs' expert ids, `[loose, 1]`.
    source_rows: Tensor,
    positions: Tensor,
    loose_ids: Option<Tensor>,
}

/// The grouped order of pairs with expert ids `ids` (`t·slots + s` → expert).
fn grouped_order(
    ids: &[u32],
    experts: usize,
    min_tokens: usize,
) -> Result<(Vec<u32>, usize, Vec<Group>)> {
    let mut counts = vec![0usize; experts];
    for &id in ids {
        match counts.get_mut(id as usize) {
            Some(c) => *c += 1,
            None => bail!("expert id {id} is outside the {experts} experts"),
        }
    }
    let own_product = |e: u32| counts[e as usize] >= min_tokens.max(1);
    // A counting sort (one pass to place, as a prefill chunk has ~10⁴ pairs and a MoE layer
    // waits for this on the host): the loose pairs first, then each grouped expert's, experts
    // ascending; pairs keep their order within each.
    let loose = ids.iter().filter(|&&e| !own_product(e)).count();
    let mut next = vec![0usize; experts];
    let mut groups = vec![];
    let mut start = loose;
    for (expert, &len) in counts.iter().enumerate() {
        if len > 0 && own_product(expert as u32) {
            next[expert] = start;
            groups.push(Group { expert, start, len });
            start += len;
        }
    }
    let mut order = vec![0u32; ids.len()];
    let mut next_loose = 0;
    for (p, &e) in ids.iter().enumerate() {
        let at = if own_product(e) {
            &mut next[e as usize]
        } else {
            &mut next_loose
        };
        order[*at] = p as u32;
        *at += 1;
    }
    Ok((order, loose, groups))
}

impl ExpertGroups {
    /// Groups pairs by expert from ids `[N, slots]` u32 (read back to the host). Experts
    /// chosen by at least `min_tokens` pairs get a product of their own; the others' pairs
    /// stay loose (one gathered per-pair product for all of them).
    pub fn read(ids: &Tensor, experts: usize, min_tokens: usize) -> Result<Self> {
        let (_, slots) = ids.dims2()?;
        let host: Vec<u32> = gdn_ops::launches::read_back(ids.flatten_all()?.to_vec1())?;
        Self::new(&host, slots, experts, min_tokens, ids.device())
    }

    /// As [`Self::read`], from the ids on the host.
    pub fn new(
        ids: &[u32],
        slots: usize,
        experts: usize,
        min_tokens: usize,
        device: &Device,
    ) -> Result<Self> {
        let (order, loose, groups) = grouped_order(ids, experts, min_tokens)?;
        let slots = slots.max(1);
        let source: Vec<u32> = order.iter().map(|&p| p / slots as u32).collect();
        let mut positions = vec![0u32; order.len()];
        for (i, &p) in order.iter().enumerate() {
            positions[p as usize] = i as u32;
        }
        let loose_ids = (loose > 0)
            .then(|| -> Result<Tensor> {
                let picked: Vec<u32> = order[..loose].iter().map(|&p| ids[p as usize]).collect();
                Ok(Tensor::from_vec(picked, (loose, 1), device)?)
            })
            .transpose()?;
        Ok(Self {
            slots,
            experts,
            source_rows: Tensor::from_vec(source, order.len(), device)?,
            positions: Tensor::from_vec(positions, order.len(), device)?,
            order,
            loose,
            groups,
            loose_ids,
        })
    }

    /// The experts with a product of their own.
    pub fn groups(&self) -> &[Group] {
        &self.groups
    }

    /// How many pairs stay loose.
    pub fn loose(&self) -> usize {
        self.loose
    }

    /// Where each expert's rows lie in the grouped order: `experts + 1` entries, expert `e`'s
    /// rows being `offsets[e] .. offsets[e + 1]` (empty for an expert without pairs), the form
    /// [`AffineTensor::grouped_matmul_t`] takes. Only for groups without loose pairs
    /// (`min_tokens` 1), whose grouped order is every pair sorted by expert.
    ///
    /// [`AffineTensor::grouped_matmul_t`]: gdn_ops::ops::affine::AffineTensor::grouped_matmul_t
    pub fn offsets(&self) -> Result<Vec<u32>> {
        if self.loose > 0 {
            bail!(
                "expert offsets of groups with {} loose pairs: group with min_tokens 1",
                self.loose
            );
        }
        let mut offsets = vec![0u32; self.experts + 1];
        for g in &self.groups {
            offsets[g.expert + 1] = g.len as u32;
        }
        for e in 0..self.experts {
            offsets[e + 1] += offsets[e];
        }
        Ok(offsets)
    }

    /// Pair indices in grouped order.
    pub fn order(&self) -> &[u32] {
        &self.order
    }

    /// Token rows `x` `[N, cols]` → one row per pair, in grouped order: `[P, cols]`.
    pub fn gather(&self, x: &Tensor) -> Result<Tensor> {
        index_select(x, &self.source_rows, 0)
    }

    /// Rows in grouped order `x` `[P, cols]` → `[P, out]`, grouped order kept: `loose` runs
    /// once over the loose rows with their expert ids `[loose, 1]`, `grouped` once per
    /// grouped expert over its rows.
    pub fn products(
        &self,
        x: &Tensor,
        loose: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor>,
        mut grouped: impl FnMut(usize, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let mut parts = Vec::with_capacity(self.groups.len() + 1);
        if let Some(ids) = &self.loose_ids {
            parts.push(loose(&x.narrow(0, 0, self.loose)?, ids)?);
        }
        for g in &self.groups {
            parts.push(grouped(g.expert, &x.narrow(0, g.start, g.len)?)?);
        }
        match parts.len() {
            0 => bail!("grouped expert products of no pairs"),
            1 => Ok(parts.pop().expect("one part")),
            _ => cat(&parts, 0),
        }
    }

    /// Rows in grouped order `[P, cols]` → pair order `[P, cols]` (row `t·slots + s`).
    pub fn scatter(&self, y: &Tensor) -> Result<Tensor> {
        index_select(y, &self.positions, 0)
    }

    /// Slots per token.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The weighted sum over each token's slots of rows in grouped order: `y` `[P, H]`,
    /// `weights` `[N, slots]` f32 → `[N, H]` in `y`'s dtype. On a GPU one kernel reads each
    /// row where it lies (`moe_combine_rows`); on the CPU, the reference, the rows are put
    /// back in pair order ([`Self::scatter`]) and summed with candle ops.
    pub fn weighted_sum(&self, y: &Tensor, weights: &Tensor) -> Result<Tensor> {
        let (pairs, hidden) = y.dims2()?;
        let tokens = pairs / self.slots;
        if !y.device().is_cpu() && moe_combine::supports(self.slots, hidden, y.dtype()) {
            let rows = self.positions.reshape((tokens, self.slots))?;
            return moe_combine::moe_combine_rows(y, &rows, weights);
        }
        let in_pair_order = self.scatter(y)?.reshape((tokens, self.slots, hidden))?;
        super::weighted_sum(&in_pair_order, weights, y.dtype())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn groups(ids: &[u32], slots: usize, experts: usize, min: usize) -> ExpertGroups {
        ExpertGroups::new(ids, slots, experts, min, &Device::Cpu).unwrap()
    }

    #[test]
    fn groups_experts_in_order_and_leaves_small_ones_loose() {
        // 4 tokens × 2 slots; expert 1 unused, expert 3 chosen 3 times, 0 twice, 2 three times.
        let ids = [3u32, 0, 2, 3, 0, 2, 3, 2];
        let g = groups(&ids, 2, 4, 3);
        // Expert 0 (2 pairs) is loose: pairs 1 and 4, in pair order.
        assert_eq!(g.loose(), 2);
        assert_eq!(&g.order()[..2], &[1, 4]);
        assert_eq!(
            g.groups(),
            &[
                Group {
                    expert: 2,
                    start: 2,
                    len: 3
                },
                Group {
                    expert: 3,
                    start: 5,
                    len: 3
                }
            ]
        );
        assert_eq!(&g.order()[2..], &[2, 5, 7, 0, 3, 6]);
        // Every expert grouped, none loose, at min_tokens 1 (and 0).
        for min in [0, 1] {
            let all = groups(&ids, 2, 4, min);
            assert_eq!(all.loose(), 0);
            assert_eq!(
                all.groups().len(),
                3,
                "expert 1 has no pairs, so no product"
            );
        }
    }

    #[test]
    fn gather_then_scatter_is_the_identity_on_pairs() {
        let ids = [3u32, 0, 2, 3, 0, 2, 3, 2];
        let g = groups(&ids, 2, 4, 3);
        // Token t's row is [t, 10t]; gathered pair rows read their token.
        let x = Tensor::from_vec(
            (0..4).flat_map(|t| [t as f32, 10.0 * t as f32]).collect(),
            (4, 2),
            &Device::Cpu,
        )
        .unwrap();
        let rows: Vec<Vec<f32>> = g.gather(&x).unwrap().to_vec2().unwrap();
        for (row, &p) in rows.iter().zip(g.order()) {
            let t = (p / 2) as f32;
            assert_eq!(row, &[t, 10.0 * t]);
        }
        // A value per grouped row, scattered: pair p gets the value computed at its place.
        let y = Tensor::from_vec(
            g.order().iter().map(|&p| p as f32).collect::<Vec<_>>(),
            (8, 1),
            &Device::Cpu,
        )
        .unwrap();
        let back: Vec<f32> = g
            .scatter(&y)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(back, (0..8).map(|p| p as f32).collect::<Vec<_>>());
    }

    #[test]
    fn products_run_once_per_group_and_once_for_the_loose_pairs() {
        let ids = [3u32, 0, 2, 3, 0, 2, 3, 2];
        let g = groups(&ids, 2, 4, 3);
        let x = Tensor::zeros((8, 1), DType::F32, &Device::Cpu).unwrap();
        let mut seen = vec![];
        let y = g
            .products(
                &x,
                |rows, ids| {
                    assert_eq!(rows.dims(), [2, 1]);
                    assert_eq!(ids.to_vec2::<u32>().unwrap(), vec![vec![0], vec![0]]);
                    Ok((rows + 100.0)?)
                },
                |e, rows| {
                    seen.push((e, rows.dim(0)?));
                    Ok((rows + e as f64)?)
                },
            )
            .unwrap();
        assert_eq!(seen, vec![(2, 3), (3, 3)]);
        let y: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(y, vec![100.0, 100.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0]);
    }

    #[test]
    fn offsets_bound_each_experts_rows_in_the_grouped_order() {
        let ids = [3u32, 0, 2, 3, 0, 2, 3, 2];
        let g = groups(&ids, 2, 5, 1);
        // Expert 0: 2 pairs, 1: none, 2: 3, 3: 3, 4: none.
        assert_eq!(g.offsets().unwrap(), vec![0, 2, 2, 5, 8, 8]);
        for gr in g.groups() {
            let off = g.offsets().unwrap();
            assert_eq!(
                (off[gr.expert] as usize, off[gr.expert + 1] as usize),
                (gr.start, gr.start + gr.len)
            );
        }
        let err = groups(&ids, 2, 5, 3).offsets().unwrap_err().to_string();
        assert!(err.contains("2 loose pairs"), "{err}");
    }

    #[test]
    fn rejects_an_expert_id_out_of_range() {
        let err = ExpertGroups::new(&[0, 4], 2, 4, 1, &Device::Cpu).unwrap_err();
        assert_eq!(err.to_string(), "expert id 4 is outside the 4 experts");
    }
}
