//! MLX affine quantization (mlx-lm-reference.md §6): the packed bitstream of one row, its
//! exact dequantization and its fused dot product, on plain slices.
//!
//! A row of `cols` elements is one little-endian bitstream: element `j` occupies bits
//! `[j*bits, (j+1)*bits)`, bit `n` being bit `n % 32` of word `n / 32`. Groups of
//! `group_size` consecutive elements share a scale and a bias: `w = scale * q + bias`
//! (scales may be negative).

/// Bit widths MLX's affine mode produces.
pub const SUPPORTED_BITS: [usize; 6] = [2, 3, 4, 5, 6, 8];
pub const SUPPORTED_GROUPS: [usize; 3] = [32, 64, 128];

/// `Σ q_j x_j` for 4-bit values, eight per word, left in eight lanes (one per nibble
/// position) so that the shifts and the multiply-adds vectorise. Groups hold an even number
/// of words (at least 32 values).
#[inline(always)]
fn dot_u4(words: &[u32], x: &[f32]) -> [f32; 8] {
    // Two words per step: sixteen lanes, one AVX-512 register.
    let mut acc = [0f32; 16];
    for (w, xs) in words.chunks_exact(2).zip(x.chunks_exact(16)) {
        for l in 0..16 {
            acc[l] += ((w[l / 8] >> (4 * (l % 8))) & 0xF) as f32 * xs[l];
        }
    }
    std::array::from_fn(|l| acc[l] + acc[l + 8])
}

/// `Σ q_j x_j` for 8-bit values, two words (eight bytes) per step.
#[inline(always)]
fn dot_u8(words: &[u32], x: &[f32]) -> [f32; 8] {
    let mut acc = [0f32; 8];
    for (w, xs) in words.chunks_exact(2).zip(x.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ((w[l / 4] >> (8 * (l % 4))) & 0xFF) as f32 * xs[l];
        }
    }
    acc
}

crate::multiversion! {
    /// Dequantizes one row: `out[j] = scales[g] · q_j + biases[g]`, `g = j / group_size`,
    /// where the group size is `out.len() / scales.len()`.
    pub fn dequantize_row(words: &[u32], scales: &[f32], biases: &[f32], bits: usize, out: &mut [f32]) -> () {
        let group_size = out.len() / scales.len();
        unpack_row(words, bits, out);
        for ((chunk, &s), &b) in out.chunks_exact_mut(group_size).zip(scales).zip(biases) {
            for v in chunk {
                *v = s * *v + b;
            }
        }
    }
}

crate::multiversion! {
    /// `Σ_j w_j x_j` over one packed 4- or 8-bit row, per group `scale · Σ q x + bias · Σ x`
    /// (`group_sums` holds `Σ x` per group of `x`).
    pub(crate) fn packed_row_dot(
        words: &[u32],
        scales: &[f32],
        biases: &[f32],
        x: &[f32],
        group_sums: &[f32],
        bits: usize,
    ) -> f32 {
        let group_size = x.len() / scales.len();
        let words_per_group = group_size * bits / 32;
        // Eight lanes carried across groups (scaled per group, summed once per row): a
        // horizontal sum per group would cost as much as the group's products.
        let mut lanes = [0f32; 8];
        let mut bias_total = 0f32;
        for (g, (gw, gx)) in words
            .chunks_exact(words_per_group)
            .zip(x.chunks_exact(group_size))
            .enumerate()
        {
            let qx = match bits {
                4 => dot_u4(gw, gx),
                8 => dot_u8(gw, gx),
                _ => unreachable!("row_dot needs 4 or 8 bits"),
            };
            for l in 0..8 {
                lanes[l] += scales[g] * qx[l];
            }
            bias_total += biases[g] * group_sums[g];
        }
        lanes.iter().sum::<f32>() + bias_total
    }
}

/// Unpacks one row's bitstream into unsigned integers stored as f32.
#[inline(always)]
pub fn unpack_row(words: &[u32], bits: usize, out: &mut [f32]) {
    match bits {
        // The common widths never straddle a word: a straight shift-and-mask loop.
        4 | 8 | 2 => {
            let per_word = 32 / bits;
            let mask = (1u32 << bits) - 1;
            for (w, chunk) in words.iter().zip(out.chunks_exact_mut(per_word)) {
                for (i, v) in chunk.iter_mut().enumerate() {
                    *v = ((w >> (bits * i)) & mask) as f32;
                }
            }
        }
        _ => {
            let mask = (1u64 << bits) - 1;
            for (j, v) in out.iter_mut().enumerate() {
                let bit = j * bits;
                let (word, shift) = (bit / 32, bit % 32);
                let lo = words[word] as u64;
                let hi = words.get(word + 1).copied().unwrap_or(0) as u64;
                *v = ((((hi << 32) | lo) >> shift) & mask) as f32;
            }
        }
    }
}

/// Packs unsigned integers (each `< 2^bits`) into MLX's LSB-first bitstream. Used by tests
/// and by tools that write checkpoints.
pub fn pack_row(values: &[u32], bits: usize) -> Vec<u32> {
    let mut words = vec![0u32; values.len() * bits / 32];
    for (j, &q) in values.iter().enumerate() {
        let bit = j * bits;
        let (word, shift) = (bit / 32, bit % 32);
        words[word] |= q << shift;
        if shift + bits > 32 {
            words[word + 1] |= q >> (32 - shift);
        }
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_unpack_roundtrip_every_width() {
        for bits in SUPPORTED_BITS {
            let values: Vec<u32> = (0..128u32).map(|j| (j * 7 + 3) % (1 << bits)).collect();
            let words = pack_row(&values, bits);
            let mut out = vec![0f32; values.len()];
            unpack_row(&words, bits, &mut out);
            let back: Vec<u32> = out.iter().map(|&v| v as u32).collect();
            assert_eq!(back, values, "{bits} bits");
        }
    }

    #[test]
    fn nibble_order_is_lsb_first() {
        let mut out = [0f32; 8];
        unpack_row(&[0x8765_4321], 4, &mut out);
        assert_eq!(out, [1., 2., 3., 4., 5., 6., 7., 8.]);
    }
}
