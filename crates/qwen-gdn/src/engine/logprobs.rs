//! Log-probabilities of a text's tokens under the model, teacher-forced: `eval`'s, and serve's
//! `logprobs` (of the prompt with `echo`, and of the reply). Both are the raw model's
//! log_softmax(logits), before penalties, temperature and filters (vLLM's default too),
//! computed in the same chunks with the same operations, so that the server's numbers are
//! `eval --json`'s. (The decode steps that sampled the reply give values that differ from a
//! chunked pass by a few 1e-5: the reply is scored again, in one pass with its prompt.)

use super::Engine;
use anyhow::Result;
use candle_core::{DType, Tensor, D};

/// One token's log-probability and the most likely tokens at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The `n` most likely tokens with their log-probabilities, most likely first (ties: the
    /// lower id first).
    pub top: Vec<(u32, f32)>,
}

/// logsumexp of each row of `[rows, vocab]` f32 logits, `[rows, 1]`.
fn logsumexp(logits: &Tensor) -> Result<Tensor> {
    let max = logits.max_keepdim(D::Minus1)?;
    Ok((logits
        .broadcast_sub(&max)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        + &max)?)
}

/// log_softmax(logits)[j, targets[j]] and argmax of each row, computed where the logits live so
/// that only two numbers per row (not vocab-sized rows) come back to the host.
pub fn score(logits: &Tensor, targets: &[u32]) -> Result<(Vec<f32>, Vec<u32>)> {
    let lse = logsumexp(logits)?;
    let ids = Tensor::new(targets, logits.device())?.unsqueeze(1)?;
    let picked = logits.gather(&ids, 1)?;
    let logprobs = (picked - lse)?.squeeze(1)?.to_vec1()?;
    let argmax = logits.argmax(D::Minus1)?.to_vec1()?;
    Ok((logprobs, argmax))
}

/// The log-probabilities of `[rows, vocab]` logits, row by row on the host (needed only when
/// the most likely tokens are asked for). Each value is `logit − logsumexp`, the same f32
/// subtraction [`score`] does.
fn log_softmax_rows(logits: &Tensor) -> Result<Vec<Vec<f32>>> {
    let lse = logsumexp(logits)?;
    Ok(logits.broadcast_sub(&lse)?.to_vec2()?)
}

/// The `n` largest entries of `row`, largest first (ties: the lower index first).
fn top_n(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut order: Vec<u32> = (0..row.len() as u32).collect();
    let n = n.min(row.len());
    if n == 0 {
        return vec![];
    }
    let by_value = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    order.select_nth_unstable_by(n - 1, by_value);
    order.truncate(n);
    order.sort_by(by_value);
    order.into_iter().map(|i| (i, row[i as usize])).collect()
}

/// Each row's target log-probability, and with `top > 0` the `top` most likely tokens.
fn rows(logits: &Tensor, targets: &[u32], top: usize) -> Result<Vec<TokenLogprob>> {
    let logits = logits.to_dtype(DType::F32)?;
    if top == 0 {
        let (logprobs, _) = score(&logits, targets)?;
        return Ok(targets
            .iter()
            .zip(logprobs)
            .map(|(&token, logprob)| TokenLogprob {
                token,
                logprob,
                top: vec![],
            })
            .collect());
    }
    let rows = log_softmax_rows(&logits)?;
    Ok(targets
        .iter()
        .zip(rows)
        .map(|(&token, row)| TokenLogprob {
            token,
            logprob: row[token as usize],
            top: top_n(&row, top),
        })
        .collect())
}

impl Engine {
    /// Teacher-forced log-probabilities of `ids[1..]` (the first token has no context to be
    /// predicted from), run in chunks of the prefill size on a fresh cache as `eval` does, so
    /// that the values are `eval --json`'s. The prompt cache is neither read nor written.
    pub fn score_tokens(&self, ids: &[u32], top: usize) -> Result<Vec<TokenLogprob>> {
        let mut cache = self.model.new_cache();
        let mut out = Vec::with_capacity(ids.len().saturating_sub(1));
        for (i, chunk) in ids.chunks(self.prefill_chunk).enumerate() {
            // Row j predicts token start + j + 1, and the very last row nothing.
            let logits = self.model.forward(chunk, &mut cache)?;
            let start = i * self.prefill_chunk;
            let targets = &ids[start + 1..(start + chunk.len() + 1).min(ids.len())];
            if !targets.is_empty() {
                out.extend(rows(&logits.narrow(0, 0, targets.len())?, targets, top)?);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn score_is_log_softmax_at_the_target() {
        let logits = Tensor::new(&[[1.0f32, 2.0, 3.0], [0.0, 0.0, 5.0]], &Device::Cpu).unwrap();
        let (lp, am) = score(&logits, &[0, 2]).unwrap();
        let want0 = 1.0 - (1f32.exp() + 2f32.exp() + 3f32.exp()).ln();
        let want1 = 5.0 - (2.0 + 5f32.exp()).ln();
        assert!(
            (lp[0] - want0).abs() < 1e-6 && (lp[1] - want1).abs() < 1e-6,
            "{lp:?}"
        );
        assert_eq!(am, [2, 2]);
    }

    #[test]
    fn the_top_tokens_are_the_most_likely_and_the_target_matches_score() {
        let logits = Tensor::new(&[[1.0f32, 3.0, 2.0, 3.0]], &Device::Cpu).unwrap();
        let with_top = rows(&logits, &[2], 3).unwrap().remove(0);
        let plain = rows(&logits, &[2], 0).unwrap().remove(0);
        // The same value whether or not the top tokens are asked for.
        assert_eq!(with_top.logprob, plain.logprob);
        let ids: Vec<u32> = with_top.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 2]);
        assert_eq!(with_top.top[2].1, with_top.logprob);
        let total: f32 = [1.0f32, 3.0, 2.0, 3.0].iter().map(|x| x.exp()).sum();
        assert!((with_top.top[0].1 - (3.0 - total.ln())).abs() < 1e-6);
    }
}
