//! Affine quantization of a float matrix into MLX's layout, for an MTP head taken from an
//! unquantized checkpoint (`--mtp-from`) to run at the main checkpoint's bits: per group of
//! `group_size` inputs, `scale = (max − min) / (2^bits − 1)`, `bias = min`,
//! `q = round((w − bias) / scale)`, so that `w ≈ scale·q + bias` (MLX's dequantization), with
//! an error of at most `scale / 2` per weight.

use gdn_ops::ops::affine::matrix::AffineMatrix;
use gdn_ops::ops::affine::packing::pack_row;

/// Quantizes row-major `[experts · rows, cols]` floats; `None` when `cols` does not split into
/// whole groups and words (the matrix then stays as stored).
pub fn quantize(
    data: &[f32],
    [experts, rows, cols]: [usize; 3],
    bits: usize,
    group_size: usize,
) -> Option<AffineMatrix> {
    if !cols.is_multiple_of(group_size) || !(cols * bits).is_multiple_of(32) {
        return None;
    }
    let levels = ((1u32 << bits) - 1) as f32;
    let groups = data.len() / group_size;
    let mut scales = Vec::with_capacity(groups);
    let mut biases = Vec::with_capacity(groups);
    let mut packed = Vec::with_capacity(data.len() * bits / 32);
    for row in data.chunks_exact(cols) {
        let mut q = Vec::with_capacity(cols);
        for group in row.chunks_exact(group_size) {
            let (lo, hi) = group
                .iter()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &w| {
                    (lo.min(w), hi.max(w))
                });
            let scale = (hi - lo) / levels;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            q.extend(
                group
                    .iter()
                    .map(|&w| ((w - lo) * inv).round().clamp(0.0, levels) as u32),
            );
            scales.push(scale);
            biases.push(lo);
        }
        packed.extend(pack_row(&q, bits));
    }
    AffineMatrix::new(
        bits,
        group_size,
        [experts, rows, cols],
        packed,
        scales,
        biases,
    )
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantized_weights_are_within_half_a_step() {
        let (rows, cols) = (3, 128);
        let data: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        for bits in [4, 8] {
            let m = quantize(&data, [1, rows, cols], bits, 64).unwrap();
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                m.dequantize_row(r, &mut row);
                let want = &data[r * cols..(r + 1) * cols];
                for (g, (got, want)) in row.chunks(64).zip(want.chunks(64)).enumerate() {
                    let (lo, hi) = want
                        .iter()
                        .fold((f32::MAX, f32::MIN), |(l, h), &w| (l.min(w), h.max(w)));
                    let step = (hi - lo) / ((1u32 << bits) - 1) as f32;
                    for (a, b) in got.iter().zip(want) {
                        assert!((a - b).abs() <= step / 2.0 + 1e-6, "{bits} bits, group {g}");
                    }
                }
            }
        }
        assert!(quantize(&data, [1, rows, cols], 4, 256).is_none());
    }
}
