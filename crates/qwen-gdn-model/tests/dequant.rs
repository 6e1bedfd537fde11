//! MLX affine dequantization and quantized matmul against MLX's own outputs for every bit
//! width and group size (models/reference/quant.safetensors).

mod common;
use common::*;
use qwen_gdn_model::weights::{AffineMatrix, Matrix};

#[test]
fn every_bit_width_and_group_size_matches_mlx() {
    let r = Reference(
        candle_core::safetensors::load(
            models_dir().join("reference/quant.safetensors"),
            &candle_core::Device::Cpu,
        )
        .unwrap(),
    );
    let mut checked = 0;
    for bits in [2usize, 3, 4, 5, 6, 8] {
        for group in [32usize, 64, 128] {
            let key = |s: &str| format!("b{bits}_g{group}.{s}");
            let want = r.get(&key("dequant"));
            let (rows, cols) = want.dims2().unwrap();
            let packed: Vec<u32> = r
                .get(&key("weight"))
                .flatten_all()
                .unwrap()
                .to_vec1::<u32>()
                .unwrap();
            let scales = flat(r.get(&key("scales")));
            let biases = flat(r.get(&key("biases")));
            assert!(
                scales.iter().any(|&s| s < 0.0),
                "fixture should carry negative scales"
            );
            let m = Matrix::Affine(
                AffineMatrix::new(bits, group, [1, rows, cols], packed, scales, biases).unwrap(),
            );
            let mut got = vec![0f32; rows * cols];
            for (i, row) in got.chunks_exact_mut(cols).enumerate() {
                m.row_into(0, i, row);
            }
            assert_eq!(
                got,
                flat(want),
                "{bits}-bit group {group}: dequantized values differ"
            );
            let x = r.get(&key("x"));
            let n = x.dim(0).unwrap();
            let y = m.matmul_t(0, &flat(x), n);
            let y = candle_core::Tensor::from_vec(y, (n, rows), &candle_core::Device::Cpu).unwrap();
            let d = rel_max_diff(&y, r.get(&key("y")));
            assert!(
                d <= 1e-5,
                "{bits}-bit group {group}: matmul differs by {d:e}"
            );
            // Both kernels: decode-shaped products dot the packed weights directly (4/8-bit),
            // larger ones dequantize rows. Every activation row alone, and all of them
            // repeated past the fused kernel's row limit, must agree with MLX.
            let xs = flat(x);
            let want = flat(r.get(&key("y")));
            for i in 0..n {
                let one = m.matmul_t(0, &xs[i * cols..(i + 1) * cols], 1);
                let d = one
                    .iter()
                    .zip(&want[i * rows..(i + 1) * rows])
                    .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
                let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
                assert!(
                    d <= 1e-5 * scale,
                    "{bits}-bit group {group}: row {i} alone differs by {d:e}"
                );
            }
            let many: Vec<f32> = xs.iter().copied().cycle().take(xs.len() * 3).collect();
            let y_many = m.matmul_t(0, &many, 3 * n);
            let d = y_many
                .iter()
                .zip(want.iter().cycle())
                .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            assert!(
                d <= 1e-5 * scale,
                "{bits}-bit group {group}: {} rows differ by {d:e}",
                3 * n
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 18);
}
