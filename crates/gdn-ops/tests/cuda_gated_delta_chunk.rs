//! The chunked CUDA kernels `kernels/gated_delta_chunk.cu` (three passes on TF32 tensor cores,
//! through `gated_delta_update_chunked`: full chunks of 64 tokens, the tail by the recurrence
//! kernel)
//! against the token-by-token CPU twin, for every InT/StT instantiation, on fresh random
//! inputs at the models' head shapes: T with no chunk, a tail only, whole chunks, chunks and a
//! tail, padding masks. Built only with the `cuda` feature and run on the GPU machine; without
//! a CUDA device every test fails.
//!
//! Measure: max |got − want| / max |want| (NaN fails): f32 to 1e-5 (issue 17's gate for the
//! chunked form); an f16 or bf16 y or a bf16 state, rounded on each side from nearby f32
//! values, to the usual 1e-3 / 8e-3 (`common::tolerance`).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::{gpu, rel_max, tolerance, Rng};
use gdn_ops::{gated_delta_update_chunked, gated_delta_update_in, GdnForm};

fn tol(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 1e-5,
        d => tolerance(d),
    }
}

#[test]
fn chunked_kernel_matches_the_recurrence() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0xC4_0C_6D);
    // (B, T, Hk, Hv, Dk, Dv, masked)
    let shapes = [
        (1, 1, 16, 32, 128, 128, false),
        (1, 63, 16, 32, 128, 128, false),
        (1, 64, 16, 32, 128, 128, false),
        (1, 65, 16, 32, 128, 128, false),
        (1, 200, 16, 32, 128, 128, false),
        (1, 512, 16, 32, 128, 128, false),
        // Qwen3.5 397B: 64 value heads.
        (1, 130, 16, 64, 128, 128, false),
        (2, 130, 2, 4, 128, 128, true),
        (1, 64, 1, 2, 192, 128, false),
        (1, 128, 1, 2, 256, 32, false),
        (2, 70, 1, 3, 64, 64, true),
        // The largest value head dim the chunk passes take.
        (1, 128, 2, 2, 64, 256, true),
    ];
    for &(b, t, hk, hv, dk, dv, masked) in &shapes {
        for in_dtype in [DType::F32, DType::F16, DType::BF16] {
            for st_dtype in [DType::F32, DType::BF16] {
                let seed = rng.next();
                let mut r = Rng::xorshift(seed | 1);
                let c = |x: Tensor| x.to_dtype(in_dtype).unwrap();
                // L2-normalised keys and queries, q scaled by 1/sqrt(Dk), as the model feeds them.
                let unit = |x: Tensor| {
                    let norm = x.sqr().unwrap().sum_keepdim(3).unwrap().sqrt().unwrap();
                    x.broadcast_div(&norm).unwrap()
                };
                let q =
                    c((unit(r.tensor(&[b, t, hk, dk], -1.0, 1.0)) / (dk as f64).sqrt()).unwrap());
                let k = c(unit(r.tensor(&[b, t, hk, dk], -1.0, 1.0)));
                let v = c(r.tensor(&[b, t, hv, dv], -1.0, 1.0));
                let g = r.tensor(&[b, t, hv], 0.6, 1.0);
                let beta = r.tensor(&[b, t, hv], 0.05, 0.95);
                let state = r
                    .tensor(&[b, hv, dv, dk], -0.5, 0.5)
                    .to_dtype(st_dtype)
                    .unwrap();
                // Batch 0 left-padded by a third, batch 1 with every fourth token padded.
                let mask = masked.then(|| {
                    let m: Vec<f32> = (0..b * t)
                        .map(|i| {
                            let (bi, ti) = (i / t, i % t);
                            let pad = if bi == 0 { ti < t / 3 } else { ti % 4 == 1 };
                            if pad {
                                0.0
                            } else {
                                1.0
                            }
                        })
                        .collect();
                    Tensor::from_vec(m, (b, t), &Device::Cpu).unwrap()
                });
                let run = |dev: &Device, chunked: bool| {
                    let up = |x: &Tensor| x.to_device(dev).unwrap();
                    // A copy: on the CPU `to_device` shares storage.
                    let st = state.to_device(dev).unwrap().copy().unwrap();
                    let m = mask.as_ref().map(up);
                    let (q, k, v, g, beta) = (up(&q), up(&k), up(&v), up(&g), up(&beta));
                    // The reference is the token-by-token recurrence (on the CPU the length
                    // alone would pick the CPU's chunked form).
                    let y = if chunked {
                        gated_delta_update_chunked(&q, &k, &v, &g, &beta, &st, m.as_ref())
                    } else {
                        gated_delta_update_in(
                            GdnForm::Recurrent,
                            &q,
                            &k,
                            &v,
                            &g,
                            &beta,
                            &st,
                            m.as_ref(),
                        )
                    }
                    .unwrap();
                    (y, st)
                };
                let (want, want_state) = run(&Device::Cpu, false);
                let (got, got_state) = run(&dev, true);
                let what = format!(
                    "gated_delta_chunk B{b} T{t} Hk{hk} Hv{hv} Dk{dk} Dv{dv} mask={masked} {in_dtype:?}/{st_dtype:?} (seed {seed:#x})"
                );
                assert_eq!(got.dtype(), in_dtype, "{what}: y dtype");
                assert_eq!(got_state.dtype(), st_dtype, "{what}: state dtype");
                for (name, e, tol) in [
                    ("y", rel_max(&got, &want), tol(in_dtype)),
                    ("state", rel_max(&got_state, &want_state), tol(st_dtype)),
                ] {
                    eprintln!("{what}: {name} rel err {e:.2e} (tol {tol:.0e})");
                    assert!(e <= tol, "{what}: {name} rel err {e:e} > {tol:e}");
                }
            }
        }
    }
}
