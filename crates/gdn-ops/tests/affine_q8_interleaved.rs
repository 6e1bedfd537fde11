//! The q8 mode's interleaved layout (`gdn_ops::ops::affine::q8_interleaved`) against the plain one:
//! the same products up to the float summation order (its kernel sums a pair's terms in
//! another order, see the module), bit for bit the same for a batch of activation rows and
//! for one row at a time, every row range (blocks of sixteen rows, tail rows, experts), and
//! the row accessors (dequantize, select, concat, gather) unchanged by the repacking.

mod common;

use candle_core::DType;
use common::Rng;
use gdn_ops::ops::affine::q8::{rows_dot, supports, Q8Row};
use gdn_ops::ops::affine::AffineMatrix;

/// A random `[experts, rows, cols]` matrix with `bits`-bit values and group `group`, its
/// scales and biases stored in `params`.
fn random_matrix(
    seed: u64,
    shape: [usize; 3],
    bits: usize,
    group: usize,
    params: DType,
) -> AffineMatrix {
    common::random_matrix(&mut Rng::new(seed), bits, group, shape, params)
}

/// `n` random activation rows: the rows, their q8 forms, their per-group sums.
fn activations(seed: u64, n: usize, cols: usize, group: usize) -> (Vec<f32>, Vec<Q8Row>, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let x: Vec<f32> = (0..n * cols).map(|_| rng.uniform(-3.0, 3.0)).collect();
    let xq = x.chunks(cols).map(Q8Row::quantize).collect();
    let sums = x.chunks(group).map(|g| g.iter().sum()).collect();
    (x, xq, sums)
}

/// `Σ_j |w_j x_j| + Σ_g |bias_g Σx_g|` of one stacked row: the scale of the summation error.
fn magnitude(m: &AffineMatrix, row: usize, x: &[f32]) -> f32 {
    let mut w = vec![0f32; m.cols];
    m.dequantize_row(row, &mut w);
    w.iter().zip(x).map(|(a, b)| (a * b).abs()).sum::<f32>()
}

const SHAPES: [[usize; 3]; 5] = [
    [1, 1024, 2048], // a block of the bench's dense projections
    [1, 16, 512],    // one whole block
    [1, 37, 512],    // two blocks and five tail rows
    [3, 21, 256],    // experts of a block and five rows each
    [2, 5, 1024],    // experts smaller than a block
];

/// Every shape, group size and parameter dtype: the interleaved products are the plain ones
/// within a few units in the last place of the row's magnitude, and the repacking is lossless.
#[test]
fn interleaved_products_match_the_plain_kernel() {
    for (s, &shape) in SHAPES.iter().enumerate() {
        for group in [64, 128] {
            for params in [DType::BF16, DType::F32, DType::F16] {
                let what = format!("{shape:?}, group {group}, {params:?}");
                let plain = random_matrix(7 + s as u64, shape, 4, group, params);
                let il = plain.clone().into_q8_interleaved();
                assert!(il.q8_interleaved().is_some(), "{what}: not interleaved");
                let cols = shape[2];
                let n = 6; // a block of four activation rows and two alone
                let (x, xq, sums) = activations(100 + s as u64, n, cols, group);
                let total = shape[0] * shape[1];
                let (mut want, mut got) = (vec![0f32; total * n], vec![0f32; total * n]);
                rows_dot(&plain, 0, total, &xq, &sums, &mut want);
                rows_dot(&il, 0, total, &xq, &sums, &mut got);
                for r in 0..total {
                    for j in 0..n {
                        let (a, b) = (got[r * n + j], want[r * n + j]);
                        let bound = 1e-5 * magnitude(&plain, r, &x[j * cols..(j + 1) * cols]);
                        assert!(
                            (a - b).abs() <= bound,
                            "{what}: row {r}, activation {j}: {a} vs {b} (bound {bound})"
                        );
                    }
                }
                // The row accessors read the interleaved words.
                let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
                for r in [0, total / 2, total - 1] {
                    plain.dequantize_row(r, &mut a);
                    il.dequantize_row(r, &mut b);
                    assert_eq!(a, b, "{what}: dequantized row {r}");
                }
            }
        }
    }
}

/// A prompt's products are a decoded token's: every activation row of a batch gets the bits
/// it gets alone, and every row range (unaligned starts, tails, single rows, across experts'
/// blocks) the bits of the whole product.
#[test]
fn interleaved_products_do_not_depend_on_the_batch_or_the_row_range() {
    let (shape, group) = ([3, 21, 512], 64);
    let m = random_matrix(11, shape, 4, group, DType::BF16).into_q8_interleaved();
    let total = shape[0] * shape[1];
    let gpr = shape[2] / group;
    let n = 9; // two blocks of four and one alone
    let (_, xq, sums) = activations(12, n, shape[2], group);
    let mut whole = vec![0f32; total * n];
    rows_dot(&m, 0, total, &xq, &sums, &mut whole);
    for j in 0..n {
        let mut alone = vec![0f32; total];
        rows_dot(
            &m,
            0,
            total,
            &xq[j..j + 1],
            &sums[j * gpr..(j + 1) * gpr],
            &mut alone,
        );
        for r in 0..total {
            let (a, b) = (alone[r], whole[r * n + j]);
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "row {r}, activation {j}: {a} vs {b}"
            );
        }
    }
    for (first, rows) in [
        (0, 1),
        (5, 23),
        (15, 2),
        (16, 16),
        (20, 1),
        (33, 30),
        (62, 1),
    ] {
        let mut part = vec![0f32; rows * n];
        rows_dot(&m, first, rows, &xq, &sums, &mut part);
        for (i, (a, b)) in part.iter().zip(&whole[first * n..]).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "rows {first}+{rows}, element {i}");
        }
    }
}

/// Only what the q8 kernel takes is interleaved (4-bit, groups of 64 or more); select, concat
/// and gather give the same rows from either layout and keep the interleaving.
#[test]
fn only_q8_matrices_are_interleaved_and_row_edits_keep_the_layout() {
    for (bits, group) in [(8, 64), (4, 32), (2, 64), (3, 64), (6, 128)] {
        let m = random_matrix(3, [1, 8, 256], bits, group, DType::BF16);
        assert!(!supports(&m));
        let m = m.into_q8_interleaved();
        assert!(m.q8_interleaved().is_none(), "{bits}-bit group {group}");
        let _ = m.packed(); // still plain
    }
    let plain = random_matrix(5, [2, 19, 256], 4, 64, DType::BF16);
    let il = plain.clone().into_q8_interleaved();
    let rows = |m: &AffineMatrix| -> Vec<Vec<f32>> {
        (0..m.experts * m.rows)
            .map(|r| {
                let mut out = vec![0f32; m.cols];
                m.dequantize_row(r, &mut out);
                out
            })
            .collect()
    };
    let pick = [18, 0, 7, 16];
    let (a, b) = (plain.select_rows(&pick), il.select_rows(&pick));
    assert!(b.q8_interleaved().is_some());
    assert_eq!(rows(&a), rows(&b), "select_rows");
    let single = random_matrix(6, [1, 19, 256], 4, 64, DType::BF16);
    let (one, two) = (single.select_rows(&[3]), single.select_rows(&[4, 5]));
    let (one_il, two_il) = (
        one.clone().into_q8_interleaved(),
        two.clone().into_q8_interleaved(),
    );
    let a = AffineMatrix::concat_rows(&[&one, &two]).unwrap();
    let b = AffineMatrix::concat_rows(&[&one_il, &two_il]).unwrap();
    assert!(b.q8_interleaved().is_some());
    assert_eq!(rows(&a), rows(&b), "concat_rows");
    // Stacked rows 37 (expert 1) and 2 (expert 0), as two experts of one row.
    let a = AffineMatrix::gather_stacked(&[(&plain, 37), (&plain, 2)], 2, 1).unwrap();
    let b = AffineMatrix::gather_stacked(&[(&il, 37), (&il, 2)], 2, 1).unwrap();
    assert!(b.q8_interleaved().is_some());
    assert_eq!(rows(&a), rows(&b), "gather_stacked");
}
