//! The CPU twin of `indexer_pool` (the QSA indexer's block pooling) against the candle ops it
//! replaces in the fused decode step (the key's scatter into the tail, the mean, the `1 + w`
//! norm, candle's half-split `rope` over the first values, the block's scatter), on the op's
//! cases (tests/common/indexer_pool.rs) at every projection dtype; rows past their buffers
//! write nothing; shapes the kernels do not take are refused in one line.
//!
//! Gate: the tail bit for bit (a copy of the key), the block row within 4 ulps of max |value|
//! (the norm's sum of squares is added in another order than candle's), every other row
//! untouched.

mod common;

use candle_core::{DType, Device, Tensor, D};
use common::indexer_pool::{cases, out_of_range_cases, Case, Inputs, DTYPES};
use gdn_ops::ops::indexer_pool::{indexer_pool, PoolCall};

/// The composed ops on the case's inputs: (tail, blocks) after the step.
fn composed(c: &Case, x: &Inputs) -> (Vec<f32>, Vec<f32>) {
    let key =
        x.qk.narrow(1, x.key_offset, c.dim)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
    let tail = x.tail.copy().unwrap();
    tail.slice_set(&key, 0, c.tail_row).unwrap();
    let pooled = tail.mean_keepdim(0).unwrap();
    let ms = pooled.sqr().unwrap().mean_keepdim(1).unwrap();
    let inv = ((ms + x.eps as f64).unwrap().sqrt().unwrap())
        .recip()
        .unwrap();
    let normed = pooled
        .broadcast_mul(&inv)
        .unwrap()
        .broadcast_mul(&x.norm)
        .unwrap()
        .reshape((1, 1, 1, c.dim))
        .unwrap();
    let rotated = candle_nn::rotary_emb::rope(
        &normed
            .narrow(D::Minus1, 0, c.rope_dims)
            .unwrap()
            .contiguous()
            .unwrap(),
        &x.cos,
        &x.sin,
    )
    .unwrap();
    let key_out = Tensor::cat(
        &[
            &rotated,
            &normed
                .narrow(D::Minus1, c.rope_dims, c.dim - c.rope_dims)
                .unwrap(),
        ],
        D::Minus1,
    )
    .unwrap()
    .reshape((1, c.dim))
    .unwrap();
    let blocks = x.blocks.copy().unwrap();
    blocks.slice_set(&key_out, 0, c.block_row).unwrap();
    let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    (flat(&tail), flat(&blocks))
}

#[test]
fn twin_matches_the_composed_ops() {
    for (i, c) in cases().into_iter().enumerate() {
        for dtype in DTYPES {
            let x = c.inputs(dtype, 0x1d_e000 + i as u64);
            let (want_tail, want_blocks) = composed(&c, &x);
            let before = x.buffers();
            indexer_pool(&x.call()).unwrap();
            let (tail, blocks) = x.buffers();
            let what = format!("{c:?} {dtype:?}");
            assert_eq!(tail, want_tail, "{what}: tail");
            let row = c.block_row * c.dim..(c.block_row + 1) * c.dim;
            let scale = want_blocks[row.clone()]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            for (j, (got, want)) in blocks.iter().zip(&want_blocks).enumerate() {
                if row.contains(&j) {
                    assert!(
                        (got - want).abs() <= 4.0 * f32::EPSILON * scale,
                        "{what}: block value {} {got} against {want}",
                        j - row.start
                    );
                } else {
                    assert_eq!(
                        got.to_bits(),
                        before.1[j].to_bits(),
                        "{what}: block value {j} moved"
                    );
                }
            }
        }
    }
}

#[test]
fn rows_past_the_buffers_write_nothing() {
    for c in out_of_range_cases() {
        let x = c.inputs(DType::BF16, 7);
        let before = x.buffers();
        indexer_pool(&x.call()).unwrap();
        assert_eq!(x.buffers(), before, "{c:?}");
    }
}

#[test]
fn shapes_without_a_kernel_are_refused_in_one_line() {
    let c = cases()[0];
    let x = c.inputs(DType::F32, 1);
    let wide = Tensor::zeros((1, c.dim / 2 + 1), DType::F32, &Device::Cpu).unwrap();
    let short_qk = x.qk.narrow(1, 0, x.key_offset + c.dim - 1).unwrap();
    let f16_tail = x.tail.to_dtype(DType::F16).unwrap();
    let strided = x.tail.narrow(1, 0, 8).unwrap();
    let bad: [(&str, PoolCall); 4] = [
        (
            "rotated over",
            PoolCall {
                cos: &wide,
                ..x.call()
            },
        ),
        (
            "qk",
            PoolCall {
                qk: &short_qk,
                ..x.call()
            },
        ),
        (
            "tail must be contiguous f32",
            PoolCall {
                tail: &f16_tail,
                ..x.call()
            },
        ),
        (
            "blocks",
            PoolCall {
                blocks: &strided,
                ..x.call()
            },
        ),
    ];
    for (want, call) in bad {
        let e = indexer_pool(&call).unwrap_err().to_string();
        assert!(
            e.starts_with("indexer_pool: ") && e.contains(want) && !e.contains('\n'),
            "{e}"
        );
    }
}
