//! Blocked attention against the unblocked computation (one block holding every score, the
//! function prefill computed before blocks), and the size of what a block holds.

use super::*;
use candle_core::Device;

/// Uniform values in `[-scale, scale)` from a fixed seed (a 64-bit LCG's high bits).
fn values(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn tensor(dims: &[usize], scale: f32, seed: u64, dtype: DType) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_vec(values(n, scale, seed), dims, &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .unwrap()
}

#[derive(Debug, Clone, Copy)]
struct Case {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    queries: usize,
    offset: usize,
    budget: usize,
    /// A `qwen4_exp`-style selection mask instead of the causal one.
    masked: bool,
    /// What the budget must make of the chunk: (query blocks, whether keys are tiled).
    want: (usize, bool),
}

/// A selection over the causal keys: every query keeps its own key and about half of the
/// earlier ones.
fn selection_mask(queries: usize, keys: usize, offset: usize, seed: u64) -> Tensor {
    let coin = values(queries * keys, 1.0, seed);
    let mask: Vec<f32> = (0..queries * keys)
        .map(|i| {
            let (row, key) = (i / keys, i % keys);
            let open = key == offset + row || (key < offset + row && coin[i] > 0.0);
            if open {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    Tensor::from_vec(mask, (queries, keys), &Device::Cpu).unwrap()
}

use crate::tensor::max_abs;

fn check(c: Case, dtype: DType, seed: u64) {
    let keys = c.offset + c.queries;
    let q = tensor(
        &[c.batch, c.q_heads, c.queries, c.head_dim],
        2.0,
        seed,
        dtype,
    );
    let kv_dims = [c.batch, c.kv_heads, keys, c.head_dim];
    let k = tensor(&kv_dims, 2.0, seed + 1, dtype);
    let v = tensor(&kv_dims, 1.0, seed + 2, dtype);
    let mask = c
        .masked
        .then(|| selection_mask(c.queries, keys, c.offset, seed + 3));
    let plan = BlockPlan::new(c.batch, c.q_heads, c.queries, keys, c.budget);
    assert_eq!(
        (c.queries.div_ceil(plan.query_block), plan.key_tile < keys),
        c.want,
        "{c:?}: {plan:?}"
    );
    let blocked = attend(&q, &k, &v, c.offset, mask.as_ref(), c.budget).unwrap();
    let whole = attend(&q, &k, &v, c.offset, mask.as_ref(), usize::MAX).unwrap();
    assert_eq!(blocked.dims(), [c.batch, c.q_heads, c.queries, c.head_dim]);
    let diff = max_abs(
        &(&blocked.to_dtype(DType::F32).unwrap() - &whole.to_dtype(DType::F32).unwrap()).unwrap(),
    );
    let scale = max_abs(&whole);
    // f32: summation order only (shorter rows in the products and the softmax sums). bf16: the key tiles round unnormalized probabilities and
    // their partial products to bf16 (2⁻⁸ relative each), two such roundings of the output.
    let tol = match dtype {
        DType::F32 => 2e-6 * scale.max(1.0),
        _ => 2.0 * 2f32.powi(-8) * scale.max(1.0),
    };
    assert!(
        diff <= tol,
        "{c:?} {dtype:?}: blocked differs from unblocked by {diff:e} (tolerance {tol:e})"
    );
}

const CASES: [Case; 9] = [
    // Budget for everything: one block, the unblocked computation itself.
    case(1, 4, 2, 32, 37, 0, 1 << 30, false, (1, false)),
    // Query blocks over whole keys: rows for 70 queries, 151 queries in blocks of 51, 51, 49
    // (not a multiple of the block).
    case(1, 4, 2, 32, 151, 0, 4 * 4 * 151 * 70, false, (3, false)),
    // The last chunk of a prompt (offset > 0), GQA 4, query blocks.
    case(1, 8, 2, 64, 150, 333, 4 * 8 * 483 * 70, false, (3, false)),
    // Key tiles: the context too long for even MIN_QUERY_BLOCK rows; tiles of 61 keys (not a
    // divisor of the blocks' 455 and 461 visible keys), the first tiles open to the block.
    case(1, 4, 1, 32, 70, 391, 4 * 4 * 64 * 61, false, (2, true)),
    // Key tiles from position 0: the causal mask cuts through tiles of every block.
    case(1, 2, 2, 64, 100, 0, 4 * 2 * 64 * 17, false, (2, true)),
    // Two sequences: query blocks, then key tiles.
    case(2, 4, 2, 32, 150, 90, 4 * 8 * 240 * 70, false, (3, false)),
    case(2, 4, 2, 32, 30, 90, 4 * 8 * 30 * 40, false, (1, true)),
    // A selection mask (qwen4_exp): query blocks, then key tiles.
    case(1, 4, 2, 32, 151, 60, 4 * 4 * 211 * 70, true, (3, false)),
    case(1, 4, 2, 32, 45, 60, 4 * 4 * 45 * 23, true, (1, true)),
];

#[allow(clippy::too_many_arguments)]
const fn case(
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    queries: usize,
    offset: usize,
    budget: usize,
    masked: bool,
    want: (usize, bool),
) -> Case {
    Case {
        batch,
        q_heads,
        kv_heads,
        head_dim,
        queries,
        offset,
        budget,
        masked,
        want,
    }
}

#[test]
fn blocks_equal_the_unblocked_computation() {
    for (i, c) in CASES.iter().enumerate() {
        for dtype in [DType::F32, DType::BF16] {
            check(*c, dtype, 1_000 * i as u64 + 17);
        }
    }
}

#[test]
fn one_query_block_of_one_query_is_the_decode_step() {
    // A single query (decode on the composed path) over many keys: no mask, one block.
    let c = case(1, 4, 2, 32, 1, 500, 4 * 4 * 130, false, (1, true));
    check(c, DType::F32, 5);
    check(c, DType::BF16, 6);
}

/// Qwen3-Next-80B's attention layers (16 query heads) on a 2 048-token chunk: the largest
/// score buffer is the budget at every context, 4k as 1M.
#[test]
fn the_plan_holds_the_budget_at_every_context() {
    let at = |keys| BlockPlan::new(1, 16, 2048, keys, SCORE_BUDGET_BYTES);
    let bytes = |keys| at(keys).score_bytes(1, 16);
    for keys in [2048, 4096, 16_384, 65_536, 262_144, 1 << 20] {
        assert!(bytes(keys) <= SCORE_BUDGET_BYTES, "{keys}: {:?}", at(keys));
    }
    // Unblocked, 16 384 positions would hold 16 × 2 048 × 16 384 f32 scores: 2 GiB.
    assert_eq!(at(16_384).query_block, 128);
    assert_eq!(bytes(4096), SCORE_BUDGET_BYTES);
    assert_eq!(bytes(65_536), bytes(4096));
    assert!(at(65_536).key_tile < 65_536);
    // Short contexts: the whole chunk at once.
    assert_eq!(at(1024).query_block, 2048);
}

/// The scores the code actually allocates (recorded where they are made), at a context 8×
/// longer: no larger. Unblocked they grow 8× (the measurement sees them).
#[test]
fn measured_scores_do_not_grow_with_the_context() {
    let largest = |keys: usize, budget: usize| {
        let (queries, dtype) = (64, DType::F32);
        let q = tensor(&[1, 4, queries, 32], 1.0, 1, dtype);
        let k = tensor(&[1, 2, keys, 32], 1.0, 2, dtype);
        let v = tensor(&[1, 2, keys, 32], 1.0, 3, dtype);
        LARGEST_SCORES.with(|c| c.set(0));
        attend(&q, &k, &v, keys - queries, None, budget).unwrap();
        LARGEST_SCORES.with(|c| c.get()) * 4
    };
    let budget = 64 << 10;
    let (short, long) = (largest(1024, budget), largest(8192, budget));
    assert!(short <= budget && long <= budget, "{short} {long}");
    assert!(long <= short, "{short} at 1k keys, {long} at 8k");
    assert_eq!(largest(8192, usize::MAX), 8 * largest(1024, usize::MAX));
}

/// Causal query blocks run largest first, so that no block's scores outgrow the buffers the
/// block before it freed (a stream-ordered allocator reuses them instead of reserving more).
#[test]
fn causal_blocks_run_largest_first() {
    // Four query blocks of 64 (a budget of 64 queries' scores over all keys): no key tiles.
    let (queries, keys, dtype) = (256, 1024, DType::F32);
    let q = tensor(&[1, 4, queries, 32], 1.0, 1, dtype);
    let k = tensor(&[1, 2, keys, 32], 1.0, 2, dtype);
    let v = tensor(&[1, 2, keys, 32], 1.0, 3, dtype);
    SCORE_SIZES.with(|v| v.borrow_mut().clear());
    attend(&q, &k, &v, keys - queries, None, 64 * 4 * 4 * keys).unwrap();
    let sizes = SCORE_SIZES.with(|v| v.borrow().clone());
    assert!(sizes.len() > 1, "{sizes:?}");
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
    assert!(sizes[0] > sizes[sizes.len() - 1], "{sizes:?}");
}
