//! The MLX affine family in one place. On the host: the packed format ([`packing`]), the
//! per-group parameters ([`group_params`]), the matrix ([`matrix`]) and the q8 mode ([`q8`],
//! over the kernels [`q8_kernel`] and [`q8_interleaved`], which take slices). On a device
//! (this file): the matrices held as device tensors, and the products the model needs from
//! them. The packed words, scales and biases are the checkpoint's own (scales keep their
//! dtype), so a device copy costs what the checkpoint costs. The grouped expert GEMM is its
//! own op, `ops/affine_grouped/`.
//!
//! On Metal the products run `kernels/affine.metal`, on CUDA `kernels/affine.cu`; on the CPU a
//! plain twin ([`cpu`]) computes the same function, so the device-resident code path of the
//! model can be tested on any machine.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod decode_products;
pub mod dense_rows;
pub mod group_params;
pub mod matrix;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;
pub mod mma;
pub mod packing;
mod process_choice;
pub mod q8;
pub mod q8_interleaved;
#[cfg(target_arch = "x86_64")]
mod q8_interleaved_avx2;
mod q8_interleaved_block;
#[cfg(target_arch = "aarch64")]
mod q8_interleaved_neon;
pub mod q8_kernel;
pub mod split;
pub mod stream;
pub mod wide;

use crate::backend::on_device;
use crate::launches;
use crate::profile::{self, elems_bytes, tensor_bytes, Traffic};
use anyhow::{bail, ensure, Result};
use candle_core::{DType, Device, Tensor};
pub use decode_products::scope as decode_products_scope;
pub use decode_products::{decode_products, set_decode_products, DecodeProducts};
pub use dense_rows::scope as dense_rows_scope;
pub use dense_rows::{dense_rows, set_dense_rows, DenseRows, DENSE_ROWS_MAX};
pub use group_params::GroupParams;
pub use matrix::AffineMatrix;
pub use packing::{dequantize_row, pack_row, unpack_row, SUPPORTED_BITS, SUPPORTED_GROUPS};

/// Up to this many activation rows, products read the packed weights directly (one pass per
/// row, the decode case); beyond it, up to [`DENSE_ROWS_MAX`] rows (a batched decode step),
/// the process's [`DenseRows`] choice runs them, and past that (prefill) the weight is
/// dequantized once and multiplied densely.
pub const MATVEC_MAX_ROWS: usize = 4;

/// Most tokens one gathered SwiGLU product ([`AffineTensor::gather_swiglu`]) takes: a batched
/// decode step's rows (issue 29). Every (token, slot) pair is its own output row reading its
/// expert, so a pair computes what it computes alone, and the step neither reads the routing
/// back nor launches per expert. The bytes grow with the pairs (B·S expert reads, against
/// the distinct experts a grouping reads): at Qwen3-Next-80B's 11 slots of ~1.6 MB, B = 64
/// reads ≤ 704 experts a layer (~54 GB a step, ~11 ms at the H200's bandwidth) where a
/// grouping reads ~367 (~28 GB), against the 63 ms a step measured with the composed,
/// read-back path. Past this many rows the grouping's bytes win, and the MoE composes.
pub const GATHER_MAX_TOKENS: usize = 64;

/// A `[experts, rows, cols]` affine matrix on a device.
#[derive(Debug, Clone)]
pub struct AffineTensor {
    pub bits: usize,
    pub group_size: usize,
    pub experts: usize,
    pub rows: usize,
    pub cols: usize,
    /// `[experts * rows, cols * bits / 32]` u32.
    pub packed: Tensor,
    /// `[experts * rows, cols / group_size]` in the checkpoint's scale dtype.
    pub scales: Tensor,
    pub biases: Tensor,
}

impl AffineTensor {
    /// Copies a host matrix onto `device`, scales back in the dtype they were stored in.
    pub fn upload(m: &AffineMatrix, device: &Device) -> Result<Self> {
        let n = m.experts * m.rows;
        let packed = Tensor::from_slice(m.packed(), (n, m.words_per_row()), device)?;
        let groups = (n, m.groups_per_row());
        // Where the device has no bf16 kernels, bf16 scales are widened to f32 (exact) on the
        // host: f16 would lose those outside its range.
        let widen = matches!(m.scales(), GroupParams::Bf16(_))
            && !crate::capability::bf16_supported(device)?;
        let place = |data: &GroupParams| -> Result<Tensor> {
            if widen {
                let host = data.to_tensor(groups, &Device::Cpu)?;
                Ok(host.to_dtype(DType::F32)?.to_device(device)?)
            } else {
                Ok(data.to_tensor(groups, device)?)
            }
        };
        let scales = place(m.scales())?;
        let biases = place(m.biases())?;
        Ok(Self {
            bits: m.bits,
            group_size: m.group_size,
            experts: m.experts,
            rows: m.rows,
            cols: m.cols,
            packed,
            scales,
            biases,
        })
    }

    pub fn device(&self) -> &Device {
        self.packed.device()
    }

    /// Bytes one full pass over the matrix reads.
    pub fn bytes(&self) -> usize {
        [&self.packed, &self.scales, &self.biases]
            .iter()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }

    /// Bytes of one row of one expert: its packed words, scales and biases (every row holds
    /// as many).
    pub fn row_bytes(&self) -> usize {
        self.bytes() / (self.experts * self.rows).max(1)
    }

    /// Expert `e` of the stack as a single matrix: views of its rows of the packed words,
    /// scales and biases (no copy, no launch), so that the products and the dequantization
    /// of one expert read only that expert.
    pub fn expert(&self, e: usize) -> Result<Self> {
        ensure!(
            e < self.experts,
            "expert id {e} out of range ({} experts)",
            self.experts
        );
        let rows = |t: &Tensor| t.narrow(0, e * self.rows, self.rows);
        Ok(Self {
            experts: 1,
            packed: rows(&self.packed)?,
            scales: rows(&self.scales)?,
            biases: rows(&self.biases)?,
            ..self.clone()
        })
    }

    /// `x Wᵀ` for a single matrix: `x` `[..., cols]` → `[..., rows]` in x's dtype.
    pub fn matmul_t(&self, x: &Tensor) -> Result<Tensor> {
        ensure!(
            self.experts == 1,
            "matmul_t on a stack of {} experts",
            self.experts
        );
        let x_rows = self.check_input(x, "affine matmul")?;
        let mut out_shape = x.dims().to_vec();
        *out_shape.last_mut().expect("checked rank") = self.rows;
        let x2 = x.reshape((x_rows, self.cols))?;
        let path = if x_rows <= MATVEC_MAX_ROWS {
            DenseRows::RowProducts
        } else if x_rows <= DENSE_ROWS_MAX {
            dense_rows().path(
                x_rows,
                [self.rows, self.cols],
                self.has_grouped_kernel(&x2),
                self.has_split_kernel(&x2),
            )
        } else {
            // Prefill: dequantizing once beats reading the packed weights per row.
            DenseRows::Dequantize
        };
        let y = match path {
            DenseRows::RowProducts => self.products(&x2, None, 1, x_rows)?,
            DenseRows::Grouped => self.grouped_matmul_t(&x2, &[0, x_rows as u32])?,
            DenseRows::SplitK => self.split_matmul_t(&x2)?,
            _ => {
                let w = self.dequantize(None, self.rows, x.dtype())?;
                launches::candle_op(x2.matmul(&w.t()?))?
            }
        };
        Ok(y.reshape(out_shape)?)
    }

    /// Expert products selected on the device: `x` `[N, cols]` (every slot of a token reads
    /// its row) or `[N, k, cols]` (one row per slot), `ids` `[N, k]` u32 expert indices →
    /// `[N, k, rows]`, slot `(n, j)` computed with expert `ids[n, j]`.
    pub fn gather_matmul_t(&self, x: &Tensor, ids: &Tensor) -> Result<Tensor> {
        let (n, k) = ids.dims2()?;
        ensure!(ids.dtype() == DType::U32, "expert ids must be u32");
        let x_rows = self.check_input(x, "expert matmul")?;
        let x_div = match x.rank() {
            2 if x_rows == n => k,
            3 if x.dims()[..2] == [n, k] => 1,
            _ => bail!(
                "expert matmul: input {:?} does not match ids {:?}",
                x.dims(),
                ids.dims()
            ),
        };
        let x2 = x.reshape((x_rows, self.cols))?;
        let ids = ids.flatten_all()?;
        Ok(self
            .products(&x2, Some(&ids), x_div, n * k)?
            .reshape((n, k, self.rows))?)
    }

    /// Whether [`Self::gather_swiglu`] has a kernel for `tokens` rows of x in `dtype`: decode
    /// rows only (`tokens <= GATHER_MAX_TOKENS`, a batched step's), a stacked gate-and-up
    /// matrix (an even number of rows per expert), and the bit widths and group sizes the
    /// products support. Otherwise the model runs `gather_matmul_t` on separate gate and up
    /// stacks and the SwiGLU with candle ops.
    pub fn supports_gather_swiglu(&self, tokens: usize, dtype: DType) -> bool {
        (1..=GATHER_MAX_TOKENS).contains(&tokens)
            && self.rows >= 2
            && self.rows.is_multiple_of(2)
            && matches!(self.bits, 2 | 3 | 4 | 5 | 6 | 8)
            && self.group_size.is_multiple_of(8)
            && self.cols.is_multiple_of(self.group_size)
            && matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
            && matches!(self.scales.dtype(), DType::F32 | DType::F16 | DType::BF16)
    }

    /// The gate and up products of the experts selected on the device, with the SwiGLU
    /// between them, in one kernel. `self` is a stacked `[E, 2·Im, H]` matrix whose expert `e`
    /// holds its gate rows `0..Im`, then its up rows `Im..2·Im`; `x` `[N, H]` (every slot of a
    /// token reads its row); `ids` `[N, S]` u32 → `act` `[N, S, Im]` in x's dtype, with
    /// `e = ids[n, s]`, in f32: `g = InT(x·W[e, i])`, `u = InT(x·W[e, Im + i])`,
    /// `act = InT(silu(g)·u)`, `silu(g) = g / (1 + exp(−g))`.
    ///
    /// Decode rows only: `N <= GATHER_MAX_TOKENS` (see [`Self::supports_gather_swiglu`]); more
    /// rows are an error, and the model falls back to the composed products.
    pub fn gather_swiglu(&self, x: &Tensor, ids: &Tensor) -> Result<Tensor> {
        let (n, slots) = ids.dims2()?;
        ensure!(ids.dtype() == DType::U32, "expert ids must be u32");
        ensure!(
            self.rows.is_multiple_of(2),
            "expert swiglu: {} rows per expert are not gate rows then as many up rows",
            self.rows
        );
        let x_rows = self.check_input(x, "expert swiglu")?;
        ensure!(
            x.rank() == 2 && x_rows == n,
            "expert swiglu: input {:?} must be [{n}, {}]",
            x.dims(),
            self.cols
        );
        ensure!(
            n <= GATHER_MAX_TOKENS,
            "expert swiglu: {n} tokens; the fused kernel covers at most {GATHER_MAX_TOKENS}"
        );
        let x = x.contiguous()?;
        let ids = ids.flatten_all()?;
        let out_rows = n * slots;
        // Bytes moved (the decode profile): x and the ids read, and each slot's expert, gate
        // and up rows, read whole (`out_rows` experts, not the stack: at one token the slots
        // name distinct experts); half as many activations written as rows read per slot.
        let traffic = || {
            Ok(Traffic::new()
                .read_all(&x)
                .read_all(&ids)
                .read(out_rows * self.rows * self.row_bytes())
                .write(elems_bytes(out_rows * self.rows / 2, x.dtype())))
        };
        let call = Products {
            kind: ProductKind::Swiglu,
            x: &x,
            ids: Some(&ids),
            x_div: slots,
            out_rows,
        };
        let act = profile::kernel("affine_products_swiglu", self.device(), traffic, || {
            self.run_products(&call)
        })?;
        Ok(act.reshape((n, slots, self.rows / 2))?)
    }

    /// Rows of the stacked `[experts * rows, cols]` matrix, dequantized into `dtype`: the rows
    /// listed in `ids` (u32, e.g. token ids of an embedding table) or the first `count`.
    pub fn dequantize(&self, ids: Option<&Tensor>, count: usize, dtype: DType) -> Result<Tensor> {
        if let Some(ids) = ids {
            ensure!(ids.dtype() == DType::U32, "row ids must be u32");
            ensure!(
                ids.rank() == 1 && ids.dim(0)? == count,
                "row ids must be [{count}]"
            );
        }
        // Bytes moved (the decode profile): the `count` rows dequantized and their ids read,
        // as many rows of `cols` values written in `dtype`.
        let traffic = || {
            Ok(Traffic::new()
                .read(count * self.row_bytes() + ids.map_or(0, tensor_bytes))
                .write(elems_bytes(count * self.cols, dtype)))
        };
        let device = self.device();
        profile::kernel("affine_dequantize", device, traffic, || {
            on_device!(
                device,
                "affine dequantize",
                dequantize(self, ids, count, dtype)
            )
        })
    }

    /// Rows of x the input stands for, after checking its width and device.
    fn check_input(&self, x: &Tensor, op: &str) -> Result<usize> {
        ensure!(
            x.dims().last() == Some(&self.cols),
            "{op}: input {:?} does not end in {}",
            x.dims(),
            self.cols
        );
        ensure!(
            x.device().same_device(self.device()),
            "{op}: input and weights are on different devices"
        );
        Ok(x.elem_count() / self.cols)
    }

    /// `out_rows` products; output row `i` reads x row `i / x_div` and expert `ids[i]` (or 0).
    fn products(
        &self,
        x: &Tensor,
        ids: Option<&Tensor>,
        x_div: usize,
        out_rows: usize,
    ) -> Result<Tensor> {
        // A gathered product (ids: the experts' slots) is its own row kind in the profile.
        let name = match ids {
            Some(_) => "affine_products_gathered",
            None => "affine_products",
        };
        let traffic = || Ok(self.products_traffic(x, ids, out_rows));
        let call = Products {
            kind: ProductKind::Plain,
            x,
            ids,
            x_div,
            out_rows,
        };
        profile::kernel(name, self.device(), traffic, || self.run_products(&call))
    }

    /// `call` on this matrix's device.
    fn run_products(&self, call: &Products) -> Result<Tensor> {
        on_device!(self.device(), call.op(), products(self, call))
    }

    /// Bytes [`Self::products`] moves (the decode profile): the x rows (each once, however
    /// many output rows share one) and the ids read; the matrix read whole once without ids,
    /// or with ids the whole matrix of each output row's expert (`out_rows` experts, not the
    /// stack: at one token the slots name distinct experts); `out_rows` rows of `rows` values
    /// written in x's dtype.
    fn products_traffic(&self, x: &Tensor, ids: Option<&Tensor>, out_rows: usize) -> Traffic {
        let weights = match ids {
            Some(_) => out_rows * self.rows * self.row_bytes(),
            None => self.bytes(),
        };
        Traffic::new()
            .read_all(x)
            .read(ids.map_or(0, tensor_bytes) + weights)
            .write(elems_bytes(out_rows * self.rows, x.dtype()))
    }
}

/// `AffineParams` of kernels/params/affine.h, field for field: the launch parameters shared
/// by every backend.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AffineParams {
    pub rows: u32,
    pub cols: u32,
    pub bits: u32,
    pub group_size: u32,
    pub out_rows: u32,
    pub x_div: u32,
    pub has_ids: u32,
}

impl AffineParams {
    /// The parameters of a launch over `m` that takes `rows` rows per expert (or, for the
    /// dequantization's row ids, the whole stack's) and writes `out_rows` rows.
    pub fn new(
        m: &AffineTensor,
        rows: usize,
        out_rows: usize,
        x_div: usize,
        has_ids: bool,
    ) -> Self {
        Self {
            rows: rows as u32,
            cols: m.cols as u32,
            bits: m.bits as u32,
            group_size: m.group_size as u32,
            out_rows: out_rows as u32,
            x_div: x_div as u32,
            has_ids: has_ids as u32,
        }
    }
}

/// What a products kernel writes per output row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProductKind {
    /// The products with the expert's rows: `m.rows` values.
    Plain,
    /// The SwiGLU of a stacked gate-and-up matrix (gate rows `0..Im`, up rows `Im..2·Im`):
    /// `Im = m.rows / 2` activations.
    Swiglu,
}

/// One products call, as every backend receives it: `out_rows` output rows, row `i` reading
/// x row `i / x_div` with expert `ids[i]` (expert 0 without ids).
#[derive(Clone, Copy)]
pub(crate) struct Products<'a> {
    pub kind: ProductKind,
    pub x: &'a Tensor,
    pub ids: Option<&'a Tensor>,
    pub x_div: usize,
    pub out_rows: usize,
}

impl Products<'_> {
    /// Values of each output row.
    pub(crate) fn width(&self, m: &AffineTensor) -> usize {
        match self.kind {
            ProductKind::Plain => m.rows,
            ProductKind::Swiglu => m.rows / 2,
        }
    }

    /// The op's name in messages.
    pub(crate) fn op(&self) -> &'static str {
        match self.kind {
            ProductKind::Plain => "affine matmul",
            ProductKind::Swiglu => "expert swiglu",
        }
    }
}
