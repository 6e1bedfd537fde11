//! The shipped MoE router kernels run on the CPU and compared with the CPU twin
//! (`gdn_ops::ops::moe_route`, on the same rounded logits): `kernels/moe_route.metal` compiled
//! as C++ with the Metal emulation header, and the bodies of `kernels/moe_route.cu` through
//! `kernels/emu/cuda/`, each in both forms ([`RouteKernel`]: one simdgroup a token, one
//! threadgroup a token) with their hosts' geometries, over the op's cases
//! (tests/common/moe_route.rs) and seeded random ones at the real shapes, ties included.
//!
//! Gates, per case:
//! - ids equal to the twin's, slot for slot (the selection rule, ties by the lower index
//!   included); weights within 1e-5 of the twin's (they are at most 1, and the kernels differ
//!   from it only in the order of the softmax denominator's sum and in exp's last bits);
//! - the block body's ids and weights equal to the warp body's of the same source, bit for
//!   bit (the block body is the warp body's replacement, not an approximation).
//!
//! The harnesses guard every buffer (see kernels/emu/guarded_buffer.h).

mod common;
mod emu;

use candle_core::{Device, Tensor};
use common::moe_route::{cases as op_cases, Case as OpCase};
use common::random::Rng;
use common::{failures, values, Input, TYPES};
use gdn_ops::ops::moe_route::{moe_route, MoeRouteParams, RouteKernel, BLOCK_SCRATCH_WORDS};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Source {
    Metal,
    Cuda,
}

fn harness(source: Source) -> &'static emu::Harness {
    static METAL: emu::Harness = emu::Harness::metal("moe_route_harness");
    static CUDA: emu::Harness = emu::Harness::cuda("moe_route_cuda_harness");
    match source {
        Source::Metal => &METAL,
        Source::Cuda => &CUDA,
    }
}

struct Case {
    dtype: usize,
    tokens: usize,
    experts: usize,
    top_k: usize,
    renormalise: bool,
    has_shared: bool,
    /// Rounded to the dtype.
    logits: Tensor,
}

impl Case {
    /// Case `i` of the op's cases in `TYPES[dtype]`.
    fn new(i: usize, c: OpCase, dtype: usize) -> Self {
        Self {
            dtype,
            tokens: c.tokens,
            experts: c.experts,
            top_k: c.top_k,
            renormalise: c.renormalise,
            has_shared: c.has_shared,
            logits: c.logits(i, TYPES[dtype].dtype()),
        }
    }

    fn label(&self) -> String {
        format!(
            "moe_route_{} N={} E={} k={} renormalise={} shared={}",
            TYPES[self.dtype].name(),
            self.tokens,
            self.experts,
            self.top_k,
            self.renormalise,
            self.has_shared
        )
    }

    fn run(&self, source: Source, body: RouteKernel) -> Result<(Vec<u32>, Vec<f32>), String> {
        let mut input = Input::new(b"ROUTEMU2");
        for h in [
            self.dtype,
            self.tokens,
            self.experts,
            self.top_k,
            self.renormalise as usize,
            self.has_shared as usize,
            match body {
                // The harness takes a concrete body; `Auto` is resolved by size as the host does.
                RouteKernel::Warp | RouteKernel::Auto => 0,
                RouteKernel::Block => 1,
            },
        ] {
            input.u32(h as u32);
        }
        input.f32s(&values(&self.logits));
        let out = harness(source).run(&input.0)?;
        let n = self.tokens * (self.top_k + self.has_shared as usize);
        if out.len() != 2 * n {
            return Err(format!(
                "harness wrote {} values, expected {}",
                out.len(),
                2 * n
            ));
        }
        Ok((
            out[..n].iter().map(|f| f.to_bits()).collect(),
            out[n..].to_vec(),
        ))
    }

    /// Both bodies of `source` against the twin, then the block body against the warp body.
    fn check(&self, source: Source) -> Option<String> {
        let (want_ids, want_w) =
            moe_route(&self.logits, self.top_k, self.renormalise, self.has_shared).unwrap();
        let want_ids: Vec<u32> = want_ids.flatten_all().unwrap().to_vec1().unwrap();
        let want_w: Vec<f32> = want_w.flatten_all().unwrap().to_vec1().unwrap();
        let mut outputs = vec![];
        for body in [RouteKernel::Warp, RouteKernel::Block] {
            let (ids, weights) = match self.run(source, body) {
                Ok(r) => r,
                Err(e) => return Some(format!("{body:?}: {e}")),
            };
            if ids != want_ids {
                return Some(format!("{body:?}: ids {ids:?}, twin {want_ids:?}"));
            }
            for (i, (g, w)) in weights.iter().zip(&want_w).enumerate() {
                if (g - w).abs() > 1e-5 || g.is_nan() {
                    return Some(format!("{body:?}: weights[{i}] = {g:e}, twin {w:e}"));
                }
            }
            outputs.push(weights);
        }
        let bits = |w: &[f32]| w.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        if bits(&outputs[0]) != bits(&outputs[1]) {
            return Some(format!(
                "block body's weights {:?} differ from the warp body's {:?} in their bits",
                outputs[1], outputs[0]
            ));
        }
        None
    }
}

/// The op's cases (tests/common/moe_route.rs) at every dtype, then `RANDOM` seeded ones at
/// the real shapes (E 512, k 10 and E 256, k 8, the shared slot, renormalised) and at a width
/// not a multiple of 32, drawn from a few levels (exact ties near the top) or continuous, some
/// with a NaN or an infinite logit.
fn cases() -> Vec<Case> {
    const RANDOM: usize = 24;
    let mut out = vec![];
    for (i, c) in op_cases().into_iter().enumerate() {
        out.extend((0..3).map(|dt| Case::new(i, c, dt)));
    }
    let mut rng = Rng::new(0x5eed_0025);
    for n in 0..RANDOM {
        let (experts, top_k) = [(512, 10), (256, 8), (200, 10)][n % 3];
        let levels = [0, 2, 7, 40][(n / 3) % 4];
        let tokens = 1 + (rng.next() % 3) as usize;
        let width = experts + 1;
        let mut v: Vec<f32> = (0..tokens * width)
            .map(|_| match levels {
                0 => rng.uniform(-6.0, 6.0),
                l => (rng.next() % l) as f32 * 0.25 - 2.0,
            })
            .collect();
        // One case in four has a NaN, +inf or -inf logit in its first row (a NaN or +inf
        // leaves every probability of the row NaN: every slot empty).
        if n % 4 == 3 {
            v[(rng.next() % experts as u64) as usize] =
                [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][n / 4 % 3];
        }
        let dtype = n % 3;
        let logits = Tensor::from_vec(v, (tokens, width), &Device::Cpu)
            .unwrap()
            .to_dtype(TYPES[dtype].dtype())
            .unwrap();
        out.push(Case {
            dtype,
            tokens,
            experts,
            top_k,
            renormalise: true,
            has_shared: true,
            logits,
        });
    }
    out
}

fn run_all(source: Source) {
    harness(source).path();
    let jobs = cases();
    for dt in 0..3 {
        assert!(jobs.iter().any(|c| c.dtype == dt));
    }
    let failures: Vec<String> = failures(&jobs, |c| {
        c.check(source)
            .map(|e| format!("[{source:?} {}] {e}", c.label()))
    });
    common::assert_no_failures(&failures, jobs.len(), "cases disagree");
}

#[test]
fn shipped_moe_route_kernels_match_the_cpu_twin() {
    run_all(Source::Metal);
}

#[test]
fn cuda_moe_route_bodies_match_the_cpu_twin() {
    run_all(Source::Cuda);
}

/// What the C++ build cannot see: buffer indices, the parameter struct, the names.
#[test]
fn moe_route_abi_in_source() {
    emu::assert_params(
        "moe_route.h",
        "MoeRouteParams",
        &["tokens", "experts", "top_k", "renormalise", "has_shared"],
    );
    assert_eq!(std::mem::size_of::<MoeRouteParams>(), 5 * 4);
    let flat = emu::shipped_source_including("kernels/moe_route.metal", "moe_route.h");
    emu::assert_buffers(
        &flat,
        "#define MOE_ROUTE(",
        &["logits", "ids", "weights", "p"],
    );
    emu::assert_buffers(
        &flat,
        "#define MOE_ROUTE_BLOCK(",
        &["logits", "ids", "weights", "p"],
    );
    for (tag, msl) in TYPES.map(|t| (t.name(), t.msl())) {
        for line in [
            format!("MOE_ROUTE(moe_route_{tag}, {msl})"),
            format!("MOE_ROUTE_BLOCK(moe_route_block_{tag}, {msl})"),
        ] {
            assert!(flat.contains(&line), "missing `{line}`");
        }
    }
    assert!(
        flat.contains(
            "#if defined(__HAVE_BFLOAT__) MOE_ROUTE(moe_route_bf16, bfloat) \
             MOE_ROUTE_BLOCK(moe_route_block_bf16, bfloat) #endif"
        ),
        "the bfloat instantiations must be guarded"
    );
    let scratch = format!("kBlockScratchWords = {BLOCK_SCRATCH_WORDS};");
    assert!(
        flat.contains(&scratch),
        "the host's threadgroup memory must be the kernel's: missing `{scratch}`"
    );
}
