//! The seam through which a grammar constrains sampling: before each token the constraint
//! says which tokens may come next (a bitset over the vocabulary), the mask is applied to
//! the logits where they live, and the sampled token is fed back. The sampler itself does not
//! change: a disallowed token's logit is −∞, so no filter or temperature can pick it.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};

/// A constraint on the tokens of a reply (serve's structured output implements it).
pub trait LogitsConstraint: Send {
    /// The tokens allowed next: bit `t % 32` of word `t / 32` set for token t (the layout of
    /// llguidance's `SimpleVob`). Tokens past the words' end are not allowed.
    fn allowed(&mut self) -> Result<Vec<u32>>;
    /// `token` was sampled.
    fn accept(&mut self, token: u32) -> Result<()>;
}

/// A borrowed constraint constrains as the constraint does (a caller lends its own to one
/// reply).
impl<T: LogitsConstraint + ?Sized> LogitsConstraint for &mut T {
    fn allowed(&mut self) -> Result<Vec<u32>> {
        (**self).allowed()
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        (**self).accept(token)
    }
}

/// The bitset `words` as a `[vocab]` u8 mask (1 = allowed) on `device`. Only the words go to
/// the device (a 32nd of the vocabulary); the bits are spread there: each word is split into
/// 16-bit halves (exact in f32, as Metal has no f64), bit j of a half is
/// ⌊half / 2^j⌋ mod 2.
pub fn device_mask(words: &[u32], vocab: usize, device: &Device) -> Result<Tensor> {
    let halves: Vec<f32> = words
        .iter()
        .flat_map(|w| [(w & 0xffff) as f32, (w >> 16) as f32])
        .collect();
    let n = halves.len();
    let halves = Tensor::from_vec(halves, (n, 1), device)?;
    let powers: Vec<f32> = (0..16).map(|j| (1u32 << j) as f32).collect();
    let powers = Tensor::from_vec(powers, (1, 16), device)?;
    let shifted = halves.broadcast_div(&powers)?.floor()?;
    let bits = (&shifted - ((&shifted / 2.0)?.floor()? * 2.0)?)?.flatten_all()?;
    let bits = if bits.dim(0)? >= vocab {
        bits.narrow(0, 0, vocab)?
    } else {
        Tensor::cat(
            &[
                &bits,
                &Tensor::zeros(vocab - bits.dim(0)?, DType::F32, device)?,
            ],
            0,
        )?
    };
    Ok(bits.ge(0.5)?)
}

/// `logits` (`[rows, vocab]`) with every token the mask does not allow set to −∞.
pub fn apply_mask(logits: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let shape = logits.shape();
    let mask = mask.unsqueeze(0)?.broadcast_as(shape)?;
    let never =
        Tensor::full(f32::NEG_INFINITY, shape, logits.device())?.to_dtype(logits.dtype())?;
    Ok(mask.where_cond(logits, &never)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_mask_spreads_the_bits_of_each_word() {
        let words = [0x8000_0001u32, 0xffff_0000, 0x0001_8000, 0x5];
        // Shorter and longer than the words hold.
        for vocab in [100, 130] {
            let mask: Vec<u8> = device_mask(&words, vocab, &Device::Cpu)
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_eq!(mask.len(), vocab);
            for (t, &m) in mask.iter().enumerate() {
                let want = words.get(t / 32).is_some_and(|w| w >> (t % 32) & 1 == 1);
                assert_eq!(m == 1, want, "token {t}");
            }
        }
    }

    #[test]
    fn masked_logits_are_minus_infinity() {
        let logits = Tensor::new(&[[1.0f32, 2.0, 3.0, 4.0]], &Device::Cpu).unwrap();
        let mask = device_mask(&[0b0101], 4, &Device::Cpu).unwrap();
        let out: Vec<f32> = apply_mask(&logits, &mask)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(out, [1.0, f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY]);
    }
}
