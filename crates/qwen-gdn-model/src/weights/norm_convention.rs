//! Which convention an RMSNorm weight was stored in. Raw Hugging Face Qwen checkpoints store
//! norm weights zero-centred (the layer multiplies by `1 + w`); mlx-lm's conversions add the 1
//! in the file. For the main model the layout says which (`Checkpoint::raw_hf`), but the
//! multi-token-prediction head's norms are shifted by some conversions and not by others, and a
//! wrong guess does not fail: it only lowers the drafts' acceptance. So the head's norms are
//! judged one tensor at a time, from their values.
//!
//! A trained norm weight stays near its initial value: near 0 zero-centred, near 1 shifted.
//! The mean decides, with the cut halfway: `1 + w` of a zero-centred weight would need
//! `mean(w) ≥ 0.5` to be mistaken for a shifted one, i.e. a norm that scales its whole
//! output by 1.5 on average.

/// Whether `weight` is stored zero-centred (to be applied as `1 + w`).
pub fn zero_centred(weight: &[f32]) -> bool {
    if weight.is_empty() {
        return false;
    }
    let mean = weight.iter().map(|&v| v as f64).sum::<f64>() / weight.len() as f64;
    mean < 0.5
}

#[cfg(test)]
mod tests {
    use super::zero_centred;

    #[test]
    fn both_conventions_are_told_apart() {
        // Trained zero-centred weights: small, either sign.
        let zc: Vec<f32> = (0..128).map(|i| ((i % 17) as f32 - 8.0) / 40.0).collect();
        assert!(zero_centred(&zc));
        // The same weights shifted by one, as an MLX conversion stores them.
        let shifted: Vec<f32> = zc.iter().map(|v| 1.0 + v).collect();
        assert!(!zero_centred(&shifted));
        // Untrained norms: all zeros (zero-centred) or all ones (shifted).
        assert!(zero_centred(&[0.0; 16]));
        assert!(!zero_centred(&[1.0; 16]));
        // Shifted weights that shrink their input a lot are still seen as shifted.
        assert!(!zero_centred(&[0.6; 16]));
    }
}
