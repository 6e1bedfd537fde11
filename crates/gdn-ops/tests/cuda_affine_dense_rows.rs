//! A quantized matrix times 5–64 activation rows (a batched decode step's dense products,
//! issue 29) on each path of `DenseRows` on CUDA (tests/common/affine_dense_rows.rs): every
//! path against the dequantized f64 reference (the streamed row products, the grouped GEMM's
//! one-tile launch and its split-K, the dequantization and cuBLAS); split-K against the
//! dequantizing path and its bits on a second run; the row products bit for bit what each row
//! gets alone; the launches each path costs. Built only with the `cuda` feature and run on the
//! GPU machine; without a CUDA device every test fails.
#![cfg(feature = "cuda")]

mod common;

use common::affine_dense_rows as check;
use common::gpu;

#[test]
fn every_path_matches_the_dequantized_reference() {
    check::every_path_matches_the_dequantized_reference(&gpu());
}

#[test]
fn row_products_give_each_row_what_it_gets_alone() {
    check::row_products_give_each_row_what_it_gets_alone(&gpu());
}

#[test]
fn one_pass_rows_give_each_row_its_bits_alone() {
    check::one_pass_rows_give_each_row_its_bits_alone(&gpu());
}

#[test]
fn split_k_matches_dequantize_and_repeats_its_bits() {
    check::split_k_matches_dequantize_and_repeats_its_bits(&gpu());
}

#[test]
fn each_path_launches_what_it_should() {
    check::each_path_launches_what_it_should(&gpu());
}
