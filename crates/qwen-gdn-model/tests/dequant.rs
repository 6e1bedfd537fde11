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
            checked += 1;
        }
    }
    assert_eq!(checked, 18);
}
