//! The body of the shipped `kernels/attn_prefill.cu` (`attn_prefill::run`: wmma 16×16×16
//! fragments, cp.async copies, the online softmax), compiled as C++ with clang-19 on the CUDA
//! stand-ins of `kernels/emu/cuda/` (`kernels/emu/attn_prefill_cuda_harness.cpp`), run on the
//! CPU for f16 and bf16 and compared with the CPU twin,
//! [`gdn_ops::ops::attn_prefill::attn_prefill`]. What it cannot check is the GPU itself (timing,
//! the fragment layouts of real tensor cores): `tests/cuda_attn_prefill.rs` does, on the H100.
//!
//! Cases: the op's, those of every backend (tests/common/attn_prefill.rs), but the largest
//! three (the CUDA test's). The keys and values past T in the KV buffers hold NaN, so a kernel
//! that reads one fails.
//!
//! Gate: every output within 2 ulp of InT of the twin's plus 4e-3 of max |twin| in bf16,
//! 1e-3 in f16 (the largest differences seen: 2e-3 and 2e-4). The two
//! round the same values at the same points, but from f32 sums in other orders: a score may
//! round to the neighbouring InT value (moving its weight by ~ulp·|s|), and the kernel rounds
//! `exp(s − m')` for the running max `m'` where the twin rounds `exp(s − m)`.
//!
//! A mutant (the kernel with its causal bound one key too far) must fail the same gate in
//! every case of more than one query: the test catches a broken kernel.
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev`, like the other emulation tests; it
//! never skips. `GDN_EMU_CXX` overrides the compiler.

mod common;
mod emu;

use common::attn_prefill::{cases, compare, inputs, seed, Inputs, Shape, EMULATION_MAX_WORK};
use common::{failures, tensor, Input, Ty};
use gdn_ops::ops::attn_prefill::{attn_prefill, smem_bytes, AttnPrefillParams};
use std::path::{Path, PathBuf};
use std::process::Command;

fn stand_ins() -> String {
    emu::workspace_root()
        .join("kernels/emu/cuda")
        .to_str()
        .expect("a UTF-8 path")
        .to_string()
}

static HARNESS: emu::Harness = emu::Harness::cuda("attn_prefill_cuda_harness");

fn check(harness: &Path, ty: Ty, s: Shape, seed: u64) -> Option<String> {
    let t = s.keys();
    let Inputs { q, mut k, mut v } = inputs(s, ty, seed);
    for (i, (k, v)) in k.iter_mut().zip(&mut v).enumerate() {
        if (i / s.head_dim) % s.capacity >= t {
            (*k, *v) = (f32::NAN, f32::NAN);
        }
    }
    let mut input = Input::new(b"APFCUDA1");
    input.u32(ty.code());
    for x in [
        s.batch, s.q_heads, s.kv_heads, s.head_dim, s.queries, t, s.offset, s.capacity,
    ] {
        input.u32(x as u32);
    }
    input.f32s(&q).f32s(&k).f32s(&v);
    let got = match emu::run_harness(harness, &input.0) {
        Ok(v) => v,
        Err(e) => return Some(e),
    };
    // The twin reads the same buffers through the view the model passes: narrowed to T.
    let kv_shape = [s.batch, s.kv_heads, s.capacity, s.head_dim];
    let view = |x: &[f32]| tensor(x, &kv_shape, ty).narrow(2, 0, t).unwrap();
    let want = attn_prefill(
        &tensor(&q, &[s.batch, s.q_heads, s.queries, s.head_dim], ty),
        &view(&k),
        &view(&v),
        s.offset,
    )
    .unwrap();
    compare(&got, &want, ty)
}

/// The op's cases the emulator can run in time ([`EMULATION_MAX_WORK`]), with their index.
fn emulated_cases() -> Vec<(usize, Shape)> {
    cases()
        .into_iter()
        .enumerate()
        .filter(|(_, s)| s.work() <= EMULATION_MAX_WORK)
        .collect()
}

fn run_all(harness: &Path) -> Vec<String> {
    let mut jobs = vec![];
    for (i, s) in emulated_cases() {
        for ty in [Ty::F16, Ty::Bf16] {
            jobs.push((ty, s, seed(i, ty)));
        }
    }
    failures(&jobs, |&(ty, s, seed)| {
        check(harness, ty, s, seed).map(|e| format!("attn_prefill_{} {s:?}: {e}", ty.name()))
    })
}

#[test]
fn shipped_cuda_attn_prefill_body_matches_the_cpu_twin() {
    let failed = run_all(HARNESS.path());
    common::assert_no_failures(&failed, emulated_cases().len() * 2, "cases fail");
}

/// The kernel with `mutation` applied (`from` replaced by `to`, which must occur once),
/// compiled into the harness.
fn mutant_harness(name: &str, from: &str, to: &str) -> PathBuf {
    let root = emu::workspace_root();
    let source = std::fs::read_to_string(root.join("kernels/attn_prefill.cu")).unwrap();
    assert_eq!(
        source.matches(from).count(),
        1,
        "the mutation's target `{from}`"
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("attn_prefill_{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kernel = dir.join("attn_prefill.cu");
    std::fs::write(&kernel, source.replace(from, to)).unwrap();
    let out = dir.join("harness");
    let cxx = std::env::var("GDN_EMU_CXX").unwrap_or_else(|_| "clang++-19".into());
    let status = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O2",
            "--rtlib=compiler-rt",
            "-I",
            &stand_ins(),
            "-I",
        ])
        .arg(root.join("kernels/emu"))
        .arg("-I")
        .arg(root.join("kernels"))
        .arg(format!("-DATTN_PREFILL_SOURCE=\"{}\"", kernel.display()))
        .arg(root.join("kernels/emu/attn_prefill_cuda_harness.cpp"))
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cxx}: {e}"));
    assert!(status.success(), "the {name} mutant does not compile");
    out
}

#[test]
fn a_wrong_causal_bound_fails_the_gate() {
    let mutant = mutant_harness(
        "causal_bound",
        "x[j] = key0 + col < limit ? score : -INFINITY;",
        "x[j] = key0 + col <= limit ? score : -INFINITY;",
    );
    let failed = run_all(&mutant);
    // Each row sees one key too many: the next one, or for the last row a zero-filled one past
    // T, whose weight exp(0 − m) still counts in the sum. Every case with more than one query
    // has rows of the first kind and must fail; a lone query's extra weight may hide within
    // bf16's allowance.
    let passed: Vec<String> = emulated_cases()
        .into_iter()
        .map(|(_, s)| s)
        .filter(|s| s.queries > 1)
        .flat_map(|s| [Ty::F16, Ty::Bf16].map(|ty| (ty, s)))
        .filter(|(ty, s)| {
            !failed
                .iter()
                .any(|f| f.starts_with(&format!("attn_prefill_{} {s:?}:", ty.name())))
        })
        .map(|(ty, s)| format!("{} {s:?}", ty.name()))
        .collect();
    assert!(
        passed.is_empty(),
        "the mutant passed:\n{}",
        passed.join("\n")
    );
}

/// What the C++ build cannot see: the parameter struct the host mirrors, the entry points'
/// names and arguments, and the shared memory the host reserves.
#[test]
fn kernel_abi_in_source() {
    let u = |f: &str| ("unsigned int".to_string(), f.to_string());
    let mut fields: Vec<_> = [
        "batch",
        "q_heads",
        "kv_heads",
        "head_dim",
        "queries",
        "keys",
        "offset",
        "q_tiles",
        "k_batch_stride",
        "k_head_stride",
        "k_row_stride",
        "v_batch_stride",
        "v_head_stride",
        "v_row_stride",
    ]
    .map(u)
    .to_vec();
    fields.push(("float".to_string(), "scale".to_string()));
    assert_eq!(
        emu::params_fields("attn_prefill.h", "AttnPrefillParams"),
        fields,
        "AttnPrefillParams (kernels/params/attn_prefill.h) must match ops/attn_prefill"
    );
    assert_eq!(std::mem::size_of::<AttnPrefillParams>(), 60);
    let src = emu::shipped_source_including("kernels/attn_prefill.cu", "attn_prefill.h");
    assert!(
        src.contains("name(const T* q, const T* k, const T* v, T* out, const AttnPrefillParams p)")
    );
    for name in [
        "attn_prefill_f16, __half",
        "attn_prefill_bf16, __nv_bfloat16",
    ] {
        assert!(src.contains(&format!("ATTN_PREFILL_ENTRY({name})")));
    }
    // The kernel's smem_bytes, as the host computes it: 84 992 bytes at Dh 256.
    assert!(src.contains("return 2 * kRows * (dh + kPad) * 2 + kWarps * kScratchFloats * 4;"));
    assert_eq!(smem_bytes(256), 84_992);
}
