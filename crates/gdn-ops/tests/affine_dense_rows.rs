//! A quantized matrix times 5–64 activation rows (a batched decode step's dense products,
//! issue 29) on each path of `DenseRows`, on the CPU twins (tests/common/affine_dense_rows.rs):
//! every path against the dequantized f64 reference; the row products bit for bit what each
//! row gets alone; the launches each path costs.

mod common;

use candle_core::Device;
use common::affine_dense_rows as check;

#[test]
fn every_path_matches_the_dequantized_reference() {
    check::every_path_matches_the_dequantized_reference(&Device::Cpu);
}

#[test]
fn row_products_give_each_row_what_it_gets_alone() {
    check::row_products_give_each_row_what_it_gets_alone(&Device::Cpu);
}

#[test]
fn one_pass_rows_give_each_row_its_bits_alone() {
    check::one_pass_rows_give_each_row_its_bits_alone(&Device::Cpu);
}

#[test]
fn split_k_matches_dequantize_and_repeats_its_bits() {
    check::split_k_matches_dequantize_and_repeats_its_bits(&Device::Cpu);
}

#[test]
fn each_path_launches_what_it_should() {
    check::each_path_launches_what_it_should(&Device::Cpu);
}
