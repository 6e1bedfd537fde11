//! The CUDA `add_rms_norm_{f32,f16,bf16}` kernels (`kernels/add_rms_norm.cu`) against the CPU
//! twin, for every instantiation, over the op's cases (tests/common/add_rms_norm.rs). Built only with the `cuda` feature and run on the GPU
//! machine (scripts/gpu/test-cuda.sh); without a CUDA device every test fails.
//!
//! Gates: `sum` bit for bit; `normed` within 1 ulp of InT plus 1e-5 of max |normed|.
#![cfg(feature = "cuda")]

mod common;

use common::add_rms_norm::{inputs, rows_cols, runs, seed};
use common::{close, gpu, tensor, values, TYPES};
use gdn_ops::ops::add_rms_norm::add_rms_norm;

#[test]
fn cuda_add_rms_norm_matches_the_cpu_twin() {
    let gpu = gpu();
    let mut failures = vec![];
    for (i, shape, ty, with_delta) in runs(&TYPES) {
        let (rows, cols) = rows_cols(shape);
        let x = inputs(shape, ty, seed(i, ty));
        let h = tensor(&x.residual, &[rows, cols], ty);
        let d = tensor(&x.delta, &[rows, cols], ty);
        let w = tensor(&x.weight, &[cols], ty);
        let delta = with_delta.then_some(&d);
        let (want_sum, want_normed) = add_rms_norm(&h, delta, &w, 1e-6).unwrap();
        let on_gpu = |t: &candle_core::Tensor| t.to_device(&gpu).unwrap();
        let d_gpu = delta.map(on_gpu);
        let (sum, normed) = add_rms_norm(&on_gpu(&h), d_gpu.as_ref(), &on_gpu(&w), 1e-6).unwrap();
        let label = format!(
            "add_rms_norm_{} N={rows} H={cols} delta={with_delta}",
            ty.name()
        );
        if let Some(e) = close(
            "normed",
            &values(&normed),
            &values(&want_normed),
            ty,
            1.0,
            1e-5,
        )
        .or_else(|| close("sum", &values(&sum), &values(&want_sum), ty, 0.0, 0.0))
        {
            failures.push(format!("{label}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
