//! The CUDA kernels `kernels/gated_rms_norm.cu` against the CPU twin, for every instantiation
//! (f32, f16, bf16), on fresh random inputs: decode and prefill at the real head sizes and
//! edge sizes, with z as a slice of a merged projection output. Built only with the `cuda`
//! feature and run on the GPU machine; without a CUDA device every test fails.
//!
//! Measure: max |got − want| / max |want| (NaN fails): f32 to 2e-5, f16 and bf16 (rounded on
//! each side from nearby f32 values) to 1e-3 and 8e-3.
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor};
use gdn_ops::ops::gated_rms_norm::gated_rms_norm;

fn gpu() -> Device {
    Device::new_cuda(0).unwrap_or_else(|e| panic!("no CUDA device: {e}"))
}

/// xorshift64*: reproducible from the seed printed on failure.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn tensor(&mut self, shape: &[usize], lo: f32, hi: f32) -> Tensor {
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32))
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn rel_max(got: &Tensor, want: &Tensor) -> f32 {
    assert_eq!(got.dims(), want.dims());
    let (a, b) = (values(got), values(want));
    let scale = b
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    a.iter()
        .zip(&b)
        .map(|(x, y)| {
            if x.is_nan() {
                f32::INFINITY
            } else {
                (x - y).abs() / scale
            }
        })
        .fold(0f32, f32::max)
}

#[test]
fn gated_rms_norm_matches_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng(0x5EED_6A7E);
    // (B, T, Hv, Dv): decode, prefill, Dv not a multiple of 32, below 32, above 256.
    let shapes = [
        (1, 1, 32, 128),
        (4, 1, 64, 128),
        (1, 37, 48, 128),
        (2, 3, 3, 100),
        (1, 5, 1, 20),
        (2, 2, 2, 300),
    ];
    for &(b, t, hv, dv) in &shapes {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let seed = rng.next();
            let mut r = Rng(seed | 1);
            let y = r
                .tensor(&[b, t, hv, dv], -3.0, 3.0)
                .to_dtype(dtype)
                .unwrap();
            let proj = r
                .tensor(&[b, t, 3 * hv * dv + 7], -8.0, 8.0)
                .to_dtype(dtype)
                .unwrap();
            let w = r.tensor(&[dv], 0.5, 1.5).to_dtype(dtype).unwrap();
            let run = |dev: &Device| {
                let up = |x: &Tensor| x.to_device(dev).unwrap();
                let proj = up(&proj);
                gated_rms_norm(
                    &up(&y),
                    &proj.narrow(2, hv * dv + 3, hv * dv).unwrap(),
                    &up(&w),
                    1e-6,
                )
                .unwrap()
            };
            let (want, got) = (run(&Device::Cpu), run(&dev));
            let tol = match dtype {
                DType::BF16 => 8e-3,
                DType::F16 => 1e-3,
                _ => 2e-5,
            };
            let e = rel_max(&got, &want);
            let what = format!("gated_rms_norm B{b} T{t} Hv{hv} Dv{dv} {dtype:?} (seed {seed:#x})");
            eprintln!("{what}: rel err {e:.2e} (tol {tol:.0e})");
            assert!(e <= tol, "{what}: rel err {e:e} > {tol:e}");
        }
    }
}
