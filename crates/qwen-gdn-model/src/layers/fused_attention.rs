//! Which of candle 0.11.1's fused attention kernels (`candle_nn::ops::sdpa`, Metal only) exist
//! for a head dim and dtype. candle checks less than it needs on the host: it accepts head dims
//! its vector kernel has no entry for (72, 80) and an f32 full kernel at head dim 256 whose
//! threadgroup memory exceeds what an Apple GPU gives. Either would fail at the first forward
//! call on a Mac, so the attention layer asks here first and falls back to matmul + softmax.
//!
//! Mirrors, in candle-metal-kernels 0.11.1: `src/kernels/sdpa.rs` (vector kernel names,
//! lines 288–312; full-kernel tile sizes, lines 85–98) and
//! `src/metal_src/scaled_dot_product_attention.metal` (threadgroup arrays, lines 1945–1958).

use candle_core::DType;

/// Threadgroup memory an Apple GPU gives one threadgroup (`maxThreadgroupMemoryLength`,
/// 32 KiB on every Apple family).
pub const THREADGROUP_MEMORY_LIMIT: usize = 32 * 1024;

/// Head dims of the vector (one query) kernel in candle's host-side table.
const VECTOR_HEAD_DIMS: [usize; 6] = [32, 64, 96, 128, 256, 512];

/// Head dims of the full (many queries) kernel in candle's host-side table.
const FULL_HEAD_DIMS: [usize; 8] = [32, 64, 72, 80, 96, 128, 256, 512];

/// Whether candle's fused attention runs `queries` queries per head of `head_dim` in `dtype`:
/// the vector kernel for one query, the full kernel for more.
pub fn supported(head_dim: usize, dtype: DType, single_query: bool) -> bool {
    if !matches!(dtype, DType::BF16 | DType::F16 | DType::F32) {
        return false;
    }
    if single_query {
        VECTOR_HEAD_DIMS.contains(&head_dim)
    } else {
        FULL_HEAD_DIMS.contains(&head_dim)
            && !(head_dim == 512 && dtype == DType::F32)
            && full_kernel_threadgroup_bytes(head_dim, dtype) <= THREADGROUP_MEMORY_LIMIT
    }
}

/// Threadgroup memory of candle's full attention kernel: a `BQ × (BD + pad)` query tile and
/// a key/value tile, `pad` being 16 bytes of elements, with candle's tile sizes per head dim.
pub fn full_kernel_threadgroup_bytes(head_dim: usize, dtype: DType) -> usize {
    let (bq, bk) = match head_dim {
        512 => (8, 8),
        d if d < 128 => (32, 32),
        _ => (32, 16),
    };
    let elem = dtype.size_in_bytes();
    let pad = 16 / elem;
    let q_tile = bq * (head_dim + pad);
    let kv_tile = ((bk + pad) * head_dim).max(bk * (head_dim + pad));
    (q_tile + kv_tile) * elem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_full_kernel_at_head_dim_256_exceeds_threadgroup_memory() {
        // 32·260 query floats + 20·256 key floats.
        assert_eq!(full_kernel_threadgroup_bytes(256, DType::F32), 53_760);
        assert!(!supported(256, DType::F32, false));
        // One query needs no threadgroup tiles: the vector kernel exists.
        assert!(supported(256, DType::F32, true));
    }

    #[test]
    fn half_precision_full_kernels_fit() {
        assert_eq!(full_kernel_threadgroup_bytes(256, DType::BF16), 29_184);
        for dtype in [DType::BF16, DType::F16] {
            for dh in FULL_HEAD_DIMS {
                assert!(supported(dh, dtype, false), "{dh} {dtype:?}");
            }
        }
        assert_eq!(full_kernel_threadgroup_bytes(128, DType::F32), 27_136);
        assert!(supported(128, DType::F32, false));
    }

    #[test]
    fn head_dims_72_and_80_have_no_vector_kernel() {
        for dh in [72, 80] {
            for dtype in [DType::BF16, DType::F16, DType::F32] {
                assert!(!supported(dh, dtype, true), "{dh} {dtype:?}");
                assert!(supported(dh, dtype, false), "{dh} {dtype:?}");
            }
        }
    }

    #[test]
    fn other_head_dims_and_dtypes_fall_back() {
        assert!(!supported(48, DType::BF16, true));
        assert!(!supported(48, DType::BF16, false));
        assert!(!supported(128, DType::F64, true));
        assert!(!supported(512, DType::F32, false));
        assert!(supported(512, DType::BF16, false));
    }
}
