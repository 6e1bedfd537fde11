//! The CUDA `hc_inject_norm_`, `hc_act_` and `hc_mix_{f32,f16,bf16}` kernels and
//! `hc_up_mix_<x>_<s>` (`kernels/hyper_connection.cu`) against the CPU twin, for every
//! instantiation and every form (injection, norm, both), over the op's cases
//! (tests/common/hyper_connection.rs). Built
//! only with the `cuda` feature and run on the GPU machine (scripts/gpu/test-cuda.sh); without
//! a CUDA device every test fails.
//!
//! `hc_inject_norm` runs on the kernel the host picks (at the decode shapes a stream row over
//! a thread-block cluster, `hc_inject_norm_cluster_*`); the cluster kernel is also compared
//! with the one-block kernel it splits.
//!
//! Gates: `sum`, `a` and `x` within 1 ulp of InT (`expf` may differ from the host's in its last
//! bit); `normed` within 1 ulp plus 1e-5 of max |normed|; `hc_up_mix`'s `x` within 2 ulps
//! plus 1e-5 of max |x| of the twin's and of the three CUDA kernels it replaces (the
//! product's f32 sum in another order can move a rounded logit by an ulp).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{Device, Tensor};
use common::hyper_connection::{
    inputs, runs, seed, up_mix_inputs, up_mix_runs, up_mix_seed, FORMS, SLOTS,
};
use common::{close, gpu, tensor, values, TYPES};
use gdn_ops::ops::affine::AffineTensor;
use gdn_ops::ops::hyper_connection::{
    hc_act, hc_inject_norm, hc_inject_norm_with, hc_inject_slots_norm, hc_mix, hc_up_mix,
    inject_uses_cluster, InjectKernel,
};

const EPS: f32 = 1e-6;
/// The streams' sums and the mix (a gate or weight times a value, summed over streams) may
/// round differently on the GPU (fused multiply-adds, its `exp`): one H200 run measured at most
/// 1.2e-8 of max|ref| apart from the twin, where a wrong stream or weight is off by O(max|ref|).
/// The allowance is 1e-6 of max|ref| on top of one ulp of the value.
const SUM_REL: f32 = 1e-6;

/// Where the GPU's `(sum, normed)` of an injection is off the twin's, if anywhere.
fn injection_off(
    (sum, normed): (Tensor, Option<Tensor>),
    (want_sum, want_normed): (Tensor, Option<Tensor>),
    ty: common::Ty,
) -> Option<String> {
    close("sum", &values(&sum), &values(&want_sum), ty, 1.0, SUM_REL).or_else(|| {
        match (normed, want_normed) {
            (Some(a), Some(b)) => close("normed", &values(&a), &values(&b), ty, 1.0, 1e-5),
            (None, None) => None,
            _ => Some("normed returned on one side only".into()),
        }
    })
}

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
            if let Some(e) = injection_off((sum, normed), (want_sum, want_normed), ty) {
                failures.push(format!("{label}: {e}"));
            }
        }
        // A MoE block's slots injected, with and without the next norm.
        let down = tensor(&x.slot_down, &[n, SLOTS, h], ty);
        let sw = Tensor::from_vec(x.slot_weights.clone(), (n, SLOTS), &Device::Cpu).unwrap();
        for norm in [true, false] {
            let label = format!(
                "hc_inject_slots_norm_{} N={n} S={s} H={h} norm={norm}",
                ty.name()
            );
            let (want_sum, want_normed) =
                hc_inject_slots_norm(&hs, (&down, &sw, &g), norm.then_some((&w, EPS)), s).unwrap();
            let (sum, normed) = hc_inject_slots_norm(
                &hs_g,
                (&on_gpu(&down), &on_gpu(&sw), &g_g),
                norm.then_some((&w_g, EPS)),
                s,
            )
            .unwrap();
            if let Some(e) = injection_off((sum, normed), (want_sum, want_normed), ty) {
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

/// The GPU's streaming multiprocessors, as the host's choice of kernel reads them.
fn gpu_sms(gpu: &Device) -> usize {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
    let Device::Cuda(dev) = gpu else {
        panic!("not a CUDA device")
    };
    let attribute = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
    dev.cuda_stream().context().attribute(attribute).unwrap() as usize
}

/// `hc_inject_norm_cluster_*` (a stream row over a cluster of blocks, the decode form) on
/// every case `inject_uses_cluster` gives it — the release's decode step (1 token, 4 streams
/// of 2 560) among them, a block's output and a MoE block's 11 slots injected, every form
/// and type — against the CPU twin (the gates above) and against the one-block kernel: `sum`
/// bit for bit (a column's arithmetic does not depend on the split), `normed` within 1 ulp
/// of f16/bf16 and 16 of f32 (only the sum of squares is added in another order: per block,
/// then the 8 partials in rank order; a partial from the wrong rank is off by O(1/8) of the
/// sum), and the same bits on a second call (a fixed order).
#[test]
fn cuda_inject_cluster_matches_the_twin_and_one_block() {
    let gpu = gpu();
    let sms = gpu_sms(&gpu);
    let on_gpu = |t: &Tensor| t.to_device(&gpu).unwrap();
    let mut failures = vec![];
    let mut clustered = vec![];
    for (i, (n, s, h), ty) in runs(&TYPES) {
        if !inject_uses_cluster(n * s, h, sms, InjectKernel::Auto) {
            continue;
        }
        clustered.push((n, s, h));
        let x = inputs((n, s, h), ty, seed(i, ty));
        let hs = tensor(&x.hs, &[n, s * h], ty);
        let y = tensor(&x.y, &[n, h], ty);
        let g = tensor(&x.gate, &[n, s], ty);
        let w = Tensor::from_vec(x.weight.clone(), (s, h), &Device::Cpu).unwrap();
        let down = tensor(&x.slot_down, &[n, SLOTS, h], ty);
        let sw = Tensor::from_vec(x.slot_weights.clone(), (n, SLOTS), &Device::Cpu).unwrap();
        let (hs_g, y_g, g_g, w_g) = (on_gpu(&hs), on_gpu(&y), on_gpu(&g), on_gpu(&w));
        let (down_g, sw_g) = (on_gpu(&down), on_gpu(&sw));
        // (label, y, slot weights, inject, norm): a block's output in every form, a MoE
        // block's slots with and without the norm.
        let plain = FORMS.map(|(inject, norm)| ("y", &y, &y_g, None, inject, norm));
        let slots =
            [true, false].map(|norm| ("slots", &down, &down_g, Some((&sw, &sw_g)), true, norm));
        for (what, y, y_g, slot_w, inject, norm) in plain.into_iter().chain(slots) {
            let label = format!(
                "hc_inject_norm_cluster_{} N={n} S={s} H={h} {what} inject={inject} norm={norm}",
                ty.name()
            );
            let call = |hs, y, g, sw, w, kernel| {
                let inject = inject.then_some((y, g));
                hc_inject_norm_with(hs, inject, sw, norm.then_some((w, EPS)), s, kernel).unwrap()
            };
            let want = call(&hs, y, &g, slot_w.map(|w| w.0), &w, InjectKernel::Auto);
            let on = |kernel| call(&hs_g, y_g, &g_g, slot_w.map(|w| w.1), &w_g, kernel);
            let (cluster, one) = (on(InjectKernel::Auto), on(InjectKernel::OneBlock));
            if let Some(e) = injection_off(cluster.clone(), want, ty) {
                failures.push(format!("{label}: against the twin: {e}"));
            }
            if values(&cluster.0) != values(&one.0) {
                failures.push(format!("{label}: sum differs from the one-block kernel's"));
            }
            if let (Some(c), Some(o)) = (&cluster.1, &one.1) {
                let ulps = if ty == common::Ty::F32 { 16.0 } else { 1.0 };
                let (c, o) = (values(c), values(o));
                if let Some(e) = close("normed vs one block", &c, &o, ty, ulps, 0.0) {
                    failures.push(format!("{label}: {e}"));
                }
                if values(&on(InjectKernel::Auto).1.unwrap()) != c {
                    failures.push(format!("{label}: normed differs run to run"));
                }
            }
        }
    }
    assert!(
        clustered.contains(&(1, 4, 2560)),
        "the release's decode shape did not take the cluster kernel ({sms} SMs)"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn cuda_up_mix_matches_the_cpu_twin_and_the_three_kernels() {
    let gpu = gpu();
    let mut failures = vec![];
    for (i, c, ty) in up_mix_runs(&TYPES) {
        let (n, s, h, r) = (c.tokens, c.streams, c.cols, c.rank);
        let x = up_mix_inputs(&c, ty, up_mix_seed(i, ty));
        let [w, w_g] = [&Device::Cpu, &gpu].map(|d| AffineTensor::upload(&x.m, d).unwrap());
        let d = tensor(&x.d, &[n, r], ty);
        let normed = tensor(&x.normed, &[n, s * h], ty);
        let (d_g, normed_g) = (d.to_device(&gpu).unwrap(), normed.to_device(&gpu).unwrap());
        let want = values(&hc_up_mix(&d, &w, &normed, s).unwrap());
        let got = values(&hc_up_mix(&d_g, &w_g, &normed_g, s).unwrap());
        let a = hc_act(&d_g, s).unwrap().reshape((n, r)).unwrap();
        let three = values(&hc_mix(&w_g.matmul_t(&a).unwrap(), &normed_g, s).unwrap());
        let err = close("x vs twin", &got, &want, ty, 2.0, 1e-5)
            .or_else(|| close("x vs three kernels", &got, &three, ty, 2.0, 1e-5));
        if let Some(e) = err {
            failures.push(format!("hc_up_mix_{} {c:?}: {e}", ty.name()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The hyper-connection's merged down+inject product (`[R + S, S·H]`: 324 rows of 10 240
/// four-bit g64 columns at the release) on CUDA against the CPU twin: at one token it takes
/// the block-split kernel (`affine_split_products_b4_r2`, ops/affine/split.rs), 5 rows the one
/// row a block entry point, and 3 tokens the wide kernel; the release's 8-bit router (513 rows
/// of 2 560) takes the split kernel too. Gate: 1 ulp of the activation type plus 1e-5 of max
/// |y| (the same chunks summed in another order).
#[test]
fn cuda_merged_down_inject_product_matches_the_cpu_twin() {
    use common::random::{scaled_matrix, Rng};
    let gpu = gpu();
    let mut failures = vec![];
    let merged = 4 * 2560;
    for (rows, cols, bits, tokens) in [
        (324, merged, 4, 1),
        (5, merged, 4, 1),
        (324, merged, 4, 3),
        (513, 2560, 8, 1),
    ] {
        for ty in TYPES {
            let mut rng = Rng::new(0x5EED_D0 + rows as u64 * 7 + tokens as u64);
            let bf16 = candle_core::DType::BF16;
            let m = scaled_matrix(&mut rng, bits, 64, [1, rows, cols], bf16, None);
            let x = tensor(
                &rng.values(tokens * cols, -3.0, 3.0, ty),
                &[tokens, cols],
                ty,
            );
            let [w, w_g] = [&Device::Cpu, &gpu].map(|d| AffineTensor::upload(&m, d).unwrap());
            let want = values(&w.matmul_t(&x).unwrap());
            let got = values(&w_g.matmul_t(&x.to_device(&gpu).unwrap()).unwrap());
            if let Some(e) = close("y", &got, &want, ty, 1.0, 1e-5) {
                let what = format!("{rows} rows of {cols} {bits}-bit x {tokens} tokens");
                failures.push(format!("{what}, {}: {e}", ty.name()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
