//! The shipped indexer pooling kernels run on the CPU and compared with the CPU twin
//! (`gdn_ops::ops::indexer_pool`, on the same inputs): `kernels/indexer_pool.metal` compiled as
//! C++ with the Metal emulation header, and the body of `kernels/indexer_pool.cu` through
//! `kernels/emu/cuda/`, both with their hosts' geometry (one simdgroup / warp), over the op's
//! cases (tests/common/indexer_pool.rs) at every projection dtype, and rows past their buffers.
//!
//! Gate, per case: the tail and the blocks bit for bit the twin's (the kernels and the twin add
//! in one order and round each product on its own; on a Mac, Metal's fast math may contract a
//! product and a sum, within an ulp). The harnesses guard every buffer (see
//! kernels/emu/guarded_buffer.h), and the CUDA body's shared memory starts as NaN.

mod common;
mod emu;

use common::indexer_pool::{cases, out_of_range_cases, Case, Inputs, DTYPES};
use common::{failures, values, Input};
use gdn_ops::ops::indexer_pool::indexer_pool;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    Metal,
    Cuda,
}

fn harness(kernel: Kernel) -> &'static emu::Harness {
    static METAL: emu::Harness = emu::Harness::metal("indexer_pool_harness");
    static CUDA: emu::Harness = emu::Harness::cuda("indexer_pool_cuda_harness");
    match kernel {
        Kernel::Metal => &METAL,
        Kernel::Cuda => &CUDA,
    }
}

fn run(kernel: Kernel, c: &Case, dtype: usize, x: &Inputs) -> Result<Vec<f32>, String> {
    let mut input = Input::new(b"IPOOLEM1");
    let width = x.qk.dim(1).unwrap();
    for h in [
        dtype,
        x.key_offset,
        c.dim,
        c.rows,
        c.capacity,
        c.rope_dims / 2,
        c.tail_row,
        c.block_row,
        width,
    ] {
        input.u32(h as u32);
    }
    input.f32(x.eps);
    for t in [&x.qk, &x.tail, &x.blocks, &x.cos, &x.sin, &x.norm] {
        input.f32s(&values(t));
    }
    harness(kernel).run(&input.0)
}

fn check(kernel: Kernel, c: &Case, dtype: usize, seed: u64) -> Option<String> {
    let x = c.inputs(DTYPES[dtype], seed);
    let got = match run(kernel, c, dtype, &x) {
        Ok(v) => v,
        Err(e) => return Some(format!("{kernel:?} {c:?} dtype {dtype}: {e}")),
    };
    indexer_pool(&x.call()).unwrap();
    let (tail, blocks) = x.buffers();
    let want: Vec<f32> = tail.into_iter().chain(blocks).collect();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    (bits(&got) != bits(&want)).then(|| {
        let first = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        format!(
            "{kernel:?} {c:?} dtype {dtype}: first difference at {first:?} of {}",
            want.len()
        )
    })
}

fn check_kernel(kernel: Kernel) {
    harness(kernel).path();
    let mut jobs = vec![];
    for (i, c) in cases().into_iter().chain(out_of_range_cases()).enumerate() {
        jobs.extend((0..DTYPES.len()).map(|dt| (c, dt, 0x90_0100 + i as u64)));
    }
    let failed = failures(&jobs, |(c, dt, seed)| check(kernel, c, *dt, *seed));
    common::assert_no_failures(&failed, jobs.len(), "cases disagree with the twin");
}

#[test]
fn shipped_metal_indexer_pool_matches_the_cpu_twin() {
    check_kernel(Kernel::Metal);
}

#[test]
fn shipped_cuda_indexer_pool_body_matches_the_cpu_twin() {
    check_kernel(Kernel::Cuda);
}

/// What the C++ build cannot see: buffer indices, the parameter struct, the names.
#[test]
fn indexer_pool_abi_in_source() {
    emu::assert_params(
        "indexer_pool.h",
        "IndexerPoolParams",
        &[
            "key_offset",
            "dim",
            "rows",
            "capacity",
            "rope_half",
            "float eps",
        ],
    );
    assert_eq!(
        std::mem::size_of::<gdn_ops::ops::indexer_pool::IndexerPoolParams>(),
        6 * 4
    );
    let header = emu::shipped_source("kernels/params/indexer_pool.h");
    assert!(header.contains(&format!(
        "#define INDEXER_POOL_MAX_DIM {}",
        gdn_ops::ops::indexer_pool::MAX_DIM
    )));
    let flat = emu::shipped_source_including("kernels/indexer_pool.metal", "indexer_pool.h");
    emu::assert_buffers(
        &flat,
        "#define INDEXER_POOL(",
        &[
            "qk",
            "tail",
            "blocks",
            "tail_row",
            "block_row",
            "cs",
            "sn",
            "norm",
            "p",
        ],
    );
    for (tag, msl) in [("f32", "float"), ("f16", "half")] {
        let line = format!("INDEXER_POOL(indexer_pool_{tag}, {msl})");
        assert!(flat.contains(&line), "missing `{line}`");
    }
    assert!(
        flat.contains(
            "#if defined(__HAVE_BFLOAT__) INDEXER_POOL(indexer_pool_bf16, bfloat) #endif"
        ),
        "the bfloat instantiation must be guarded"
    );
    let cu = emu::shipped_source("kernels/indexer_pool.cu");
    for (tag, ty) in [
        ("f32", "float"),
        ("f16", "__half"),
        ("bf16", "__nv_bfloat16"),
    ] {
        assert!(
            cu.contains(&format!("INDEXER_POOL_ENTRY({tag}, {ty})")),
            "missing {tag}"
        );
    }
}
