//! The shipped `kernels/hyper_connection.metal`, compiled as C++ with clang-19 and the Metal
//! emulation header (`kernels/emu/`), run on the CPU for `hc_inject_norm_{f32,f16,bf16}` (with
//! and without the injection and the norm, the injection of a block's output or of a MoE
//! block's slots), `hc_act_{f32,f16,bf16}`, `hc_mix_{f32,f16,bf16}`
//! and `hc_up_mix_<x>_<s>` (every activation and scale type), and compared with the
//! CPU twin ([`gdn_ops::ops::hyper_connection`]) over the op's cases
//! (tests/common/hyper_connection.rs). The `.cu` bodies of `hc_inject_norm` and `hc_up_mix`
//! (kernels/hyper_connection.cu, through kernels/emu/hyper_connection_cuda_harness.cpp and the
//! CUDA stand-ins) run on the same cases at the CUDA host's geometry, and the injection's
//! cluster form (`hc_inject_norm_cluster_*`'s body, the blocks' partial sums exchanged by the
//! harness in two passes) on the cases the host gives it.
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev`; without them this test fails, never
//! skips. `GDN_EMU_CXX` overrides the compiler.
//!
//! Gates, per case: `sum`, `a` and `x` within 1 ulp of InT of the twin's (the same roundings, but
//! `exp` may differ in its last bit); `normed` within 1 ulp plus 1e-5 of max |normed| (the
//! f32 sum of squares is added in another order); `hc_up_mix`'s `x` within 2 ulps plus 1e-5
//! of max |x| (the product's f32 sum is added in another order, which can move the rounded
//! logit by an ulp). The harness guards every buffer and leaves the unused slots unbound.

mod common;
mod emu;

use candle_core::{Device, Tensor};
use common::hyper_connection::{
    inputs, runs, seed, up_mix_inputs, up_mix_runs, up_mix_seed, UpMixCase, FORMS, SLOTS,
};
use common::{close, failures, tensor, values, Input, Ty, TYPES};
use gdn_ops::ops::affine::AffineTensor;
use gdn_ops::ops::hyper_connection::{
    hc_act, hc_inject_norm, hc_inject_slots_norm, hc_mix, hc_up_mix, inject_cluster_threads,
    inject_row_threads, inject_uses_cluster, row_threads, HcActParams, HcInjectNormParams,
    HcMixParams, HcUpMixParams, InjectKernel, MIX_THREADS, UP_MIX_WARPS,
};

static HARNESS: emu::Harness = emu::Harness::metal("hyper_connection_harness");
/// The `.cu` bodies of `hc_inject_norm` and `hc_up_mix` (kernels/emu/hyper_connection_cuda_harness.cpp:
/// the same input and output as the Metal harness).
static CUDA_HARNESS: emu::Harness = emu::Harness::cuda("hyper_connection_cuda_harness");

/// The SMs `inject_row_threads` sees on the H200 (the CUDA injection's geometry there).
const H200_SMS: usize = 132;

/// Which kernel file a case runs.
#[derive(Debug, Clone, Copy)]
enum Source {
    Metal,
    Cuda,
    /// The `.cu` file's cluster form of the injection (`inject_norm_cluster_body`, the
    /// harness exchanging the blocks' partial sums as distributed shared memory would).
    CudaCluster,
}

impl Source {
    fn harness(self) -> &'static emu::Harness {
        match self {
            Source::Metal => &HARNESS,
            Source::Cuda | Source::CudaCluster => &CUDA_HARNESS,
        }
    }
    /// The harness's kernel code of an injection: 4, the CUDA harness's cluster form, or 0.
    fn inject_code(self) -> u32 {
        match self {
            Source::CudaCluster => 4,
            Source::Metal | Source::Cuda => 0,
        }
    }
    /// The allowance on `sum` past one ulp, in max |sum|: the `.cu` body sums a MoE block's
    /// slots with fused multiply-adds (the twin and the Metal kernel round each product), as
    /// tests/cuda_hyper_connection.rs allows on the GPU.
    fn sum_rel(self) -> f32 {
        match self {
            Source::Metal => 0.0,
            Source::Cuda | Source::CudaCluster => 1e-6,
        }
    }
    /// Threads of the injection's block for `rows` stream rows of `cols`, as the host takes them.
    fn inject_threads(self, rows: usize, cols: usize) -> usize {
        match self {
            Source::Metal => row_threads(cols),
            Source::Cuda => inject_row_threads(rows, cols, H200_SMS),
            Source::CudaCluster => inject_cluster_threads(cols),
        }
    }
}

const EPS: f32 = 1e-6;

struct Case {
    index: usize,
    shape: (usize, usize, usize),
    ty: Ty,
    kernel: Kernel,
    source: Source,
}

#[derive(Debug, Clone, Copy)]
enum Kernel {
    /// `hc_inject_norm` with (inject, norm).
    InjectNorm(bool, bool),
    /// `hc_inject_slots_norm` with (norm).
    InjectSlots(bool),
    Mix,
    Act,
}

impl Kernel {
    fn code(self, source: Source) -> u32 {
        match self {
            Kernel::InjectNorm(..) | Kernel::InjectSlots(_) => source.inject_code(),
            Kernel::Mix => 1,
            Kernel::Act => 2,
        }
    }
}

fn header(input: &mut Input, c: &Case, inject: bool, norm: bool, threads: usize) {
    let slots = match c.kernel {
        Kernel::InjectSlots(_) => SLOTS,
        _ => 0,
    };
    let (n, s, h) = c.shape;
    input
        .u32(c.kernel.code(c.source))
        .u32(c.ty.code())
        .u32(n as u32)
        .u32(s as u32)
        .u32(h as u32)
        .u32(inject as u32)
        .u32(norm as u32)
        .f32(EPS)
        .u32(threads as u32)
        .u32(slots as u32);
}

fn check(c: &Case) -> Option<String> {
    let (n, s, h) = c.shape;
    let harness = c.source.harness();
    let inject_threads = c.source.inject_threads(n * s, h);
    let x = inputs(c.shape, c.ty, seed(c.index, c.ty));
    let mut input = Input::new(b"HCONEMU1");
    if let Kernel::Act = c.kernel {
        header(&mut input, c, false, false, MIX_THREADS);
        input.f32s(&x.down);
        let got = match harness.run(&input.0) {
            Ok(v) => v,
            Err(e) => return Some(e),
        };
        let want = values(&hc_act(&tensor(&x.down, &[n, h], c.ty), s).unwrap());
        return close("a", &got, &want, c.ty, 1.0, 0.0);
    }
    if let Kernel::InjectSlots(norm) = c.kernel {
        header(&mut input, c, true, norm, inject_threads);
        input.f32s(&x.hs).f32s(&x.slot_down).f32s(&x.gate);
        if norm {
            input.f32s(&x.weight);
        }
        input.f32s(&x.slot_weights);
        let got = match harness.run(&input.0) {
            Ok(v) => v,
            Err(e) => return Some(e),
        };
        let hs = tensor(&x.hs, &[n, s * h], c.ty);
        let down = tensor(&x.slot_down, &[n, SLOTS, h], c.ty);
        let g = tensor(&x.gate, &[n, s], c.ty);
        let w = Tensor::from_vec(x.weight.clone(), (s, h), &Device::Cpu).unwrap();
        let sw = Tensor::from_vec(x.slot_weights.clone(), (n, SLOTS), &Device::Cpu).unwrap();
        let norm_arg = norm.then_some((&w, EPS));
        let (sum, normed) = hc_inject_slots_norm(&hs, (&down, &sw, &g), norm_arg, s).unwrap();
        let len = n * s * h;
        if got.len() != len * (1 + norm as usize) {
            return Some(format!("{} values printed", got.len()));
        }
        let (got_sum, got_normed) = got.split_at(len);
        return close("sum", got_sum, &values(&sum), c.ty, 1.0, c.source.sum_rel()).or_else(|| {
            normed.and_then(|nd| close("normed", got_normed, &values(&nd), c.ty, 1.0, 1e-5))
        });
    }
    let Kernel::InjectNorm(inject, norm) = c.kernel else {
        header(&mut input, c, false, false, MIX_THREADS);
        input.f32s(&x.up).f32s(&x.normed);
        let got = match harness.run(&input.0) {
            Ok(v) => v,
            Err(e) => return Some(e),
        };
        let up = tensor(&x.up, &[n, s * h], c.ty);
        let normed = tensor(&x.normed, &[n, s * h], c.ty);
        let want = values(&hc_mix(&up, &normed, s).unwrap());
        return close("x", &got, &want, c.ty, 1.0, 0.0);
    };
    header(&mut input, c, inject, norm, inject_threads);
    input.f32s(&x.hs);
    if inject {
        input.f32s(&x.y).f32s(&x.gate);
    }
    if norm {
        input.f32s(&x.weight);
    }
    let got = match harness.run(&input.0) {
        Ok(v) => v,
        Err(e) => return Some(e),
    };
    let hs = tensor(&x.hs, &[n, s * h], c.ty);
    let y = tensor(&x.y, &[n, h], c.ty);
    let g = tensor(&x.gate, &[n, s], c.ty);
    let w = Tensor::from_vec(x.weight.clone(), (s, h), &Device::Cpu).unwrap();
    let (sum, normed) = hc_inject_norm(
        &hs,
        inject.then_some((&y, &g)),
        norm.then_some((&w, EPS)),
        s,
    )
    .unwrap();
    let len = n * s * h;
    let want_len = len * (inject as usize + norm as usize);
    if got.len() != want_len {
        return Some(format!("{} values printed, expected {want_len}", got.len()));
    }
    let (got_sum, got_normed) = got.split_at(if inject { len } else { 0 });
    let sum_err = inject
        .then(|| close("sum", got_sum, &values(&sum), c.ty, 1.0, c.source.sum_rel()))
        .flatten();
    sum_err.or_else(|| {
        normed.and_then(|nd| close("normed", got_normed, &values(&nd), c.ty, 1.0, 1e-5))
    })
}

#[test]
fn shipped_hyper_connection_kernels_match_the_cpu_twin() {
    run_cases(Source::Metal, &[Kernel::Mix, Kernel::Act]);
}

/// `inject_norm_body` of kernels/hyper_connection.cu at the H200's geometry (a thread a column
/// up to 1 024 for a decode step's few rows), every form, against the twin with the Metal
/// kernel's gates (`sum` allowing the `.cu` body's fused multiply-adds).
#[test]
fn shipped_cuda_inject_norm_body_matches_the_cpu_twin() {
    run_cases(Source::Cuda, &[]);
}

/// `inject_norm_cluster_body` of kernels/hyper_connection.cu (a stream row over a cluster's 8
/// blocks, each block's partial sum of squares, the 8 added in rank order) at the host's
/// geometry, on the cases the H200 gives it (the release's decode step among them), every
/// form, against the twin with the one-block body's gates. A partial from the wrong rank
/// fails here (off by O(1/8) of the row's sum of squares).
#[test]
fn shipped_cuda_inject_cluster_body_matches_the_cpu_twin() {
    let clustered = |&(n, s, h): &(usize, usize, usize)| {
        inject_uses_cluster(n * s, h, H200_SMS, InjectKernel::Auto)
    };
    assert!(
        clustered(&(1, 4, 2560)),
        "the release's decode is not clustered"
    );
    run_cases_where(Source::CudaCluster, &[], clustered);
}

/// Every case in every injection form, and in the kernels `more`, on `source`'s harness.
fn run_cases(source: Source, more: &[Kernel]) {
    run_cases_where(source, more, |_| true);
}

/// [`run_cases`] on the shapes `take` keeps.
fn run_cases_where(source: Source, more: &[Kernel], take: impl Fn(&(usize, usize, usize)) -> bool) {
    let mut cases = vec![];
    for (index, shape, ty) in runs(&TYPES).into_iter().filter(|(_, s, _)| take(s)) {
        let forms = FORMS.iter().map(|&(i, n)| Kernel::InjectNorm(i, n));
        let slots = [Kernel::InjectSlots(true), Kernel::InjectSlots(false)];
        for kernel in forms.chain(slots).chain(more.iter().copied()) {
            cases.push(Case {
                index,
                shape,
                ty,
                kernel,
                source,
            });
        }
    }
    source.harness().path();
    let failures: Vec<String> = failures(&cases, |c| {
        let what = format!(
            "{:?} {:?} {} {:?}",
            c.source,
            c.kernel,
            c.ty.name(),
            c.shape
        );
        check(c).map(|e| format!("{what}: {e}"))
    });
    common::assert_no_failures(&failures, cases.len(), "cases fail");
}

/// `hc_up_mix` case `c` at `ty` on the emulator against the twin.
fn check_up_mix(i: usize, c: &UpMixCase, ty: Ty, source: Source) -> Option<String> {
    let (n, s, h, r) = (c.tokens, c.streams, c.cols, c.rank);
    let x = up_mix_inputs(c, ty, up_mix_seed(i, ty));
    let mut input = Input::new(b"HCONEMU1");
    input
        .u32(3)
        .u32(ty.code())
        .u32(n as u32)
        .u32(s as u32)
        .u32(h as u32)
        .u32(0)
        .u32(0)
        .f32(EPS)
        .u32((32 * UP_MIX_WARPS) as u32)
        .u32(0)
        .u32(c.scales.code())
        .u32(r as u32)
        .u32(c.bits as u32)
        .u32(c.group as u32);
    x.m.packed().iter().for_each(|&w| {
        input.u32(w);
    });
    input
        .f32s(&x.m.scales().to_f32_vec())
        .f32s(&x.m.biases().to_f32_vec())
        .f32s(&x.d)
        .f32s(&x.normed);
    let got = match source.harness().run(&input.0) {
        Ok(v) => v,
        Err(e) => return Some(e),
    };
    let w = AffineTensor::upload(&x.m, &Device::Cpu).unwrap();
    let d = tensor(&x.d, &[n, r], ty);
    let normed = tensor(&x.normed, &[n, s * h], ty);
    let want = values(&hc_up_mix(&d, &w, &normed, s).unwrap());
    close("x", &got, &want, ty, 2.0, 1e-5)
}

#[test]
fn shipped_up_mix_kernel_matches_the_cpu_twin() {
    let cases = up_mix_runs(&TYPES);
    HARNESS.path();
    let failures: Vec<String> = failures(&cases, |(i, c, ty)| {
        check_up_mix(*i, c, *ty, Source::Metal).map(|e| format!("up_mix {} {c:?}: {e}", ty.name()))
    });
    common::assert_no_failures(&failures, cases.len(), "cases fail");
}

/// `up_mix_body` of kernels/hyper_connection.cu (the streams' dots side by side in a warp, the
/// first words loaded before the activations' barrier) at the host's geometry, every
/// activation and scale type, against the twin.
#[test]
fn shipped_cuda_up_mix_body_matches_the_cpu_twin() {
    let cases = up_mix_runs(&TYPES);
    CUDA_HARNESS.path();
    let failures: Vec<String> = failures(&cases, |(i, c, ty)| {
        check_up_mix(*i, c, *ty, Source::Cuda)
            .map(|e| format!("cuda up_mix {} {c:?}: {e}", ty.name()))
    });
    common::assert_no_failures(&failures, cases.len(), "cases fail");
}

/// What the C++ build cannot see: the buffer indices, the parameter structs the host mirrors,
/// and the instantiation names.
#[test]
fn kernel_abi_in_source() {
    emu::assert_params(
        "hyper_connection.h",
        "HcInjectNormParams",
        &[
            "tokens",
            "streams",
            "cols",
            "has_inject",
            "has_norm",
            "float eps",
            "slots",
        ],
    );
    emu::assert_params(
        "hyper_connection.h",
        "HcMixParams",
        &["tokens", "streams", "cols"],
    );
    assert_eq!(std::mem::size_of::<HcInjectNormParams>(), 28);
    emu::assert_params("hyper_connection.h", "HcActParams", &["len", "streams"]);
    assert_eq!(std::mem::size_of::<HcMixParams>(), 12);
    assert_eq!(std::mem::size_of::<HcActParams>(), 8);
    emu::assert_params(
        "hyper_connection.h",
        "HcUpMixParams",
        &["tokens", "streams", "cols", "rank", "bits", "group_size"],
    );
    assert_eq!(std::mem::size_of::<HcUpMixParams>(), 24);
    let src = emu::shipped_source_including("kernels/hyper_connection.metal", "hyper_connection.h");
    let inject = ["hs", "y", "gate", "weight", "slot_weights", "sum", "normed"];
    emu::assert_buffer_indices(&src, "hyper_connection.metal", &inject, "");
    assert!(src.contains("HcInjectNormParams& p [[buffer(7)]]"));
    assert!(src.contains("HcMixParams& p [[buffer(3)]]"));
    assert!(src.contains("HcActParams& p [[buffer(2)]]"));
    assert!(src.contains("HcUpMixParams& p [[buffer(6)]]"));
    emu::assert_instantiated(&src, "hc_act");
    emu::assert_instantiated(&src, "hc_inject_norm");
    emu::assert_instantiated(&src, "hc_mix");
    emu::shipped_source_including("kernels/hyper_connection.cu", "hyper_connection.h");
}
