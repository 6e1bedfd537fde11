//! Expert products of an unquantized (float) expert stack for many tokens: the (token, slot)
//! pairs are grouped by expert, and each expert multiplies its rows in one product with its
//! own matrix, a view of the stack. Gathering a whole expert per pair instead (`index_select`
//! of the stack) would materialise `[N·k, rows, cols]`: at 2048 tokens, top-10 and
//! Qwen3-Next-80B widths (512 × 2048, bf16), 43 GB per projection.
//!
//! The ids are read back to the host to form the groups: one host sync per projection of a
//! prefill chunk, as the reference plan's routing does.

use crate::candle_ops::{cat, index_select, matmul};
use anyhow::{ensure, Result};
use candle_core::Tensor;

/// `x` `[N, cols]` (one row per token, shared by its k slots) or `[N, k, cols]` (one per
/// slot), `ids` `[N, k]` u32 into `experts` `[E, rows, cols]` → `[N, k, rows]`, where
/// `out[t, s] = x[t (, s)] · experts[ids[t, s]]ᵀ`.
pub fn grouped_matmul_t(experts: &Tensor, x: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (n, k) = ids.dims2()?;
    let (e, rows, cols) = experts.dims3()?;
    let per_slot = x.rank() == 3;
    let x = crate::tensor::contiguous(x)?.reshape(((if per_slot { n * k } else { n }), cols))?;
    let ids: Vec<u32> = ids.flatten_all()?.to_vec1()?;
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= e) {
        anyhow::bail!("expert id {bad} is outside the {e} experts");
    }
    // Pairs (t·k + s) in expert order; each pair's input row.
    let mut order: Vec<u32> = (0..(n * k) as u32).collect();
    order.sort_by_key(|&p| ids[p as usize]);
    let source: Vec<u32> = order
        .iter()
        .map(|&p| if per_slot { p } else { p / k as u32 })
        .collect();
    let mut position = vec![0u32; n * k];
    for (i, &p) in order.iter().enumerate() {
        position[p as usize] = i as u32;
    }
    let device = x.device();
    let sorted_x = index_select(&x, &Tensor::new(source.as_slice(), device)?, 0)?;
    let mut outputs = Vec::new();
    let mut start = 0;
    while start < order.len() {
        let expert = ids[order[start] as usize];
        let len = order[start..]
            .iter()
            .take_while(|&&p| ids[p as usize] == expert)
            .count();
        let w = experts.get(expert as usize)?; // [rows, cols], a view
        outputs.push(matmul(&sorted_x.narrow(0, start, len)?, &w.t()?)?);
        start += len;
    }
    let sorted_y = cat(&outputs, 0)?;
    let y = index_select(&sorted_y, &Tensor::new(position.as_slice(), device)?, 0)?;
    ensure!(y.dims() == [n * k, rows], "grouped expert product shape");
    Ok(y.reshape((n, k, rows))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// Every pair computed on its own: the definition.
    fn pairwise(experts: &Tensor, x: &Tensor, ids: &[[u32; 2]]) -> Vec<Vec<f32>> {
        let mut out = vec![];
        for (t, slots) in ids.iter().enumerate() {
            for (s, &e) in slots.iter().enumerate() {
                let row = match x.rank() {
                    3 => x.get(t).unwrap().get(s).unwrap(),
                    _ => x.get(t).unwrap(),
                };
                let w = experts.get(e as usize).unwrap();
                let y = w
                    .matmul(&row.unsqueeze(1).unwrap())
                    .unwrap()
                    .squeeze(1)
                    .unwrap();
                out.push(y.to_vec1::<f32>().unwrap());
            }
        }
        out
    }

    #[test]
    fn matches_each_pair_on_its_own() {
        let dev = Device::Cpu;
        let (e, rows, cols) = (4, 3, 5);
        let values = |n: usize, seed: f32| -> Vec<f32> {
            (0..n)
                .map(|i| (i as f32 * 0.37 + seed).sin() * 2.0)
                .collect()
        };
        let experts =
            Tensor::from_vec(values(e * rows * cols, 0.1), (e, rows, cols), &dev).unwrap();
        // Expert 1 unused, expert 3 chosen by three pairs, a token choosing one expert twice
        // is not possible in top-k, but orders differ between tokens.
        let ids = [[3u32, 0], [2, 3], [0, 2], [3, 2]];
        let ids_t = Tensor::new(&ids, &dev).unwrap();
        for x in [
            Tensor::from_vec(values(4 * cols, 1.3), (4, cols), &dev).unwrap(),
            Tensor::from_vec(values(4 * 2 * cols, 2.9), (4, 2, cols), &dev).unwrap(),
        ] {
            let got = grouped_matmul_t(&experts, &x, &ids_t).unwrap();
            assert_eq!(got.dims(), [4, 2, rows]);
            let got = got
                .to_dtype(DType::F32)
                .unwrap()
                .reshape((8, rows))
                .unwrap();
            let got: Vec<Vec<f32>> = got.to_vec2().unwrap();
            let want = pairwise(&experts, &x, &ids);
            for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
                assert!((g - w).abs() < 1e-5, "{g} vs {w}");
            }
        }
    }

    #[test]
    fn rejects_an_expert_id_out_of_range() {
        let dev = Device::Cpu;
        let experts = Tensor::zeros((2, 3, 4), DType::F32, &dev).unwrap();
        let x = Tensor::zeros((1, 4), DType::F32, &dev).unwrap();
        let ids = Tensor::new(&[[0u32, 2]], &dev).unwrap();
        let err = grouped_matmul_t(&experts, &x, &ids).unwrap_err();
        assert_eq!(err.to_string(), "expert id 2 is outside the 2 experts");
    }
}
