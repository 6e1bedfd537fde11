//! The checks of a quantized matrix times 5–64 activation rows (a batched decode step's dense
//! products, issue 29) on each path of `DenseRows` (`ops/affine/dense_rows.rs`), written once
//! for every device: tests/affine_dense_rows.rs runs them on the CPU twins,
//! tests/cuda_affine_dense_rows.rs on CUDA (the streamed products and
//! `kernels/affine_grouped.cu`, its split-K included). Each check picks the path on its thread (`dense_rows_scope`),
//! whatever the process's choice.

use super::{random_matrix, values, Rng};
use candle_core::{DType, Device, Tensor};
use gdn_ops::launches;
use gdn_ops::ops::affine::dense_rows_scope as scope;
use gdn_ops::ops::affine::{
    AffineMatrix, AffineTensor, DenseRows, DENSE_ROWS_MAX, MATVEC_MAX_ROWS,
};
use gdn_ops::ops::affine_grouped::slicing::slicing;

/// The matrices: Qwen3-Next's 4-bit group 64 and the router's 8-bit group 32 (both on every
/// kernel), and a 3-bit one (no grouped kernel on CUDA: its `Grouped` dequantizes); output
/// rows that are not a multiple of the grouped GEMM's 128.
fn matrices(rng: &mut Rng) -> Vec<AffineMatrix> {
    vec![
        random_matrix(rng, 4, 64, [1, 200, 256], DType::BF16),
        random_matrix(rng, 8, 32, [1, 72, 128], DType::F32),
        random_matrix(rng, 3, 64, [1, 40, 256], DType::F16),
    ]
}

/// `xs` as `[xs.len() / cols, cols]` activations of `dtype` on `dev`.
fn activations(xs: &[f32], cols: usize, dtype: DType, dev: &Device) -> Tensor {
    Tensor::from_slice(xs, (xs.len() / cols, cols), dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// The largest |got - want| relative to the largest |want|.
fn error_of_max(got: &[f32], want: impl Iterator<Item = f64> + Clone) -> f64 {
    let scale = want.clone().fold(0f64, |a, v| a.max(v.abs()));
    got.iter()
        .zip(want)
        .fold(0f64, |a, (&g, w)| a.max((g as f64 - w).abs()))
        / scale
}

/// `x W^T` in f64 from the dequantized matrix.
fn reference(m: &AffineMatrix, x: &[f32], rows: usize) -> Vec<f64> {
    let mut w = vec![0f32; m.cols];
    let mut y = vec![0f64; rows * m.rows];
    for r in 0..m.rows {
        m.dequantize_row(r, &mut w);
        for i in 0..rows {
            let xr = &x[i * m.cols..(i + 1) * m.cols];
            y[i * m.rows + r] = w.iter().zip(xr).map(|(&w, &x)| w as f64 * x as f64).sum();
        }
    }
    y
}

/// Every path, f32 and bf16 activations, 5..=64 rows: within the dtype's rounding of the f64
/// reference, relative to the largest output (bf16 rounds x, the weights for the GEMMs, and
/// the output once each).
pub fn every_path_matches_the_dequantized_reference(dev: &Device) {
    let mut rng = Rng::new(29);
    // Per activation dtype (f32, bf16) and path.
    let mut worst = [[0f64; DenseRows::NAMED.len()]; 2];
    for m in matrices(&mut rng) {
        let w = AffineTensor::upload(&m, dev).unwrap();
        for rows in [MATVEC_MAX_ROWS + 1, 8, 9, 16, 33, DENSE_ROWS_MAX] {
            let xs: Vec<f32> = (0..rows * m.cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
            for (d, dtype) in [DType::F32, DType::BF16].into_iter().enumerate() {
                let x = activations(&xs, m.cols, dtype, dev);
                // The reference sees the x the kernels see.
                let x_seen = values(&x);
                let want = reference(&m, &x_seen, rows);
                let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
                for (k, (name, choice)) in DenseRows::NAMED.into_iter().enumerate() {
                    let _path = scope(choice);
                    let got = values(&w.matmul_t(&x).unwrap());
                    let err = error_of_max(&got, want.iter().copied());
                    worst[d][k] = worst[d][k].max(err);
                    assert!(
                        err <= tol,
                        "{name}: {}-bit [{}, {}], {rows} rows of {dtype:?}: {err:e} of max|y|",
                        m.bits,
                        m.rows,
                        m.cols
                    );
                }
            }
        }
    }
    eprintln!(
        "worst error of max|y| per path {:?}: f32 {:?}, bf16 {:?}",
        DenseRows::NAMED.map(|n| n.0),
        worst[0],
        worst[1]
    );
}

/// The row products (`rows`, and `auto` up to its bound): each of 5, 8, 16 and 64 rows gets,
/// bit for bit, what it gets alone (one row: the decode products).
pub fn row_products_give_each_row_what_it_gets_alone(dev: &Device) {
    let mut rng = Rng::new(7);
    for m in matrices(&mut rng) {
        let w = AffineTensor::upload(&m, dev).unwrap();
        for (choice, rows) in [
            (DenseRows::RowProducts, 16),
            (DenseRows::RowProducts, DENSE_ROWS_MAX),
            (DenseRows::Auto, MATVEC_MAX_ROWS + 1),
            (DenseRows::Auto, 8),
        ] {
            let _path = scope(choice);
            let xs: Vec<f32> = (0..rows * m.cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let x = activations(&xs, m.cols, DType::BF16, dev);
            let all = values(&w.matmul_t(&x).unwrap());
            for r in 0..rows {
                let one = values(&w.matmul_t(&x.narrow(0, r, 1).unwrap()).unwrap());
                assert_eq!(
                    &all[r * m.rows..(r + 1) * m.rows],
                    one.as_slice(),
                    "{choice:?}: row {r} of {rows}, {}-bit [{}, {}]",
                    m.bits,
                    m.rows,
                    m.cols
                );
            }
        }
    }
}

/// 2..=8 rows of the model's widths (2 048 and 4 096 columns at 4 bits, 2 048 at 8: the
/// one-pass streamed kernel on CUDA, 1, 2 and 4 chunks a lane, over 48 KB of staged x from
/// 6 rows) under `one-pass`: each row bit for bit what it gets alone, f32 and bf16 activations.
pub fn one_pass_rows_give_each_row_its_bits_alone(dev: &Device) {
    let mut rng = Rng::new(28);
    let matrices = [
        random_matrix(&mut rng, 4, 64, [1, 300, 2048], DType::BF16),
        random_matrix(&mut rng, 4, 64, [1, 136, 4096], DType::BF16),
        random_matrix(&mut rng, 8, 32, [1, 72, 2048], DType::F32),
        random_matrix(&mut rng, 4, 64, [1, 200, 256], DType::F16),
    ];
    let _path = scope(DenseRows::OnePass);
    for m in matrices {
        let w = AffineTensor::upload(&m, dev).unwrap();
        for rows in 2..=8 {
            for dtype in [DType::F32, DType::BF16] {
                let xs: Vec<f32> = (0..rows * m.cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
                let x = activations(&xs, m.cols, dtype, dev);
                let all = values(&w.matmul_t(&x).unwrap());
                for r in 0..rows {
                    let one = values(&w.matmul_t(&x.narrow(0, r, 1).unwrap()).unwrap());
                    let mine = &all[r * m.rows..(r + 1) * m.rows];
                    let differ = mine
                        .iter()
                        .zip(&one)
                        .position(|(a, b)| a.to_bits() != b.to_bits());
                    assert!(
                        differ.is_none(),
                        "row {r} of {rows} {dtype:?}, {}-bit [{}, {}]: [{}] = {} against {} alone",
                        m.bits,
                        m.rows,
                        m.cols,
                        differ.unwrap(),
                        mine[differ.unwrap()],
                        one[differ.unwrap()]
                    );
                }
            }
        }
    }
}

/// Split-K (`split`, and `auto` from 9 rows past the short matrices) against the dequantizing path at 9, 16, 33 and
/// 64 rows, 4 and 8 bits, groups 32 and 64, f32 and bf16 activations, on matrices cut into
/// several slices (two steps a slice on the 1 536 × 2 048 one): within 1e-5 of max |y| in f32
/// (2e-2 in bf16: both round x, the weights and y once), and the same bits on a second run
/// (the slices summed in a fixed order).
pub fn split_k_matches_dequantize_and_repeats_its_bits(dev: &Device) {
    let mut rng = Rng::new(2913);
    let matrices = [
        random_matrix(&mut rng, 4, 64, [1, 1536, 2048], DType::BF16),
        random_matrix(&mut rng, 8, 32, [1, 520, 512], DType::F32),
        random_matrix(&mut rng, 4, 32, [1, 300, 1024], DType::F16),
        random_matrix(&mut rng, 8, 64, [1, 2048, 1024], DType::BF16),
    ];
    assert_eq!(
        slicing(1536, 2048),
        (2, 16),
        "a slice of two steps is covered"
    );
    let mut worst = [0f64; 2];
    for m in matrices {
        let w = AffineTensor::upload(&m, dev).unwrap();
        for rows in [9, 16, 33, DENSE_ROWS_MAX] {
            let xs: Vec<f32> = (0..rows * m.cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
            for (d, dtype) in [DType::F32, DType::BF16].into_iter().enumerate() {
                let x = activations(&xs, m.cols, dtype, dev);
                let run = |choice| {
                    let _path = scope(choice);
                    values(&w.matmul_t(&x).unwrap())
                };
                let want = run(DenseRows::Dequantize);
                let got = run(DenseRows::SplitK);
                // Auto: split-K, or the row products on a short matrix (the router's rule).
                let auto = DenseRows::Auto.path(rows, [m.rows, m.cols], true, true);
                assert!(matches!(auto, DenseRows::SplitK | DenseRows::RowProducts));
                assert_eq!(
                    run(DenseRows::Auto),
                    run(auto),
                    "auto takes {auto:?} at {rows} rows of [{}, {}]",
                    m.rows,
                    m.cols
                );
                let again = run(DenseRows::SplitK);
                let differ = got
                    .iter()
                    .zip(&again)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(
                    differ.is_none(),
                    "split-K differs between runs at {differ:?}"
                );
                let err = error_of_max(&got, want.iter().map(|&w| w as f64));
                worst[d] = worst[d].max(err);
                let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
                assert!(
                    err <= tol,
                    "split-K: {}-bit g{} [{}, {}], {rows} rows of {dtype:?}: {err:e} of max|y|",
                    m.bits,
                    m.group_size,
                    m.rows,
                    m.cols
                );
            }
        }
    }
    eprintln!(
        "split-K against dequantize, worst of max|y|: f32 {:e}, bf16 {:e}",
        worst[0], worst[1]
    );
}

/// No path past the decode rows makes a dequantized copy but `dequantize`: the row products
/// and the grouped GEMM are one launch a product, split-K two where it slices (the GEMM, the
/// fixed-order sum; the CPU twin one), the dequantizing path two (a dequantization and a
/// GEMM). A prefill's 65 rows dequantize whatever the choice.
pub fn each_path_launches_what_it_should(dev: &Device) {
    let mut rng = Rng::new(3);
    let m = random_matrix(&mut rng, 4, 64, [1, 200, 256], DType::BF16);
    let w = AffineTensor::upload(&m, dev).unwrap();
    let launched = |choice: DenseRows, rows: usize| {
        let _path = scope(choice);
        let x = Tensor::zeros((rows, m.cols), DType::BF16, dev).unwrap();
        launches::take();
        w.matmul_t(&x).unwrap();
        launches::take()
    };
    assert_eq!(launched(DenseRows::RowProducts, 16), 1);
    assert_eq!(launched(DenseRows::Grouped, 16), 1);
    assert_eq!(launched(DenseRows::Dequantize, 16), 2);
    assert_eq!(launched(DenseRows::Auto, 8), 1, "auto: row products");
    // 200 × 256: four slices of one step on CUDA and Metal (the GEMM and the sum); the CPU
    // twin one. Auto keeps so short a matrix on the row products (one launch).
    let split = if dev.is_cpu() { 1 } else { 2 };
    assert_eq!(launched(DenseRows::SplitK, 16), split);
    assert_eq!(launched(DenseRows::Auto, 16), 1, "auto: row products");
    assert_eq!(launched(DenseRows::RowProducts, DENSE_ROWS_MAX + 1), 2);
}
