//! The greedy pick's CPU twin (`gdn_ops::ops::greedy_pick`) against a plain reference written
//! from the spec (the finite values' maximum, then the first position holding it; a count of
//! the rest), on ties, NaN and Inf, odd row lengths and rows not a multiple of the kernels'
//! slices (the op's cases, tests/common/greedy_pick.rs); plus the input checks.

mod common;

use candle_core::{DType, Device, Tensor};
use common::greedy_pick::{cases, DTYPES};
use common::{values, Rng};
use gdn_ops::ops::greedy_pick::{greedy_pick, GreedyPickParams, BLOCK_VALUES, MAX_BLOCKS};

/// The spec, as directly as it reads: `[index, non-finite count]` per row.
fn reference(row: &[f32]) -> [u32; 2] {
    let nonfinite = row.iter().filter(|x| !x.is_finite()).count() as u32;
    let top = row
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .reduce(f32::max);
    let index = top.map_or(0, |t| row.iter().position(|&x| x == t).unwrap() as u32);
    [index, nonfinite]
}

fn pick(rows: &[Vec<f32>], dtype: DType) -> Vec<[u32; 2]> {
    let v = rows[0].len();
    let flat: Vec<f32> = rows.concat();
    let t = Tensor::from_vec(flat, (rows.len(), v), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let out = greedy_pick(&t).unwrap();
    assert_eq!(
        (out.dims(), out.dtype()),
        (&[rows.len(), 2][..], DType::U32)
    );
    out.to_vec2::<u32>()
        .unwrap()
        .into_iter()
        .map(|r| [r[0], r[1]])
        .collect()
}

/// Checks the twin on `rows` (f32 values already exact in `dtype`).
fn check(rows: &[Vec<f32>], dtype: DType, what: &str) {
    let got = pick(rows, dtype);
    for (n, row) in rows.iter().enumerate() {
        assert_eq!(got[n], reference(row), "{what}, {dtype:?}, row {n}");
    }
}

fn rounded(v: Vec<f32>, dtype: DType) -> Vec<f32> {
    Tensor::new(v, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// The op's cases (tests/common/greedy_pick.rs): random, tied and non-finite rows.
#[test]
fn twin_matches_the_reference_on_random_rows() {
    for (i, c) in cases().iter().enumerate() {
        for (dt, &dtype) in DTYPES.iter().enumerate() {
            let rows: Vec<Vec<f32>> = values(&c.logits(i, dt))
                .chunks(c.vocab)
                .map(<[f32]>::to_vec)
                .collect();
            check(&rows, dtype, &format!("{c:?}"));
        }
    }
}

#[test]
fn ties_go_to_the_lowest_index() {
    let row = vec![1.0, 3.0, -0.0, 3.0, 0.0, 3.0];
    assert_eq!(pick(&[row], DType::F32), [[1, 0]]);
    // -0 and +0 are equal: the first wins.
    assert_eq!(pick(&[vec![-1.0, -0.0, 0.0]], DType::F32), [[1, 0]]);
    assert_eq!(pick(&[vec![-1.0, 0.0, -0.0]], DType::F32), [[1, 0]]);
}

#[test]
fn non_finite_values_are_counted_and_never_picked() {
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let rows = vec![
        vec![nan, 1.0, 2.0, nan, 2.0],
        vec![1.0, inf, 5.0, -inf, 4.0],
        vec![-inf, -inf, -3.0, nan, -3.0],
        vec![nan, nan, nan, nan, nan],
        vec![inf, -inf, inf, nan, -inf],
        vec![-1e30, -f32::MAX, 0.5, 0.25, f32::MAX],
    ];
    for dtype in DTYPES {
        let rows: Vec<Vec<f32>> = rows.iter().map(|r| rounded(r.clone(), dtype)).collect();
        check(&rows, dtype, "non-finite");
    }
    assert_eq!(
        pick(&rows, DType::F32),
        [[2, 2], [2, 2], [2, 3], [0, 5], [0, 5], [4, 0]]
    );
    // f16 overflows: 1e30 and ±f32::MAX become ±Inf there.
    assert_eq!(pick(&rows[5..], DType::F16), [[2, 3]]);
    // Scattered through a vocabulary-sized row, the last value included.
    let mut rng = Rng::new(0x0A0A);
    let mut row: Vec<f32> = (0..151_936).map(|_| rng.uniform(-4.0, 4.0)).collect();
    for i in [0, 77, 1019, 1020, 50_000, 151_935] {
        row[i] = [nan, inf, -inf][i % 3];
    }
    row[151_934] = 9.0;
    check(&[row], DType::F32, "scattered");
}

#[test]
fn geometry_covers_every_row_in_at_most_max_blocks() {
    for vocab in [1, 2, 1023, 1024, 1025, 151_936, 248_320, 300_007, 1 << 20] {
        let p = GreedyPickParams::new(2, vocab);
        assert!((1..=MAX_BLOCKS as u32).contains(&p.blocks), "V={vocab}");
        assert!(p.blocks as usize * p.slice as usize >= vocab, "V={vocab}");
        assert!(
            (p.blocks as usize - 1) * (p.slice as usize) < vocab,
            "V={vocab}"
        );
        if vocab <= MAX_BLOCKS * BLOCK_VALUES {
            assert!(p.slice as usize <= BLOCK_VALUES, "V={vocab}");
        }
    }
    // The model's vocabulary: 149 blocks of 1020 values.
    let p = GreedyPickParams::new(1, 151_936);
    assert_eq!((p.blocks, p.slice), (149, 1020));
}

#[test]
fn empty_batches_and_bad_inputs() {
    let none = greedy_pick(&Tensor::zeros((0, 5), DType::F32, &Device::Cpu).unwrap()).unwrap();
    assert_eq!(none.dims(), [0, 2]);
    let err = |t: Tensor| greedy_pick(&t).expect_err("an error").to_string();
    assert!(err(Tensor::zeros(5, DType::F32, &Device::Cpu).unwrap()).contains("must be [N, V]"));
    assert!(err(Tensor::zeros((2, 0), DType::F32, &Device::Cpu).unwrap()).contains("empty rows"));
    assert!(err(Tensor::zeros((1, 4), DType::U32, &Device::Cpu).unwrap()).contains("no kernel"));
}
