//! The CUDA greedy pick (`kernels/greedy_pick.cu`) against its CPU twin, for every
//! instantiation: the model's vocabulary, several rows, odd lengths, ties and non-finite
//! values. Built only with the `cuda` feature and run on the GPU machine
//! (scripts/gpu/test-cuda.sh); without a CUDA device every test fails.
//!
//! Gate: the `[N, 2]` words equal to the twin's (a maximum and a count are exact).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::{gpu, Rng};
use gdn_ops::ops::greedy_pick::greedy_pick;

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn words(t: &Tensor) -> Vec<Vec<u32>> {
    t.to_device(&Device::Cpu).unwrap().to_vec2::<u32>().unwrap()
}

fn assert_matches_twin(logits: &Tensor, dev: &Device, what: &str) {
    let want = greedy_pick(logits).unwrap();
    let got = greedy_pick(&logits.to_device(dev).unwrap()).unwrap();
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    assert_eq!(words(&got), words(&want), "{what}");
}

#[test]
fn greedy_pick_matches_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_0501);
    for dtype in DTYPES {
        for (rows, vocab) in [(1, 151_936), (1, 248_320), (4, 5_000), (3, 1_025), (2, 1)] {
            let logits = rng.tensor_as(&[rows, vocab], -8.0, 8.0, dtype);
            assert_matches_twin(&logits, &dev, &format!("{dtype:?} N={rows} V={vocab}"));
        }
    }
}

#[test]
fn greedy_pick_ties_and_non_finite_values_match_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_0502);
    let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    for dtype in DTYPES {
        for (rows, vocab) in [(1, 151_936), (3, 9_999), (2, 3)] {
            // Two levels: the maximum repeats in every slice.
            let ties: Vec<f32> = (0..rows * vocab).map(|_| rng.below(2) as f32).collect();
            let ties = Tensor::from_vec(ties, (rows, vocab), &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            assert_matches_twin(&ties, &dev, &format!("ties {dtype:?} N={rows} V={vocab}"));
            // NaN and ±Inf scattered, the last value of each row the finite maximum.
            let mut v: Vec<f32> = (0..rows * vocab).map(|_| rng.uniform(-8.0, 8.0)).collect();
            for row in v.chunks_exact_mut(vocab) {
                for j in 0..5 {
                    row[rng.below(vocab)] = specials[j % 3];
                }
                row[vocab - 1] = 100.0;
            }
            let mixed = Tensor::from_vec(v, (rows, vocab), &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            assert_matches_twin(
                &mixed,
                &dev,
                &format!("non-finite {dtype:?} N={rows} V={vocab}"),
            );
        }
        let nan = Tensor::full(f32::NAN, (2, 4_000), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        assert_matches_twin(&nan, &dev, &format!("all NaN {dtype:?}"));
    }
}
