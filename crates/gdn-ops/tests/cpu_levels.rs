//! Every CPU level this machine runs ([`Level::supported_levels`]) against the portable one,
//! through the public ops, with the level pinned as the model pins it
//! ([`gdn_ops::simd::select_level`]): the affine products of 4-bit and 8-bit matrices in f32
//! (decode and prefill shapes), the q8 mode's products in both layouts (one activation row and
//! a prompt's), and the gated delta rule in both forms.
//!
//! The q8 kernels compute exact integer sums and the portable kernels' float steps in their
//! order, so they must agree bit for bit. The f32 loops are one source compiled per level; the
//! gated delta's chunked form fuses its multiply-adds only where the level has FMA, so it is
//! held to float rounding.
//!
//! The level is process-wide: this file has one test, so nothing else in its binary runs
//! while it switches levels.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{rel_max, values, Rng};
use gdn_ops::ops::affine::q8::{rows_dot, Q8Row};
use gdn_ops::ops::affine::{AffineMatrix, AffineTensor};
use gdn_ops::simd::{select_level, Level};
use gdn_ops::{gated_delta_update_in, GdnForm};

/// Everything a level computes here, in f32 (the q8 products' bits are kept as they are).
struct Outputs {
    /// `(what, values)`: compared bit for bit.
    exact: Vec<(String, Vec<f32>)>,
    /// `(what, tensor)`: compared to float rounding.
    close: Vec<(String, Tensor)>,
}

fn random_matrix(seed: u64, bits: usize, shape: [usize; 3], params: DType) -> AffineMatrix {
    common::random_matrix(&mut Rng::new(seed), bits, 64, shape, params)
}

fn uniform(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.uniform(-2.0, 2.0)).collect()
}

/// The f32 products of 4-bit and 8-bit matrices: one activation row (the matvec) and a
/// prompt's worth (dequantize and GEMM).
fn affine_products(out: &mut Outputs) {
    let (rows, cols) = (48, 512);
    for bits in [4, 8] {
        let m = random_matrix(bits as u64, bits, [1, rows, cols], DType::BF16);
        let t = AffineTensor::upload(&m, &Device::Cpu).unwrap();
        for tokens in [1, 40] {
            let x = Tensor::from_vec(
                uniform(10 + tokens as u64, tokens * cols),
                (tokens, cols),
                &Device::Cpu,
            )
            .unwrap();
            let y = t.matmul_t(&x).unwrap();
            out.exact.push((
                format!("{bits}-bit f32 product, {tokens} tokens"),
                values(&y),
            ));
        }
    }
}

/// The q8 mode's products in the plain and the interleaved layout: one activation row
/// (decode) and six (a prompt: a block of four and two alone).
fn q8_products(out: &mut Outputs) {
    // Two blocks and five tail rows; bf16 and f32 scales.
    let (rows, cols, group) = (37, 640, 64);
    for params in [DType::BF16, DType::F32] {
        let plain = random_matrix(3, 4, [1, rows, cols], params);
        let interleaved = plain.clone().into_q8_interleaved();
        for n in [1, 6] {
            let x = uniform(20 + n as u64, n * cols);
            let xq: Vec<Q8Row> = x.chunks(cols).map(Q8Row::quantize).collect();
            let sums: Vec<f32> = x.chunks(group).map(|g| g.iter().sum()).collect();
            for (layout, m) in [("plain", &plain), ("interleaved", &interleaved)] {
                let mut y = vec![0f32; rows * n];
                rows_dot(m, 0, rows, &xq, &sums, &mut y);
                out.exact.push((
                    format!("q8 {layout}, {params:?} params, {n} activation rows"),
                    y,
                ));
            }
        }
    }
}

/// The gated delta rule in both forms over a prompt, and one decode step.
fn gated_delta(out: &mut Outputs) {
    let dev = Device::Cpu;
    let (b, hk, hv, dk, dv) = (1, 2, 4, 32, 32);
    for (t, form) in [
        (1, GdnForm::Recurrent),
        (70, GdnForm::Recurrent),
        (70, GdnForm::Chunked),
    ] {
        let mut rng = Rng::new(40 + t as u64);
        let mut r = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
            (0..n).map(|_| rng.uniform(lo, hi)).collect()
        };
        let unit = |mut x: Vec<f32>, scale: f32| {
            for h in x.chunks_exact_mut(dk) {
                let n = h.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
                h.iter_mut().for_each(|v| *v *= scale / n);
            }
            Tensor::from_vec(x, (b, t, hk, dk), &dev).unwrap()
        };
        let q = unit(r(b * t * hk * dk, -1.0, 1.0), 1.0 / (dk as f32).sqrt());
        let k = unit(r(b * t * hk * dk, -1.0, 1.0), 1.0);
        let v = Tensor::from_vec(r(b * t * hv * dv, -1.0, 1.0), (b, t, hv, dv), &dev).unwrap();
        let g = Tensor::from_vec(r(b * t * hv, 0.8, 1.0), (b, t, hv), &dev).unwrap();
        let beta = Tensor::from_vec(r(b * t * hv, 0.0, 1.0), (b, t, hv), &dev).unwrap();
        let state =
            Tensor::from_vec(r(b * hv * dv * dk, -0.5, 0.5), (b, hv, dv, dk), &dev).unwrap();
        let y = gated_delta_update_in(form, &q, &k, &v, &g, &beta, &state, None).unwrap();
        let what = format!("gated delta {form:?}, {t} tokens");
        out.close.push((format!("{what}: y"), y));
        out.close.push((format!("{what}: state"), state));
    }
}

fn run_at(level: Level) -> Outputs {
    select_level(Some(level)).unwrap();
    let mut out = Outputs {
        exact: vec![],
        close: vec![],
    };
    affine_products(&mut out);
    q8_products(&mut out);
    gated_delta(&mut out);
    select_level(None).unwrap();
    out
}

#[test]
fn every_supported_level_computes_what_the_portable_one_does() {
    let want = run_at(Level::Portable);
    let levels = Level::supported_levels();
    eprintln!(
        "levels this CPU runs: {:?}",
        levels.iter().map(|l| l.name()).collect::<Vec<_>>()
    );
    // A level the CPU lacks is refused, naming what it lacks, and the level stays as it was.
    for level in Level::ALL.into_iter().filter(|l| !levels.contains(l)) {
        let why = level.missing().unwrap();
        eprintln!("{}: not run ({why})", level.name());
        let e = select_level(Some(level)).unwrap_err();
        assert!(e.contains(level.name()) && e.contains(&why), "{e}");
        assert_eq!(gdn_ops::simd::level(), Level::best());
    }
    for level in levels.into_iter().filter(|&l| l != Level::Portable) {
        let got = run_at(level);
        for ((what, a), (_, b)) in got.exact.iter().zip(&want.exact) {
            assert_eq!(a.len(), b.len(), "{}: {what}", level.name());
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_eq!(
                    x.to_bits(),
                    y.to_bits(),
                    "{}: {what}, value {i}: {x} vs portable {y}",
                    level.name()
                );
            }
        }
        for ((what, a), (_, b)) in got.close.iter().zip(&want.close) {
            let e = rel_max(a, b);
            assert!(e <= 1e-5, "{}: {what}: {e:e} from portable", level.name());
        }
    }
}
