//! The CUDA greedy pick (`kernels/greedy_pick.cu`) against its CPU twin, for every
//! instantiation, over the op's cases (tests/common/greedy_pick.rs): the model's vocabulary,
//! several rows, odd lengths, ties and non-finite values. Built only with the `cuda` feature and run on the GPU machine
//! (scripts/gpu/test-cuda.sh); without a CUDA device every test fails.
//!
//! Gate: the `[N, 2]` words equal to the twin's (a maximum and a count are exact).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{Device, Tensor};
use common::gpu;
use common::greedy_pick::{cases, Values, DTYPES};
use gdn_ops::ops::greedy_pick::greedy_pick;

fn words(t: &Tensor) -> Vec<Vec<u32>> {
    t.to_device(&Device::Cpu).unwrap().to_vec2::<u32>().unwrap()
}

fn assert_matches_twin(logits: &Tensor, dev: &Device, what: &str) {
    let want = greedy_pick(logits).unwrap();
    let got = greedy_pick(&logits.to_device(dev).unwrap()).unwrap();
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    assert_eq!(words(&got), words(&want), "{what}");
}

/// The op's random rows (every value kind but ties and non-finite values).
#[test]
fn greedy_pick_matches_the_cpu_twin() {
    run_cases(|v| matches!(v, Values::Continuous | Values::MaxLast));
}

/// The op's tied rows, and its rows with NaN and ±Inf.
#[test]
fn greedy_pick_ties_and_non_finite_values_match_the_cpu_twin() {
    run_cases(|v| !matches!(v, Values::Continuous | Values::MaxLast));
}

fn run_cases(kinds: impl Fn(Values) -> bool) {
    let dev = gpu();
    for (i, c) in cases().into_iter().enumerate() {
        if !kinds(c.values) {
            continue;
        }
        for (dt, dtype) in DTYPES.iter().enumerate() {
            let what = format!("{dtype:?} {c:?}");
            assert_matches_twin(&c.logits(i, dt), &dev, &what);
        }
    }
}
