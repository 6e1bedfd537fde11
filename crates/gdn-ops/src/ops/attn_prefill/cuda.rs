//! CUDA host side of `kernels/attn_prefill.cu`: one launch, a block of [`THREADS`] threads per
//! (query tile of [`QUERY_TILE`], query head, sequence). k and v are read in place at their
//! strides (the KV cache's views); q is made contiguous.

use super::{smem_bytes, AttnPrefillDims, AttnPrefillParams, THREADS};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, Element, Held, Kernel, KernelSource,
};
use crate::backend::{kernel_instance, row_layout, RowLayout};
use anyhow::{bail, ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::{CudaDevice, DType, Tensor};

const OP: &str = "attn_prefill";
const SOURCE: KernelSource = cuda_source!("attn_prefill");

// SAFETY: `AttnPrefillParams` is `repr(C)` of fourteen u32 and an f32, as the kernel's struct.
unsafe impl DeviceRepr for AttnPrefillParams {}

pub(crate) fn attn_prefill(
    d: AttnPrefillDims,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<Tensor> {
    let dev = cuda_device(q, OP)?;
    ensure!(
        d.q_heads <= 65535 && d.batch <= 65535,
        "{OP}: at most 65535 query heads and sequences per call"
    );
    // Contiguous, its rows 16-byte aligned (the start of a contiguous view of Dh-multiples
    // always is, but a copy costs little beside the attention).
    let q = if q.is_contiguous() && q.layout().start_offset().is_multiple_of(8) {
        q.clone()
    } else {
        q.copy()?
    };
    // cp.async copies 16 bytes: every row must start 16-byte aligned. A view that does not
    // (never the KV cache's) is copied first.
    let (k, k_rows) = aligned_rows(k, d, "k")?;
    let (v, v_rows) = aligned_rows(v, d, "v")?;
    match q.dtype() {
        DType::F16 => run::<half::f16>(d, [&q, &k, &v], [&k_rows, &v_rows], &dev),
        DType::BF16 => run::<half::bf16>(d, [&q, &k, &v], [&k_rows, &v_rows], &dev),
        other => bail!("{OP}: no kernel for {other:?}"),
    }
}

/// `t` as rows of `Dh` contiguous values whose starts and strides are multiples of 8
/// elements (16 bytes) and fit u32, copying it contiguous when they are not.
fn aligned_rows(t: &Tensor, d: AttnPrefillDims, what: &str) -> Result<(Tensor, RowLayout)> {
    let lead = [d.batch, d.kv_heads, d.keys];
    let rows = row_layout(t, &lead, d.head_dim, &format!("{OP}: {what}"))?;
    let fits = |x: usize| x.is_multiple_of(8) && x <= u32::MAX as usize;
    if fits(rows.start) && rows.strides.iter().all(|&s| fits(s)) {
        return Ok((t.clone(), rows));
    }
    let t = t.contiguous()?;
    let rows = row_layout(&t, &lead, d.head_dim, &format!("{OP}: {what}"))?;
    Ok((t, rows))
}

/// The strides of a row layout as the kernel takes them (a dim of 1 has stride 0, and a
/// single position any: the kernel never steps over it).
fn strides(rows: &RowLayout) -> [u32; 3] {
    [
        rows.strides[0] as u32,
        rows.strides[1] as u32,
        rows.strides[2] as u32,
    ]
}

/// `inputs`: q (contiguous), k, v; `rows`: the layouts of k and v.
fn run<T>(
    d: AttnPrefillDims,
    [q, k, v]: [&Tensor; 3],
    [k_rows, v_rows]: [&RowLayout; 2],
    dev: &CudaDevice,
) -> Result<Tensor>
where
    T: Element,
{
    let smem = smem_bytes(d.head_dim);
    let name = kernel_instance("attn_prefill", &[T::DTYPE], OP)?;
    let kernel = Kernel::load_with_shared(dev, &SOURCE, &name, smem)?;
    let len = d.batch * d.q_heads * d.queries * d.head_dim;
    // SAFETY: the kernel writes every row of every (query head, sequence).
    let out = unsafe { dev.alloc::<T>(len)? };
    {
        let [q, k, v] = [q, k, v].map(Held::new);
        let q_view = q.view::<T>(OP)?;
        let k_view = k.rows::<T>(k_rows, OP)?;
        let v_view = v.rows::<T>(v_rows, OP)?;
        let [k_batch_stride, k_head_stride, k_row_stride] = strides(k_rows);
        let [v_batch_stride, v_head_stride, v_row_stride] = strides(v_rows);
        let params = AttnPrefillParams {
            batch: d.batch as u32,
            q_heads: d.q_heads as u32,
            kv_heads: d.kv_heads as u32,
            head_dim: d.head_dim as u32,
            queries: d.queries as u32,
            keys: d.keys as u32,
            offset: d.offset as u32,
            q_tiles: d.q_tiles() as u32,
            k_batch_stride,
            k_head_stride,
            k_row_stride,
            v_batch_stride,
            v_head_stride,
            v_row_stride,
            scale: d.scale(T::DTYPE),
        };
        let mut args = kernel.args();
        args.arg(&q_view)
            .arg(&k_view)
            .arg(&v_view)
            .arg(&out)
            .arg(&params);
        let grid = (d.q_tiles() as u32, d.q_heads as u32, d.batch as u32);
        let geometry = config(grid, (THREADS as u32, 1, 1), smem);
        // SAFETY: arguments in the order and types of `attn_prefill_*` in
        // kernels/attn_prefill.cu; q covers [B, Nq, S, Dh], the k and v views every row their
        // strides reach (row_layout's span), with 16-byte aligned rows (aligned_rows); the
        // shared memory is smem_bytes(Dh), the function's limit raised to it.
        unsafe { launch(args, geometry) }?;
    }
    Ok(tensor(
        out,
        dev,
        (d.batch, d.q_heads, d.queries, d.head_dim),
    ))
}
