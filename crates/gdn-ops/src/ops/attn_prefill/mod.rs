//! Causal prefill attention in one kernel (flash attention's forward pass): the `S` queries
//! of a chunk over the `T` cached keys, without the score matrices of the composed path.
//!
//! Inputs (InT f16 or bf16 on CUDA; the CPU twin also takes f32): `q` `[B, Nq, S, Dh]` (any
//! layout: the host copies it contiguous), `k`, `v` `[B, Nkv, T, Dh]`: rows of `Dh`
//! contiguous values at any strides (views of the KV cache, narrowed from its capacity, are
//! read in place). Query `i` sits at position `offset + i` and sees keys
//! `j ≤ offset + i`, `j < T`; query head `h` reads KV head `h / (Nq / Nkv)`.
//!
//! The function is the composed path's (`attend_dense` in qwen-gdn-model's
//! `layers/attention.rs`), with its rounding where it matters:
//! `s_j = round_InT(round_InT(q·k_j) · round_InT(Dh^−½))` (the product in InT, then the
//! scale applied in InT; exact for Dh 64 and 256, whose scales are powers of two), then in
//! f32 `m = max_j s_j`, `p_j = exp(s_j − m)`, `l = Σ p_j`, and
//! `out = round_InT(Σ_j round_InT(p_j)·v_j / l)`. The composed path rounds the normalized
//! `p_j / l` to InT instead; the kernel's online softmax rounds `exp(s_j − m')` for the
//! running max `m'` of the keys seen so far: each a rounding of InT per term apart.
//!
//! Output: `[B, Nq, S, Dh]` in InT, contiguous. `S = 0` gives an empty result and `T = 0`
//! zeros (no key is attended), both without a launch.
//!
//! Kernel: `kernels/attn_prefill.cu` (its header describes the tiles: 64 queries a block, 4
//! warps of 16 rows, keys in tiles of 64, wmma 16×16×16 with f32 accumulators, the output in
//! registers). CUDA only: on Metal candle's `sdpa` already computes this in one kernel, so
//! there is no Metal kernel; [`supports`] is false there.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::launches;
use crate::profile::{self, Traffic};
use anyhow::{anyhow, bail, ensure, Result};
use candle_core::{DType, Device, Tensor};

/// Query rows per block (`kRows` of the kernel).
pub const QUERY_TILE: usize = 64;
/// Keys per tile (`kKeys`).
pub const KEY_TILE: usize = 64;
/// Threads per block: 4 warps of 16 query rows (`kThreads`).
pub const THREADS: usize = 128;
/// Largest head dim: a warp holds its 16 rows of the output in registers.
pub const MAX_HEAD_DIM: usize = 256;

/// `AttnPrefillParams` of kernels/params/attn_prefill.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnPrefillParams {
    pub batch: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub queries: u32,
    pub keys: u32,
    pub offset: u32,
    pub q_tiles: u32,
    pub k_batch_stride: u32,
    pub k_head_stride: u32,
    pub k_row_stride: u32,
    pub v_batch_stride: u32,
    pub v_head_stride: u32,
    pub v_row_stride: u32,
    pub scale: f32,
}

/// Shapes of one call, read off its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnPrefillDims {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// S.
    pub queries: usize,
    /// T.
    pub keys: usize,
    pub offset: usize,
}

impl AttnPrefillDims {
    /// Blocks along the queries: `ceil(S / QUERY_TILE)`.
    pub fn q_tiles(&self) -> usize {
        self.queries.div_ceil(QUERY_TILE)
    }

    /// `Dh^−½` rounded to `dtype`, as the composed path multiplies its scores by it.
    pub fn scale(&self, dtype: DType) -> f32 {
        crate::backend::round_to(dtype, (self.head_dim as f32).powf(-0.5))
    }
}

/// Bytes of dynamic shared memory of a block for head dim `head_dim` (`smem_bytes` of the
/// kernel): Q and one K/V tile of 64 rows of `Dh + 8` 2-byte values, and per warp a 16 × 68
/// f32 scratch. 84 992 bytes at Dh 256: two blocks an SM.
pub fn smem_bytes(head_dim: usize) -> usize {
    2 * QUERY_TILE * (head_dim + 8) * 2 + (THREADS / 32) * 16 * (KEY_TILE + 4) * 4
}

/// Whether the kernel runs this attention: on a CUDA device, head dim a multiple of 16 up to
/// 256, `q_heads` a multiple of `kv_heads`, f16 or bf16.
pub fn supports(
    device: &Device,
    head_dim: usize,
    q_heads: usize,
    kv_heads: usize,
    dtype: DType,
) -> bool {
    device.is_cuda()
        && matches!(dtype, DType::F16 | DType::BF16)
        && head_dim.is_multiple_of(16)
        && (16..=MAX_HEAD_DIM).contains(&head_dim)
        && kv_heads > 0
        && q_heads > 0
        && q_heads.is_multiple_of(kv_heads)
}

/// `[B, Nq, S, Dh]`: see the module doc.
pub fn attn_prefill(q: &Tensor, k: &Tensor, v: &Tensor, offset: usize) -> Result<Tensor> {
    let dims = check(q, k, v, offset)?;
    if dims.queries == 0 || dims.keys == 0 || dims.batch == 0 || dims.q_heads == 0 {
        let shape = (dims.batch, dims.q_heads, dims.queries, dims.head_dim);
        return Ok(Tensor::zeros(shape, q.dtype(), q.device())?);
    }
    // Bytes moved (the decode profile): q, and each KV head's keys and values once (a block
    // of queries rereads them, from cache at best: counted once); the output written.
    let traffic = || {
        Ok(Traffic::new()
            .read_all(q)
            .read_all(k)
            .read_all(v)
            .write_all(q))
    };
    let device = q.device();
    profile::kernel("attn_prefill", device, traffic, || match device {
        Device::Cpu => launches::cpu_twin(|| cpu::attn_prefill(dims, q, k, v)),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            ensure!(
                supports(
                    q.device(),
                    dims.head_dim,
                    dims.q_heads,
                    dims.kv_heads,
                    q.dtype()
                ),
                "attn_prefill: no kernel for head dim {}, {} query heads over {} KV heads in {:?}",
                dims.head_dim,
                dims.q_heads,
                dims.kv_heads,
                q.dtype()
            );
            cuda::attn_prefill(dims, q, k, v)
        }
        #[allow(unreachable_patterns)]
        other => bail!("attn_prefill: no kernel for device {other:?}"),
    })
}

fn check(q: &Tensor, k: &Tensor, v: &Tensor, offset: usize) -> Result<AttnPrefillDims> {
    const OP: &str = "attn_prefill";
    let (batch, q_heads, queries, head_dim) = q
        .dims4()
        .map_err(|_| anyhow!("{OP}: q {:?}, expected [B, Nq, S, Dh]", q.dims()))?;
    let (kb, kv_heads, keys, kd) = k
        .dims4()
        .map_err(|_| anyhow!("{OP}: k {:?}, expected [B, Nkv, T, Dh]", k.dims()))?;
    ensure!(
        kb == batch && kd == head_dim,
        "{OP}: k {:?} does not match q {:?}",
        k.dims(),
        q.dims()
    );
    ensure!(
        v.dims() == k.dims(),
        "{OP}: v {:?} must match k {:?}",
        v.dims(),
        k.dims()
    );
    ensure!(
        kv_heads > 0 && q_heads.is_multiple_of(kv_heads),
        "{OP}: {q_heads} query heads over {kv_heads} KV heads"
    );
    let dtype = q.dtype();
    for (name, t) in [("k", k), ("v", v)] {
        ensure!(
            t.dtype() == dtype,
            "{OP}: {name} is {:?}, q {dtype:?}",
            t.dtype()
        );
        ensure!(
            t.device().same_device(q.device()),
            "{OP}: q, k and v must be on one device"
        );
    }
    ensure!(
        offset + queries <= u32::MAX as usize && keys <= u32::MAX as usize,
        "{OP}: {queries} queries at offset {offset} over {keys} keys exceed the kernel's u32 positions"
    );
    Ok(AttnPrefillDims {
        batch,
        q_heads,
        kv_heads,
        head_dim,
        queries,
        keys,
        offset,
    })
}
