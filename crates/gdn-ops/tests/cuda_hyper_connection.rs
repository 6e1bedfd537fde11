//! The CUDA `hc_inject_norm_`, `hc_act_` and `hc_mix_{f32,f16,bf16}` kernels
//! (`kernels/hyper_connection.cu`) against the CPU twin, for every instantiation and every
//! form (injection, norm, both), over the op's cases (tests/common/hyper_connection.rs). Built
//! only with the `cuda` feature and run on the GPU machine (scripts/gpu/test-cuda.sh); without
//! a CUDA device every test fails.
//!
//! Gates: `sum`, `a` and `x` within 1 ulp of InT (`expf` may differ from the host's in its last
//! bit); `normed` within 1 ulp plus 1e-5 of max |normed|.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{Device, Tensor};
use common::hyper_connection::{inputs, runs, seed, FORMS};
use common::{close, gpu, tensor, values, TYPES};
use gdn_ops::ops::hyper_connection::{hc_act, hc_inject_norm, hc_mix};

const EPS: f32 = 1e-6;
/// The streams' sums and the mix (a gate or weight times a value, summed over streams) may
/// round differently on the GPU (fused multiply-adds, its `exp`): one H200 run measured at most
/// 1.2e-8 of max|ref| apart from the twin, where a wrong stream or weight is off by O(max|ref|).
/// The allowance is 1e-6 of max|ref| on top of one ulp of the value.
const SUM_REL: f32 = 1e-6;

#[test]
fn cuda_hyper_connection_matches_the_cpu_twin() {
    let gpu = gpu();
    let on_gpu = |t: &Tensor| t.to_device(&gpu).unwrap();
    let mut failures = vec![];
    for (i, (n, s, h), ty) in runs(&TYPES) {
        let x = inputs((n, s, h), ty, seed(i, ty));
        let hs = tensor(&x.hs, &[n, s * h], ty);
        let y = tensor(&x.y, &[n, h], ty);
        let g = tensor(&x.gate, &[n, s], ty);
        let w = Tensor::from_vec(x.weight.clone(), (s, h), &Device::Cpu).unwrap();
        let (hs_g, y_g, g_g, w_g) = (on_gpu(&hs), on_gpu(&y), on_gpu(&g), on_gpu(&w));
        for (inject, norm) in FORMS {
            let label = format!(
                "hc_inject_norm_{} N={n} S={s} H={h} inject={inject} norm={norm}",
                ty.name()
            );
            let (want_sum, want_normed) = hc_inject_norm(
                &hs,
                inject.then_some((&y, &g)),
                norm.then_some((&w, EPS)),
                s,
            )
            .unwrap();
            let (sum, normed) = hc_inject_norm(
                &hs_g,
                inject.then_some((&y_g, &g_g)),
                norm.then_some((&w_g, EPS)),
                s,
            )
            .unwrap();
            let err = close("sum", &values(&sum), &values(&want_sum), ty, 1.0, SUM_REL).or_else(
                || match (normed, want_normed) {
                    (Some(a), Some(b)) => close("normed", &values(&a), &values(&b), ty, 1.0, 1e-5),
                    (None, None) => None,
                    _ => Some("normed returned on one side only".into()),
                },
            );
            if let Some(e) = err {
                failures.push(format!("{label}: {e}"));
            }
        }
        let up = tensor(&x.up, &[n, s * h], ty);
        let normed = tensor(&x.normed, &[n, s * h], ty);
        let want = hc_mix(&up, &normed, s).unwrap();
        let got = hc_mix(&on_gpu(&up), &on_gpu(&normed), s).unwrap();
        if let Some(e) = close("x", &values(&got), &values(&want), ty, 1.0, SUM_REL) {
            failures.push(format!("hc_mix_{} N={n} S={s} H={h}: {e}", ty.name()));
        }
        let d = tensor(&x.down, &[n, h], ty);
        let want = hc_act(&d, s).unwrap();
        let got = hc_act(&on_gpu(&d), s).unwrap();
        if let Some(e) = close("a", &values(&got), &values(&want), ty, 4.0, 0.0) {
            failures.push(format!("hc_act_{} N={n} S={s} R={h}: {e}", ty.name()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
