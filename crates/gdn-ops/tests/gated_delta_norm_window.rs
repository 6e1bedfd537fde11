//! `gated_delta_norm_window` on the CPU (its twin): the T tokens in one call equal, bit for
//! bit, T one-token calls of the plain op with the state copied after each (outputs, the state
//! after every token, the final state), over the op's cases of two tokens or more, every
//! activation and state dtype, both gates; and a bad `after` is a one-line error.

mod common;

use candle_core::{DType, Device, Tensor};
use common::gated_delta_norm::{norm_tensors, z_of};
use common::gated_delta_norm_window::{cases, differences, one_launch, per_token};
use common::Rng;
use gdn_ops::ops::gated_delta_norm::Gate;
use gdn_ops::ops::gated_delta_norm_window::gated_delta_update_norm_window;

#[test]
fn one_call_is_t_one_token_calls_bit_for_bit() {
    let mut failures = vec![];
    let mut runs = 0;
    let mut rng = Rng::xorshift(0x3E7D_0A11);
    for (i, c) in cases().into_iter().enumerate() {
        for (j, dtype) in [DType::F32, DType::F16, DType::BF16]
            .into_iter()
            .enumerate()
        {
            for (l, st) in [DType::F32, DType::BF16].into_iter().enumerate() {
                let gate = [Gate::Silu, Gate::Sigmoid][(i + j + l) % 2];
                let x = norm_tensors(&mut Rng::xorshift(rng.next() | 1), c.d, dtype, st);
                let got = one_launch(&Device::Cpu, &x, c.d, gate);
                let want = per_token(&Device::Cpu, &x, c.d, gate);
                runs += 1;
                for bad in differences(&got, &want) {
                    failures.push(format!("{:?} {dtype:?}/{st:?} {gate:?}: {bad}", c.d));
                }
            }
        }
    }
    common::assert_no_failures(&failures, runs, "cases differ");
}

#[test]
fn a_bad_after_is_a_one_line_error() {
    let c = cases()[0];
    let d = c.d;
    let [q, k, v, g, beta, state, proj, w] =
        norm_tensors(&mut Rng::xorshift(7), d, DType::F32, DType::F32);
    let z = z_of(&proj, d);
    for (after, why) in [
        (
            Tensor::zeros((d.t, d.b, d.hv, d.dv, d.dk), DType::F32, &Device::Cpu).unwrap(),
            "after is",
        ),
        (
            Tensor::zeros((d.t - 1, d.b, d.hv, d.dv, d.dk), DType::BF16, &Device::Cpu).unwrap(),
            "the state's dtype",
        ),
    ] {
        let e = gated_delta_update_norm_window(
            &q,
            &k,
            &v,
            &g,
            &beta,
            &state,
            &z,
            &w,
            1e-6,
            Gate::Silu,
            &after,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("gated_delta_update_norm_window: ")
                && e.contains(why)
                && !e.contains('\n'),
            "{e}"
        );
    }
}
