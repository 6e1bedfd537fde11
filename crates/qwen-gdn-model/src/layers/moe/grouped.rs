//! Prefill of a quantized MoE block with its expert products grouped by expert
//! ([`ExpertGroups`]): an expert chosen by at least `min_tokens` of the chunk's (token, slot)
//! pairs runs one product over all of them — its rows dequantized once into the activation
//! dtype and one dense matmul (cuBLAS, Metal's gemm, candle's CPU gemm), or the direct
//! products kernel when it has a few rows only — where the per-pair path reads the expert's
//! packed weights once per pair. The shared expert is the stacked expert `E`, chosen by every
//! token, so it always gets its own product. The experts chosen fewer times keep the gathered
//! per-pair product, one launch for all of them: below the threshold, an expert's own
//! dequantization, matmul and copy cost more launches than its pairs cost reads.
//!
//! With [`MoePrefill::Gemm`] every pair is grouped and each projection is one grouped
//! quantized GEMM over all experts ([`AffineTensor::grouped_matmul_t`]: one kernel launch on
//! CUDA, the CPU twin on the CPU), so a MoE layer's prefill costs about as many launches
//! whatever the number of experts in use.
//!
//! [`StackedExperts::forward_composed`] (every pair on its own) is the reference, selectable
//! with `QWEN_GDN_MOE_PREFILL=pairs` (`RunOptions::moe_prefill`) or [`MoePrefill::Pairs`].
//!
//! [`AffineTensor::grouped_matmul_t`]: gdn_ops::ops::affine::AffineTensor::grouped_matmul_t

use super::groups::ExpertGroups;
use super::{swiglu_halves, StackedExperts};
use crate::candle_ops::{matmul, swiglu};
use crate::tensor::contiguous;
use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use gdn_ops::ops::affine::MATVEC_MAX_ROWS;
use gdn_ops::profile::labelled;

/// How the device plan runs a prefill chunk's quantized expert products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoePrefill {
    /// One gathered product per (token, slot) pair: the reference.
    Pairs,
    /// One product per expert chosen by at least `min_tokens` pairs; the rest as pairs.
    Grouped { min_tokens: usize },
    /// Every pair grouped by expert, each projection one grouped GEMM over all experts.
    Gemm,
}

/// The environment variable that picks the mode (read by `RunOptions::from_env`).
pub const MOE_PREFILL_VAR: &str = "QWEN_GDN_MOE_PREFILL";

/// A mode as `QWEN_GDN_MOE_PREFILL` names it, before the device is known: `grouped` without a
/// count takes the device's threshold ([`MoePrefill::grouped_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoePrefillAsked {
    Pairs,
    Gemm,
    Grouped { min_tokens: Option<usize> },
}

impl MoePrefillAsked {
    /// `pairs`, `gemm`, `grouped` or `grouped:<min tokens>`; an error names the variable.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        Ok(match text.split_once(':') {
            None if text == "pairs" => Self::Pairs,
            None if text == "gemm" => Self::Gemm,
            None if text == "grouped" => Self::Grouped { min_tokens: None },
            Some(("grouped", n)) => match n.trim().parse::<usize>() {
                Ok(min_tokens) if min_tokens >= 1 => Self::Grouped {
                    min_tokens: Some(min_tokens),
                },
                _ => bail!(
                    "{MOE_PREFILL_VAR}={text}: the minimum number of tokens must be a whole number ≥ 1"
                ),
            },
            _ => bail!(
                "{MOE_PREFILL_VAR}={text}: expected pairs, gemm, grouped or grouped:<min tokens>"
            ),
        })
    }

    /// The mode on `device`.
    pub fn on(self, device: &Device) -> MoePrefill {
        match self {
            Self::Pairs => MoePrefill::Pairs,
            Self::Gemm => MoePrefill::Gemm,
            Self::Grouped { min_tokens: None } => MoePrefill::grouped_for(device),
            Self::Grouped {
                min_tokens: Some(min_tokens),
            } => MoePrefill::Grouped { min_tokens },
        }
    }
}

impl MoePrefill {
    /// The default on `device`: the grouped GEMM where it is one kernel (CUDA), else the
    /// products grouped per expert at the device's threshold ([`Self::grouped_for`]).
    pub fn default_for(device: &Device) -> Self {
        match device {
            Device::Cuda(_) => Self::Gemm,
            _ => Self::grouped_for(device),
        }
    }

    /// Grouped per expert at `device`'s threshold. An expert's own product costs about three
    /// launches per projection (dequantize, matmul, the copy into the chunk's output); a pair
    /// in the gathered product costs one read of the expert's packed weights. Where a launch
    /// costs the host more than the GPU spends reading an expert (CUDA: ~6 µs per launch
    /// against ~0.5 µs per 1 MB expert at 3 TB/s) an expert needs many more pairs to be worth
    /// its own product than on Metal (~1.3 µs per expert at 800 GB/s); see
    /// docs/perf-notes-gpu.md.
    pub fn grouped_for(device: &Device) -> Self {
        let min_tokens = match device {
            Device::Cuda(_) => 64,
            _ => 16,
        };
        Self::Grouped { min_tokens }
    }

    /// `pairs`, `gemm`, `grouped` (the device's threshold) or `grouped:<min tokens>`.
    pub fn parse(text: &str, device: &Device) -> Result<Self> {
        Ok(MoePrefillAsked::parse(text)?.on(device))
    }

    /// The grouping threshold for a chunk of `tokens` tokens, or `None` where the per-pair
    /// products run: the reference mode, and decode-shaped chunks (as many rows as the direct
    /// products take), where grouping would cost a host sync for nothing.
    pub fn min_tokens_for(self, tokens: usize) -> Option<usize> {
        match self {
            Self::Grouped { min_tokens } if tokens > MATVEC_MAX_ROWS => Some(min_tokens),
            _ => None,
        }
    }

    /// Whether a chunk of `tokens` tokens runs the grouped GEMM (decode-shaped chunks keep the
    /// per-pair products, as in [`Self::min_tokens_for`]).
    pub fn gemm_for(self, tokens: usize) -> bool {
        self == Self::Gemm && tokens > MATVEC_MAX_ROWS
    }
}

impl StackedExperts {
    /// The block with grouped expert products: `x` `[N, H]` → `[N, H]`, the same function as
    /// [`Self::forward_composed`] (the same routing, the same weighted sum over slots).
    pub fn forward_grouped(
        &self,
        x: &Tensor,
        top_k: usize,
        renormalise: bool,
        min_tokens: usize,
    ) -> Result<Tensor> {
        if x.dims2()?.0 == 0 {
            return self.forward_composed(x, top_k, renormalise);
        }
        let logits = self.router.forward(x)?;
        let (ids, weights) = self.route_prefill(&logits, top_k, renormalise)?;
        let groups = ExpertGroups::read(&ids, self.gate_up.experts, min_tokens)?;
        let inner = self.gate_up.rows / 2;
        let rows = groups.gather(x)?; // [P, H], grouped order
        let gate_up = groups.products(
            &rows,
            |x, ids| Ok(self.gate_up.gather_matmul_t(x, ids)?.squeeze(1)?),
            |e, x| self.gate_up.expert(e)?.matmul_t(x),
        )?; // [P, 2·Im]
        let act = swiglu_halves(&gate_up, inner)?;
        let down = groups.products(
            &act,
            |x, ids| Ok(self.down.gather_matmul_t(x, ids)?.squeeze(1)?),
            |e, x| self.down.expert(e)?.matmul_t(x),
        )?; // [P, H]
        groups.weighted_sum(&down, &weights)
    }

    /// The block with every pair grouped by expert and each projection one grouped GEMM over
    /// all experts: `x` `[N, H]` → `[N, H]`, the same function as
    /// [`Self::forward_composed`]. Its launches do not depend on how many experts the chunk
    /// uses: the routing, one gather, the two grouped products, the SwiGLU and the weighted
    /// sum read through the grouped order.
    pub fn forward_gemm(&self, x: &Tensor, top_k: usize, renormalise: bool) -> Result<Tensor> {
        if x.dims2()?.0 == 0 {
            return self.forward_composed(x, top_k, renormalise);
        }
        let (ids, weights) = labelled("moe/route", || {
            self.route_prefill(&self.router.forward(x)?, top_k, renormalise)
        })?;
        // The one host read of the chunk (the expert ids), so this phase includes the wait.
        let (groups, offsets, rows) = labelled("moe/group", || {
            let groups = ExpertGroups::read(&ids, self.gate_up.experts, 1)?;
            let offsets = groups.offsets()?;
            let rows = groups.gather(x)?; // [P, H], sorted by expert
            Ok((groups, offsets, rows))
        })?;
        let inner = self.gate_up.rows / 2;
        let gate_up = labelled("moe/gate_up", || {
            self.gate_up.grouped_matmul_t(&rows, &offsets) // [P, 2·Im]
        })?;
        let act = labelled("moe/swiglu", || swiglu_halves(&gate_up, inner))?;
        let down = labelled("moe/down", || {
            self.down.grouped_matmul_t(&act, &offsets) // [P, H]
        })?;
        labelled("moe/combine", || groups.weighted_sum(&down, &weights))
    }
}

/// The routed experts of float (unquantized) stacks for many tokens, grouped once for the
/// three products (one read of the ids, one gather, one scatter): `x` `[N, H]`, `ids`
/// `[N, k]` u32, stacks gate and up `[E, Im, H]`, down `[E, H, Im]` → the down products of
/// every slot `[N, k, H]`. Every expert with pairs gets its own product: a float expert has
/// no per-pair kernel (gathering an expert per pair copies it).
pub(super) fn dense_routed_grouped(
    x: &Tensor,
    ids: &Tensor,
    [gate, up, down]: [&Tensor; 3],
) -> Result<Tensor> {
    let (n, k) = ids.dims2()?;
    let hidden = down.dim(1)?;
    let groups = ExpertGroups::read(ids, gate.dim(0)?, 1)?;
    let rows = groups.gather(&contiguous(x)?)?;
    let no_loose = |_: &Tensor, _: &Tensor| -> Result<Tensor> {
        bail!("float experts: every expert with pairs has its own product")
    };
    let product =
        |stack: &Tensor, e: usize, x: &Tensor| -> Result<Tensor> { matmul(x, &stack.get(e)?.t()?) };
    let g = groups.products(&rows, no_loose, |e, x| product(gate, e, x))?;
    let u = groups.products(&rows, no_loose, |e, x| product(up, e, x))?;
    let act = swiglu(&g, &u)?;
    let d = groups.products(&act, no_loose, |e, x| product(down, e, x))?;
    Ok(groups.scatter(&d)?.reshape((n, k, hidden))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three products grouped once against each product grouped on its own
    /// (`Weight::gather_matmul_t`, itself checked against every pair on its own).
    #[test]
    fn dense_experts_grouped_once_match_each_product_grouped() {
        use crate::weights::Weight;
        let dev = &Device::Cpu;
        let (e, h, im, n) = (5, 8, 6, 7);
        let values = |len: usize, seed: f32| -> Tensor {
            let v: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37 + seed).sin()).collect();
            Tensor::from_vec(v, len, dev).unwrap()
        };
        let gate = values(e * im * h, 0.1).reshape((e, im, h)).unwrap();
        let up = values(e * im * h, 0.2).reshape((e, im, h)).unwrap();
        let down = values(e * h * im, 0.3).reshape((e, h, im)).unwrap();
        let x = values(n * h, 0.4).reshape((n, h)).unwrap();
        // Expert 4 unused, expert 0 chosen by every token.
        let ids = Tensor::new(
            &[[0u32, 1], [2, 0], [0, 3], [1, 0], [0, 2], [3, 0], [0, 1]],
            dev,
        )
        .unwrap();
        let got = dense_routed_grouped(&x, &ids, [&gate, &up, &down]).unwrap();
        let [g, u, d] = [gate, up, down].map(Weight::Dense);
        let act = (g.gather_matmul_t(&x, &ids).unwrap().silu().unwrap()
            * u.gather_matmul_t(&x, &ids).unwrap())
        .unwrap();
        let want = d.gather_matmul_t(&act, &ids).unwrap();
        assert_eq!(got.dims(), [n, 2, h]);
        let diff = crate::tensor::max_abs(&(got - want).unwrap());
        assert!(diff < 1e-5, "{diff}");
    }

    #[test]
    fn parses_the_modes_and_rejects_the_rest() {
        let cpu = &Device::Cpu;
        assert_eq!(MoePrefill::parse("pairs", cpu).unwrap(), MoePrefill::Pairs);
        assert_eq!(
            MoePrefill::parse("grouped", cpu).unwrap(),
            MoePrefill::Grouped { min_tokens: 16 }
        );
        assert_eq!(MoePrefill::parse("gemm", cpu).unwrap(), MoePrefill::Gemm);
        assert_eq!(MoePrefill::default_for(cpu), MoePrefill::grouped_for(cpu));
        assert_eq!(
            MoePrefill::parse("grouped:3", cpu).unwrap(),
            MoePrefill::Grouped { min_tokens: 3 }
        );
        for bad in ["", "group", "grouped:0", "grouped:x", "pairs:2", "gemm:1"] {
            let err = MoePrefill::parse(bad, cpu).unwrap_err().to_string();
            assert!(err.starts_with("QWEN_GDN_MOE_PREFILL="), "{bad}: {err}");
        }
    }

    #[test]
    fn decode_shaped_chunks_keep_the_pairs() {
        let mode = MoePrefill::Grouped { min_tokens: 2 };
        assert_eq!(mode.min_tokens_for(1), None);
        assert_eq!(mode.min_tokens_for(MATVEC_MAX_ROWS), None);
        assert_eq!(mode.min_tokens_for(MATVEC_MAX_ROWS + 1), Some(2));
        assert_eq!(MoePrefill::Pairs.min_tokens_for(512), None);
        assert!(!MoePrefill::Gemm.gemm_for(MATVEC_MAX_ROWS));
        assert!(MoePrefill::Gemm.gemm_for(MATVEC_MAX_ROWS + 1));
        assert_eq!(MoePrefill::Gemm.min_tokens_for(512), None);
        assert!(!mode.gemm_for(512));
    }
}
