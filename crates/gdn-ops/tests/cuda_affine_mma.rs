//! The tensor-core decode products (`affine_mma_*`, kernels/affine_mma.cu) on CUDA: at both
//! models' decode shapes and over the affine cases they take, against the CPU twin and the
//! streamed kernels (`DecodeProducts::Streamed`, the reference) on the same inputs. Built only
//! with the `cuda` feature and run on the GPU machine; without a CUDA device every test fails.
//!
//! Measure: ‖got − want‖ / ‖want‖ over all elements (NaN fails), 8e-3 for bf16 outputs, as
//! tests/cuda_kernels.rs holds every bf16 product: the kernels sum in f32 on the tensor core in
//! another order than the twin, so bits differ, within one bf16 rounding of the output. The
//! kernels' own sums are fixed: a second run gives the same bits.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::affine::{self, Gather, Kind};
use common::dtype::Ty;
use common::{assert_rel_err, gpu, rel_l2, values};
use gdn_ops::ops::affine::{decode_products_scope as scope, mma, DecodeProducts};

const BF16_TOLERANCE: f32 = 8e-3;

fn bits(t: &Tensor) -> Vec<u32> {
    values(t).iter().map(|v| v.to_bits()).collect()
}

/// One case on the CPU twin, then on the GPU under each choice: [twin, streamed, auto, auto
/// again].
fn outputs(dev: &Device, i: usize, c: &affine::Case) -> [Tensor; 4] {
    let x = affine::inputs(c, affine::seed(i));
    let cpu = gdn_ops::ops::affine::AffineTensor::upload(&x.m, &Device::Cpu).unwrap();
    let gpu_m = gdn_ops::ops::affine::AffineTensor::upload(&x.m, dev).unwrap();
    let want = x.run(c, &cpu, &Device::Cpu);
    let streamed = {
        let _s = scope(DecodeProducts::Streamed);
        x.run(c, &gpu_m, dev)
    };
    let _s = scope(DecodeProducts::Auto);
    let auto = x.run(c, &gpu_m, dev);
    let again = x.run(c, &gpu_m, dev);
    [want, streamed, auto, again]
}

/// Checks one case; returns whether the tensor-core kernel's bits differed from the streamed
/// kernel's anywhere (evidence that it ran).
fn check(dev: &Device, i: usize, c: &affine::Case) -> bool {
    let [want, streamed, auto, again] = outputs(dev, i, c);
    let what = c.label();
    assert_rel_err(
        &format!("{what}: tensor cores vs the CPU twin"),
        rel_l2(&auto, &want),
        BF16_TOLERANCE,
    );
    assert_rel_err(
        &format!("{what}: streamed vs the CPU twin"),
        rel_l2(&streamed, &want),
        BF16_TOLERANCE,
    );
    assert_eq!(bits(&auto), bits(&again), "{what}: a second run's bits");
    bits(&auto) != bits(&streamed)
}

/// Qwen3-Next-80B-A3B's and Qwen3.8-Flash-Next's decode products, one token (the experts'
/// over 11 slots), bf16 activations and scales, groups of 64.
fn decode_shapes() -> Vec<affine::Case> {
    let ty = (Ty::Bf16, Ty::Bf16);
    let dense = |rows, cols| {
        affine::Case::new(
            Kind::Products,
            ty,
            (4, 64),
            [1, rows, cols],
            1,
            Gather::Dense,
        )
    };
    let experts = |kind, rows, cols, gather| {
        affine::Case::new(kind, ty, (4, 64), [64, rows, cols], 1, gather)
    };
    vec![
        dense(12352, 2048),
        dense(2048, 4096),
        experts(Kind::Swiglu, 1024, 2048, Gather::PerToken { slots: 11 }),
        experts(Kind::Products, 2048, 512, Gather::PerSlot { slots: 11 }),
        dense(16480, 2560),
        dense(2560, 6144),
        dense(13312, 2560),
        experts(Kind::Swiglu, 1280, 2560, Gather::PerToken { slots: 11 }),
        experts(Kind::Products, 2560, 640, Gather::PerSlot { slots: 11 }),
    ]
}

/// At every decode shape `auto` is within tolerance and repeats its bits; where it prefers the
/// tensor cores their sums round differently from the streamed kernels' somewhere (evidence
/// that they ran: a shape this large always has an output on a rounding boundary), and where it
/// keeps the streamed kernels (Qwen3-Next-80B's 2 048- and 4 096-column projections) the bits
/// are theirs. (The H200 run of the seventeenth session had the first form of this test, which
/// expected the tensor cores on all 9 shapes: it failed at that final count, as the rule
/// implies with 3 shapes streamed, after every shape passed the tolerance and repeat checks.
/// This form has not run on a GPU yet.)
#[test]
fn decode_shapes_match_the_twin_and_the_streamed_kernels() {
    let dev = gpu();
    let mut on_tensor_cores = 0;
    for (i, c) in decode_shapes().iter().enumerate() {
        assert!(
            mma::covers(c.bits, c.group, c.cols, DType::BF16),
            "{}",
            c.label()
        );
        let preferred = mma::preferred(c.bits, c.group, c.cols, c.outputs(), DType::BF16);
        let differed = check(&dev, i, c);
        assert_eq!(differed, preferred, "{}: auto's kernel", c.label());
        on_tensor_cores += usize::from(preferred);
    }
    assert_eq!(on_tensor_cores, 6, "the shapes on the tensor cores");
}

#[test]
fn the_affine_cases_they_take_match_the_twin() {
    let dev = gpu();
    let mut taken = 0;
    for kind in [Kind::Products, Kind::Swiglu] {
        for (i, c) in affine::cases_of(kind) {
            if !mma::preferred(c.bits, c.group, c.cols, c.outputs(), c.x.dtype()) {
                continue;
            }
            check(&dev, i, &c);
            taken += 1;
        }
    }
    assert!(taken > 0, "no affine case is a tensor-core one");
    eprintln!("{taken} affine cases on the tensor cores");
}

/// A product of several rows (a verify pass's, a batched step's row products; two tokens'
/// gathered experts) gives each row the bits it gets alone on the tensor cores, as speculative
/// decoding and batching need.
#[test]
fn rows_get_their_bits_alone() {
    let dev = gpu();
    let _s = scope(DecodeProducts::Auto);
    let ty = (Ty::Bf16, Ty::Bf16);
    let dense = affine::Case::new(
        Kind::Products,
        ty,
        (4, 64),
        [1, 1000, 2560],
        4,
        Gather::Dense,
    );
    let experts = affine::Case::new(
        Kind::Swiglu,
        ty,
        (4, 64),
        [16, 1280, 2560],
        2,
        Gather::PerToken { slots: 11 },
    );
    for (i, c) in [dense, experts].iter().enumerate() {
        assert!(mma::preferred(
            c.bits,
            c.group,
            c.cols,
            c.outputs(),
            DType::BF16
        ));
        let x = affine::inputs(c, affine::seed(100 + i));
        let w = gdn_ops::ops::affine::AffineTensor::upload(&x.m, &dev).unwrap();
        let all = bits(&x.run(c, &w, &dev));
        let per_token = all.len() / c.tokens;
        for t in 0..c.tokens {
            let ids = (c.gather != Gather::Dense)
                .then(|| x.ids[t * c.slots()..(t + 1) * c.slots()].to_vec());
            let one = affine::Case {
                tokens: 1,
                ids,
                ..c.clone()
            };
            let xt = affine::Inputs {
                m: x.m.clone(),
                x: x.x[t * c.cols..(t + 1) * c.cols].to_vec(),
                ids: one.ids.clone().unwrap_or_default(),
            };
            let alone = bits(&xt.run(&one, &w, &dev));
            assert_eq!(
                alone,
                all[t * per_token..(t + 1) * per_token],
                "{} token {t}",
                c.label()
            );
        }
    }
}
