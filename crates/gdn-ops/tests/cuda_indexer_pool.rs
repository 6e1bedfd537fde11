//! The CUDA indexer pooling (`kernels/indexer_pool.cu`) against its CPU twin, for every
//! instantiation, over the op's cases (tests/common/indexer_pool.rs) and rows past their
//! buffers. Built only with the `cuda` feature and run on the GPU machine
//! (scripts/gpu/test-cuda.sh); without a CUDA device every test fails.
//!
//! Gate: the tail and the blocks bit for bit the twin's (the kernel rounds each product and
//! sum on its own, in the twin's order).
#![cfg(feature = "cuda")]

mod common;

use common::gpu;
use common::indexer_pool::{cases, out_of_range_cases, DTYPES};
use gdn_ops::ops::indexer_pool::indexer_pool;

#[test]
fn indexer_pool_matches_the_cpu_twin() {
    let dev = gpu();
    for (i, c) in cases().into_iter().chain(out_of_range_cases()).enumerate() {
        for dtype in DTYPES {
            let want = c.inputs(dtype, 0xc0_da00 + i as u64);
            let got = want.to_device(&dev);
            indexer_pool(&want.call()).unwrap();
            indexer_pool(&got.call()).unwrap();
            let bits = |(t, b): (Vec<f32>, Vec<f32>)| {
                t.iter().chain(&b).map(|f| f.to_bits()).collect::<Vec<_>>()
            };
            assert_eq!(bits(got.buffers()), bits(want.buffers()), "{c:?} {dtype:?}");
        }
    }
}
