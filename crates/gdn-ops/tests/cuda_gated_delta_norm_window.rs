//! The CUDA kernels `gated_delta_norm_window_*` (kernels/gated_delta_norm.cu) over the op's
//! cases of two tokens or more (tests/common/gated_delta_norm_window.rs: the plain op's, with
//! Qwen3-Next-80B's verify pass of 4 tokens), every InT/StT instantiation, both gates:
//!
//! - **bit for bit** T one-token launches of `gated_delta_norm_*` on the GPU with the state
//!   copied after each (what the per-token verify window runs): the output and the state
//!   after every token; speculative greedy must equal plain greedy exactly;
//! - against the CPU twin with the plain op's CUDA gates (tests/cuda_gated_delta_norm.rs):
//!   max |got − want| / max |want|, f32 to 2e-5, an f16/bf16 output twice the dtype's
//!   tolerance, a bf16 state the dtype's; the output of a bf16 state twice the state's (it is
//!   read from the rounded state).
//!
//! Built only with the `cuda` feature and run on the GPU machine.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device};
use common::gated_delta_norm::norm_tensors;
use common::gated_delta_norm_window::{cases, differences, one_launch, per_token};
use common::{gpu, rel_max, tolerance, Rng};
use gdn_ops::ops::gated_delta_norm::Gate;

#[test]
fn window_kernel_is_t_one_token_launches_bit_for_bit() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_3E7D);
    let (mut failures, mut runs) = (vec![], 0);
    for (i, c) in cases().into_iter().enumerate() {
        for (j, dtype) in [DType::F32, DType::F16, DType::BF16]
            .into_iter()
            .enumerate()
        {
            for (l, st) in [DType::F32, DType::BF16].into_iter().enumerate() {
                let gate = [Gate::Silu, Gate::Sigmoid][(i + j + l) % 2];
                let seed = rng.next() | 1;
                let x = norm_tensors(&mut Rng::xorshift(seed), c.d, dtype, st);
                let got = one_launch(&dev, &x, c.d, gate);
                let steps = per_token(&dev, &x, c.d, gate);
                let twin = one_launch(&Device::Cpu, &x, c.d, gate);
                runs += 1;
                let what = format!("{:?} {dtype:?}/{st:?} {gate:?} (seed {seed:#x})", c.d);
                for bad in differences(&got, &steps) {
                    failures.push(format!("{what}: against one-token launches: {bad}"));
                }
                // The output is read from the state rounded to StT after every token: with a
                // bf16 state it carries the state's rounding (one element rounded the other
                // way on the two sides moves an f32 output by ~4e-4 of its max at T = 37,
                // measured on the H200), so its gate is the coarser of the two dtypes'.
                let out_tol = 2.0 * tolerance(dtype).max(tolerance(st));
                let mut worst = vec![("out", rel_max(&got.out, &twin.out), out_tol)];
                for (a, b) in got.states.iter().zip(&twin.states) {
                    worst.push(("state", rel_max(a, b), tolerance(st)));
                }
                for (name, e, tol) in worst {
                    if e.is_nan() || e > tol {
                        failures.push(format!(
                            "{what}: {name} rel err {e:e} > {tol:e} against the CPU twin"
                        ));
                    }
                }
            }
        }
    }
    eprintln!("{runs} cases");
    common::assert_no_failures(&failures, runs, "cases fail");
}
