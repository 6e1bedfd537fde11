//! The hashed n-gram row ids of a `qwen4_exp` per-layer embedding (docs/qwen4_exp.md §4.1):
//! pure integer maths, the same on every device, so the host computes the ids of each token
//! and gathers only those rows from the (mmapped, ~51B-parameter) tables.

use crate::config::qwen4_exp::PleConfig;

const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
const SPLITMIX_M1: u64 = 0xBF58_476D_1CE4_E5B9;
const SPLITMIX_M2: u64 = 0x94D0_49BB_1331_11EB;
/// Spacing of the per-layer hash seeds (transformers' `_PRIME_1`).
const LAYER_SEED_STRIDE: u64 = 10007;

fn splitmix64(v: u64) -> u64 {
    let mut v = v.wrapping_add(SPLITMIX_GAMMA);
    v = (v ^ (v >> 30)).wrapping_mul(SPLITMIX_M1);
    v = (v ^ (v >> 27)).wrapping_mul(SPLITMIX_M2);
    v ^ (v >> 31)
}

fn is_prime(v: u64) -> bool {
    if v < 2 {
        return false;
    }
    if v.is_multiple_of(2) {
        return v == 2;
    }
    let mut d = 3u64;
    while d * d <= v {
        if v.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// The hash of one PLE layer: multipliers, per-head prime table sizes and row offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramHash {
    /// One odd multiplier per position in the n-gram (`ngram_size` of them).
    pub multipliers: Vec<u64>,
    /// Rows of each hashed head's slice of the table (distinct primes ≥ the base).
    pub head_sizes: Vec<u64>,
    /// First row of each head's slice.
    pub head_offsets: Vec<u64>,
    /// Rows of the table, padded to `make_ngram_vocab_size_divisible_by`.
    pub rows: u64,
    ngram_size: usize,
    heads_per_ngram: usize,
    eos: u32,
}

impl NgramHash {
    /// The hash of the `ple_index`-th PLE layer (its position in the sorted `ple_layer_ids`).
    pub fn new(ple: &PleConfig, ple_index: usize, vocab_size: usize) -> Self {
        let multiplier_max = (i64::MAX as u64) / (vocab_size.max(1) as u64);
        let half = (multiplier_max / 2).max(1);
        let base_seed = ple
            .seed
            .wrapping_add(LAYER_SEED_STRIDE.wrapping_mul(ple_index as u64));
        let multipliers = (0..ple.ngram_size as u64)
            .map(|j| {
                let v = base_seed.wrapping_add(SPLITMIX_GAMMA.wrapping_mul(j + 1));
                2 * (splitmix64(v) % half) + 1
            })
            .collect();
        // Head g of PLE layer p takes the (p·G + g + 1)-th prime ≥ the base.
        let heads = ple.heads();
        let mut p = ple.vocab_base - 1;
        let mut head_sizes = Vec::with_capacity(heads);
        for g in 0..(ple_index + 1) * heads {
            p += 1;
            while !is_prime(p) {
                p += 1;
            }
            if g >= ple_index * heads {
                head_sizes.push(p);
            }
        }
        let mut head_offsets = Vec::with_capacity(heads);
        let mut total = 0u64;
        for &s in &head_sizes {
            head_offsets.push(total);
            total += s;
        }
        let rows = total.div_ceil(ple.divisible_by) * ple.divisible_by;
        Self {
            multipliers,
            head_sizes,
            head_offsets,
            rows,
            ngram_size: ple.ngram_size,
            heads_per_ngram: ple.heads_per_ngram,
            eos: ple.eos_token_id,
        }
    }

    /// Hashed heads per token.
    pub fn heads(&self) -> usize {
        self.head_sizes.len()
    }

    /// The context a sequence starts with: `ngram_size − 1` eos tokens.
    pub fn initial_context(&self) -> Vec<u32> {
        vec![self.eos; self.ngram_size - 1]
    }

    /// Row ids `[tokens.len() × heads]` (row-major) of `tokens`, which follow `context` (the
    /// previous `ngram_size − 1` tokens, oldest first). Returns the context for the next call.
    pub fn ids(&self, context: &[u32], tokens: &[u32]) -> (Vec<u64>, Vec<u32>) {
        let n = self.ngram_size;
        assert_eq!(context.len(), n - 1, "n-gram context length");
        let hist: Vec<u32> = context.iter().chain(tokens).copied().collect();
        let mut out = Vec::with_capacity(tokens.len() * self.heads());
        // Position of the last eos strictly before the current one (None: none seen).
        let mut last_eos: Option<usize> = None;
        for (p, _) in hist.iter().enumerate() {
            if p >= n - 1 {
                // s_d: the token d back, or eos when an eos lies in between (positions p−d
                // .. p−1): an n-gram never reaches back across the end of a segment.
                let shifted = |d: usize| -> u64 {
                    let crosses = last_eos.is_some_and(|e| e + d >= p);
                    if crosses {
                        self.eos as u64
                    } else {
                        hist[p - d] as u64
                    }
                };
                for order in 2..=n {
                    let mut mixed = 0u64;
                    for (d, m) in self.multipliers.iter().enumerate().take(order) {
                        mixed ^= shifted(d).wrapping_mul(*m);
                    }
                    let first = (order - 2) * self.heads_per_ngram;
                    for g in first..first + self.heads_per_ngram {
                        out.push(mixed % self.head_sizes[g] + self.head_offsets[g]);
                    }
                }
            }
            if hist[p] == self.eos {
                last_eos = Some(p);
            }
        }
        let next = hist[hist.len() - (n - 1)..].to_vec();
        (out, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ple(seed: u64) -> PleConfig {
        PleConfig {
            layers: vec![1, 3],
            embed_dim: 64,
            conv_kernel: 4,
            ngram_size: 3,
            heads_per_ngram: 2,
            vocab_base: 97,
            divisible_by: 128,
            seed,
            split_parts: 3,
            eos_token_id: 9,
        }
    }

    #[test]
    fn primes_offsets_and_padding() {
        let h0 = NgramHash::new(&ple(1234), 0, 2048);
        let h1 = NgramHash::new(&ple(1234), 1, 2048);
        assert_eq!(h0.head_sizes, vec![97, 101, 103, 107]);
        assert_eq!(h1.head_sizes, vec![109, 113, 127, 131]);
        assert_eq!(h0.head_offsets, vec![0, 97, 198, 301]);
        assert_eq!(h0.rows, 512);
        assert!(h0.multipliers.iter().all(|m| m % 2 == 1));
        assert_ne!(h0.multipliers, h1.multipliers);
    }

    #[test]
    fn chunked_ids_equal_whole_sequence_ids() {
        let h = NgramHash::new(&ple(7), 0, 2048);
        let tokens = [5u32, 6, 9, 7, 9, 9, 8, 1, 2, 3];
        let (whole, _) = h.ids(&h.initial_context(), &tokens);
        let mut ctx = h.initial_context();
        let mut steps = vec![];
        for chunk in [&tokens[..3], &tokens[3..4], &tokens[4..]] {
            let (ids, next) = h.ids(&ctx, chunk);
            steps.extend(ids);
            ctx = next;
        }
        assert_eq!(whole, steps);
        // Right after an eos, every order sees only eos before the token.
        let (after_eos, _) = h.ids(&[5, 9], &[4]);
        let (fresh, _) = h.ids(&h.initial_context(), &[4]);
        assert_eq!(after_eos, fresh);
    }
}
