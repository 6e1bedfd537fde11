//! Weight matrices as the CPU path uses them, and the dequantize-and-dot matmul kernel.
//!
//! A [`Matrix`] holds one or more stacked `[rows, cols]` matrices (experts stack on a
//! leading axis) either MLX-affine-quantized or in their checkpoint float dtype. Products
//! are computed in f32 on exactly dequantized rows: each task dequantizes one row into a
//! small buffer and dots it with every activation row, so no whole f32 matrix ever exists.

use super::affine::AffineMatrix;
use half::{bf16, f16};
use rayon::prelude::*;

/// Unquantized weights, kept in the checkpoint's dtype to keep memory at checkpoint size.
#[derive(Debug, Clone)]
pub enum FloatData {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl FloatData {
    fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::Bf16(v) => v.len(),
            Self::F16(v) => v.len(),
        }
    }

    pub(crate) fn copy_into(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            Self::F32(v) => out.copy_from_slice(&v[start..end]),
            Self::Bf16(v) => out
                .iter_mut()
                .zip(&v[start..end])
                .for_each(|(o, x)| *o = x.to_f32()),
            Self::F16(v) => out
                .iter_mut()
                .zip(&v[start..end])
                .for_each(|(o, x)| *o = x.to_f32()),
        }
    }

    fn gather_rows(&self, cols: usize, rows: impl Iterator<Item = usize> + Clone) -> Self {
        fn pick<T: Copy>(v: &[T], cols: usize, rows: impl Iterator<Item = usize>) -> Vec<T> {
            rows.flat_map(|r| v[r * cols..(r + 1) * cols].iter().copied())
                .collect()
        }
        match self {
            Self::F32(v) => Self::F32(pick(v, cols, rows)),
            Self::Bf16(v) => Self::Bf16(pick(v, cols, rows)),
            Self::F16(v) => Self::F16(pick(v, cols, rows)),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Self::F32(v) => 4 * v.len(),
            Self::Bf16(v) => 2 * v.len(),
            Self::F16(v) => 2 * v.len(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct FloatMatrix {
    pub experts: usize,
    pub rows: usize,
    pub cols: usize,
    pub data: FloatData,
}

impl FloatMatrix {
    pub fn new(experts: usize, rows: usize, cols: usize, data: FloatData) -> anyhow::Result<Self> {
        anyhow::ensure!(
            data.len() == experts * rows * cols,
            "float matrix size mismatch"
        );
        Ok(Self {
            experts,
            rows,
            cols,
            data,
        })
    }
}

#[derive(Debug, Clone)]
pub enum Matrix {
    Affine(AffineMatrix),
    Float(FloatMatrix),
}

/// Output rows handled by one parallel task: large enough to amortise scheduling, small
/// enough to balance two to many cores.
const ROWS_PER_TASK: usize = 16;

impl Matrix {
    pub fn rows(&self) -> usize {
        match self {
            Self::Affine(m) => m.rows,
            Self::Float(m) => m.rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Self::Affine(m) => m.cols,
            Self::Float(m) => m.cols,
        }
    }

    pub fn experts(&self) -> usize {
        match self {
            Self::Affine(m) => m.experts,
            Self::Float(m) => m.experts,
        }
    }

    /// A copy of experts `range` of the stack, as a stack of `range.len()` experts (one
    /// rank's shard of an expert-parallel plan).
    pub fn experts_range(&self, range: std::ops::Range<usize>) -> anyhow::Result<Self> {
        Ok(match self {
            Self::Affine(m) => Self::Affine(m.experts_range(range)?),
            Self::Float(m) => {
                anyhow::ensure!(
                    range.start < range.end && range.end <= m.experts,
                    "experts {range:?} of a stack of {}",
                    m.experts
                );
                let per = m.rows * m.cols;
                let elems = range.start * per..range.end * per;
                let data = match &m.data {
                    FloatData::F32(v) => FloatData::F32(v[elems].to_vec()),
                    FloatData::Bf16(v) => FloatData::Bf16(v[elems].to_vec()),
                    FloatData::F16(v) => FloatData::F16(v[elems].to_vec()),
                };
                Self::Float(FloatMatrix::new(range.len(), m.rows, m.cols, data)?)
            }
        })
    }

    /// Bytes of weight data (what one full pass over this matrix reads).
    pub fn bytes(&self) -> usize {
        match self {
            Self::Affine(m) => m.bytes(),
            Self::Float(m) => m.data.bytes(),
        }
    }

    /// Writes row `row` of expert `expert` in f32 into `out`.
    pub fn row_into(&self, expert: usize, row: usize, out: &mut [f32]) {
        let global = expert * self.rows() + row;
        match self {
            Self::Affine(m) => m.dequantize_row(global, out),
            Self::Float(m) => m.data.copy_into(global * m.cols, out),
        }
    }

    /// Keeps the listed rows of every expert, in that order.
    pub fn select_rows(&self, rows: &[usize]) -> Self {
        match self {
            Self::Affine(m) => Self::Affine(m.select_rows(rows)),
            Self::Float(m) => {
                let it = (0..m.experts).flat_map(|e| rows.iter().map(move |&r| e * m.rows + r));
                Self::Float(FloatMatrix {
                    rows: rows.len(),
                    data: m.data.gather_rows(m.cols, it),
                    ..*m
                })
            }
        }
    }

    /// Stacks single matrices of identical format along the row axis, so that several
    /// projections of the same input run as one product. `None` if formats differ.
    pub fn concat_rows(parts: &[&Self]) -> Option<Self> {
        match parts.first()? {
            Self::Affine(_) => {
                let inner: Option<Vec<&AffineMatrix>> = parts
                    .iter()
                    .map(|m| match m {
                        Self::Affine(a) => Some(a),
                        Self::Float(_) => None,
                    })
                    .collect();
                AffineMatrix::concat_rows(&inner?).map(Self::Affine)
            }
            Self::Float(first) => {
                let mut rows = 0;
                let mut data: Vec<f32> = vec![];
                for m in parts {
                    let Self::Float(f) = m else { return None };
                    if f.cols != first.cols || f.experts != 1 {
                        return None;
                    }
                    let mut buf = vec![0f32; f.rows * f.cols];
                    f.data.copy_into(0, &mut buf);
                    data.extend_from_slice(&buf);
                    rows += f.rows;
                }
                let data = match first.data {
                    FloatData::F32(_) => FloatData::F32(data),
                    FloatData::Bf16(_) => {
                        FloatData::Bf16(data.iter().map(|&x| bf16::from_f32(x)).collect())
                    }
                    FloatData::F16(_) => {
                        FloatData::F16(data.iter().map(|&x| f16::from_f32(x)).collect())
                    }
                };
                Some(Self::Float(FloatMatrix {
                    experts: 1,
                    rows,
                    cols: first.cols,
                    data,
                }))
            }
        }
    }

    /// `y = x · W[expert]ᵀ` for `x` of shape `[m, cols]` (row-major); returns `[m, rows]`.
    pub fn matmul_t(&self, expert: usize, x: &[f32], m: usize) -> Vec<f32> {
        Self::matmul_t_many(&[Product {
            matrix: self,
            expert,
            x,
            m,
        }])
        .pop()
        .expect("one product in, one out")
    }

    /// Several independent products (the selected experts of a MoE layer) in one parallel
    /// pass: the workers are woken once for all of them rather than once per product, and
    /// small products share the cores instead of each being split in two.
    pub fn matmul_t_many(products: &[Product]) -> Vec<Vec<f32>> {
        // Read on the calling thread: the rayon workers below do not see its thread-locals.
        let q8 = gdn_ops::ops::affine::q8::enabled();
        let prepared: Vec<Option<Prepared>> =
            products.iter().map(|p| Prepared::new(p, q8)).collect();
        let mut outputs: Vec<Vec<f32>> = products
            .iter()
            .map(|p| vec![0f32; p.matrix.rows() * p.m])
            .collect();
        // Every product's output, `[rows, m]`, cut into tasks of ROWS_PER_TASK rows.
        let mut tasks: Vec<(&Prepared, usize, &mut [f32])> = vec![];
        for (prep, yt) in prepared.iter().zip(outputs.iter_mut()) {
            if let Some(prep) = prep {
                let per_task = ROWS_PER_TASK * prep.m;
                for (i, out) in yt.chunks_mut(per_task.max(1)).enumerate() {
                    tasks.push((prep, i * ROWS_PER_TASK, out));
                }
            }
        }
        tasks
            .into_par_iter()
            .for_each(|(prep, first, out)| prep.fill(first, out));
        let mut gemm = GemmBlocks::run(products, &prepared).into_iter();
        products
            .iter()
            .zip(prepared)
            .zip(outputs)
            .map(|((p, prep), yt)| match prep {
                Some(_) => transpose_rows(yt, p.matrix.rows(), p.m),
                None => gemm
                    .next()
                    .expect("one GEMM output per prefill-shaped product"),
            })
            .collect()
    }
}

/// One `x · W[expert]ᵀ` for [`Matrix::matmul_t_many`].
#[derive(Clone, Copy)]
pub struct Product<'a> {
    pub matrix: &'a Matrix,
    pub expert: usize,
    /// `[m, cols]`, row-major.
    pub x: &'a [f32],
    pub m: usize,
}

/// A product ready to be computed a block of weight rows at a time, with what every block
/// needs from the activations computed once.
struct Prepared<'a> {
    product: Product<'a>,
    m: usize,
    kind: Kernel<'a>,
}

enum Kernel<'a> {
    /// 8-bit activations against 4-bit weights, in integers (any `m`).
    Q8 {
        matrix: &'a AffineMatrix,
        xs: Vec<gdn_ops::ops::affine::q8::Q8Row>,
        group_sums: Vec<f32>,
    },
    /// 4/8-bit weights dotted from their packed form (few activation rows).
    Packed {
        matrix: &'a AffineMatrix,
        group_sums: Vec<f32>,
    },
    /// Any weights, each row dequantized to f32 and dotted (few activation rows).
    Dequantized,
}

impl<'a> Prepared<'a> {
    /// `None`: the product is prefill-shaped and goes through the blocked GEMM.
    fn new(p: &Product<'a>, q8: bool) -> Option<Self> {
        let (m, cols) = (p.m, p.matrix.cols());
        assert_eq!(
            p.x.len(),
            m * cols,
            "activation width does not match the weight"
        );
        let sums = |group: usize| p.x.chunks_exact(group).map(|g| g.iter().sum()).collect();
        // A batched decode step's rows each keep the kernel they get alone (`row_exact`).
        let one_row = super::row_exact::enabled();
        let kind = match p.matrix {
            Matrix::Affine(a) if q8 && gdn_ops::ops::affine::q8::supports(a) => Kernel::Q8 {
                matrix: a,
                xs: p
                    .x
                    .chunks_exact(cols)
                    .map(gdn_ops::ops::affine::q8::Q8Row::quantize)
                    .collect(),
                group_sums: sums(a.group_size),
            },
            Matrix::Affine(a) if a.has_fused_dot() && (one_row || m <= FUSED_DOT_MAX_ROWS) => {
                Kernel::Packed {
                    matrix: a,
                    group_sums: sums(a.group_size),
                }
            }
            _ if m >= GEMM_MIN_ROWS && !one_row => return None,
            _ => Kernel::Dequantized,
        };
        Some(Self {
            product: *p,
            m,
            kind,
        })
    }

    /// Rows `first .. first + out.len() / m` of the product, transposed: `out` is
    /// `[rows, m]`.
    fn fill(&self, first: usize, out: &mut [f32]) {
        let Product {
            matrix, expert, x, ..
        } = self.product;
        let (m, cols) = (self.m, matrix.cols());
        let rows = out.len() / m;
        match &self.kind {
            Kernel::Q8 {
                matrix,
                xs,
                group_sums,
            } => {
                let at = expert * matrix.rows + first;
                gdn_ops::ops::affine::q8::rows_dot(matrix, at, rows, xs, group_sums, out);
            }
            Kernel::Packed { matrix, group_sums } => {
                let gpr = cols / matrix.group_size;
                for (i, out_row) in out.chunks_exact_mut(m).enumerate() {
                    let row = expert * matrix.rows + first + i;
                    for (j, (o, xr)) in out_row.iter_mut().zip(x.chunks_exact(cols)).enumerate() {
                        *o = matrix.row_dot(row, xr, &group_sums[j * gpr..(j + 1) * gpr]);
                    }
                }
            }
            Kernel::Dequantized => {
                let mut w = vec![0f32; cols];
                for (i, out_row) in out.chunks_exact_mut(m).enumerate() {
                    matrix.row_into(expert, first + i, &mut w);
                    for (o, xr) in out_row.iter_mut().zip(x.chunks_exact(cols)) {
                        *o = dot(&w, xr);
                    }
                }
            }
        }
    }
}

/// The prefill-shaped products of one [`Matrix::matmul_t_many`] call: every block of
/// [`GEMM_BLOCK_ROWS`] weight rows of every such product is one parallel task, which
/// dequantizes its rows into f32 and multiplies them by a cache-blocked GEMM (candle's CPU
/// matmul), so the work is matmul-bound rather than bound by one dot product per (weight row,
/// activation row). The tasks spread the GEMMs over the cores: the qwen-gdn binary turns
/// candle's own threads off (`CANDLE_NUM_THREADS=1`), so a single GEMM runs on one core, and
/// a MoE layer's experts, one product each, would otherwise run one after another.
struct GemmBlocks;

impl GemmBlocks {
    /// The `[m, rows]` output of each product that `prepared` leaves to the GEMM, in order.
    fn run(products: &[Product], prepared: &[Option<Prepared>]) -> Vec<Vec<f32>> {
        let dev = &candle_core::Device::Cpu;
        let gemm: Vec<(&Product, candle_core::Tensor)> = products
            .iter()
            .zip(prepared)
            .filter(|(_, prep)| prep.is_none())
            .map(|(p, _)| {
                let x = candle_core::Tensor::from_slice(p.x, (p.m, p.matrix.cols()), dev);
                (p, x.expect("shape checked"))
            })
            .collect();
        if gemm.is_empty() {
            return vec![];
        }
        let blocks: Vec<(usize, usize)> = gemm
            .iter()
            .enumerate()
            .flat_map(|(i, (p, _))| {
                (0..p.matrix.rows())
                    .step_by(GEMM_BLOCK_ROWS)
                    .map(move |start| (i, start))
            })
            .collect();
        let parts: Vec<Vec<f32>> = blocks
            .par_iter()
            .map(|&(i, start)| Self::block(gemm[i].0, &gemm[i].1, start))
            .collect();
        let mut parts = blocks.iter().zip(parts);
        gemm.iter()
            .map(|(p, _)| {
                let rows = p.matrix.rows();
                let mut y = vec![0f32; p.m * rows];
                for start in (0..rows).step_by(GEMM_BLOCK_ROWS) {
                    let (_, part) = parts.next().expect("one part per block");
                    let n = GEMM_BLOCK_ROWS.min(rows - start);
                    for (out, src) in y.chunks_exact_mut(rows).zip(part.chunks_exact(n)) {
                        out[start..start + n].copy_from_slice(src);
                    }
                }
                y
            })
            .collect()
    }

    /// Weight rows `start .. start + GEMM_BLOCK_ROWS` of `p` against all of `x`: `[m, n]`.
    fn block(p: &Product, x: &candle_core::Tensor, start: usize) -> Vec<f32> {
        let (rows, cols) = (p.matrix.rows(), p.matrix.cols());
        let n = GEMM_BLOCK_ROWS.min(rows - start);
        let mut w = vec![0f32; n * cols];
        for (i, row) in w.chunks_exact_mut(cols).enumerate() {
            p.matrix.row_into(p.expert, start + i, row);
        }
        let w = candle_core::Tensor::from_vec(w, (n, cols), &candle_core::Device::Cpu)
            .expect("block shape");
        x.matmul(&w.t().expect("rank 2"))
            .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
            .expect("f32 CPU matmul")
    }
}

/// From this many activation rows on, products go through [`GemmBlocks`].
const GEMM_MIN_ROWS: usize = 8;
/// Weight rows dequantized per GEMM: 256 × 2048 f32 is 2 MiB, about an L2's worth.
const GEMM_BLOCK_ROWS: usize = 256;

/// Up to this many activation rows, 4/8-bit weights are dotted straight from their packed
/// form; beyond it, dequantizing each weight row once and reusing it for every activation
/// row is cheaper (prefill).
const FUSED_DOT_MAX_ROWS: usize = 4;

/// `[rows, m]` → `[m, rows]` (a no-op for a single activation row), one output row per task.
fn transpose_rows(yt: Vec<f32>, rows: usize, m: usize) -> Vec<f32> {
    if m == 1 {
        return yt;
    }
    let mut y = vec![0f32; m * rows];
    y.par_chunks_mut(rows).enumerate().for_each(|(i, out)| {
        for (o, col) in out.iter_mut().zip(yt.chunks_exact(m)) {
            *o = col[i];
        }
    });
    y
}

gdn_ops::multiversion! {
    /// f32 dot product with eight independent accumulators, which the compiler turns into
    /// SIMD lanes (a single running sum would serialise on the add latency).
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0f32; 8];
        let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
        let tail: f32 = ca
            .remainder()
            .iter()
            .zip(cb.remainder())
            .map(|(x, y)| x * y)
            .sum();
        for (xa, xb) in ca.zip(cb) {
            for l in 0..8 {
                acc[l] += xa[l] * xb[l];
            }
        }
        acc.iter().sum::<f32>() + tail
    }
}

#[cfg(test)]
mod tests {
    use super::super::affine::pack_row;
    use super::*;

    fn small_affine() -> Matrix {
        // 3 rows x 64 cols, 4-bit, group 32.
        let q: Vec<u32> = (0..192u32).map(|j| (j * 5) % 16).collect();
        let packed: Vec<u32> = q.chunks(64).flat_map(|r| pack_row(r, 4)).collect();
        let scales = vec![0.5, -0.25, 1.0, 0.125, -1.0, 2.0];
        let biases = vec![-1.0, 0.5, 0.0, 0.25, 3.0, -2.0];
        Matrix::Affine(AffineMatrix::new(4, 32, [1, 3, 64], packed, scales, biases).unwrap())
    }

    #[test]
    fn matmul_matches_dequantized_reference() {
        let w = small_affine();
        let x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        let y = w.matmul_t(0, &x, 2);
        let mut row = vec![0f32; 64];
        for r in 0..3 {
            w.row_into(0, r, &mut row);
            for i in 0..2 {
                let want: f64 = row
                    .iter()
                    .zip(&x[i * 64..(i + 1) * 64])
                    .map(|(a, b)| (*a as f64) * (*b as f64))
                    .sum();
                assert!((y[i * 3 + r] as f64 - want).abs() < 1e-4, "row {r} x {i}");
            }
        }
    }

    /// `[experts, rows, 64]` 4-bit, group 32, distinct values per row.
    fn affine_stack(experts: usize, rows: usize) -> Matrix {
        let n = experts * rows;
        let q: Vec<u32> = (0..n * 64)
            .map(|j| ((j * 7 + j / 64) % 16) as u32)
            .collect();
        let packed: Vec<u32> = q.chunks(64).flat_map(|r| pack_row(r, 4)).collect();
        let scales = (0..2 * n)
            .map(|g| 0.01 * ((g % 13) as f32 - 6.0))
            .collect::<Vec<_>>();
        let biases = (0..2 * n)
            .map(|g| 0.02 * ((g % 7) as f32 - 3.0))
            .collect::<Vec<_>>();
        Matrix::Affine(
            AffineMatrix::new(4, 32, [experts, rows, 64], packed, scales, biases).unwrap(),
        )
    }

    /// Products of every shape in one call: GEMM-shaped ones over several blocks (the last
    /// one partial) next to a small one, each against its own dequantized rows.
    #[test]
    fn many_products_match_their_dequantized_rows() {
        let rows = GEMM_BLOCK_ROWS + 44;
        let w = affine_stack(3, rows);
        let x = |m: usize, seed: f32| -> Vec<f32> {
            (0..m * 64)
                .map(|i| (i as f32 * 0.37 + seed).sin())
                .collect()
        };
        let shapes = [
            (2, 9, 0.1),
            (0, 2, 0.2),
            (1, GEMM_MIN_ROWS, 0.3),
            (2, 33, 0.4),
        ];
        let xs: Vec<Vec<f32>> = shapes.iter().map(|&(_, m, s)| x(m, s)).collect();
        let products: Vec<Product> = shapes
            .iter()
            .zip(&xs)
            .map(|(&(expert, m, _), x)| Product {
                matrix: &w,
                expert,
                x,
                m,
            })
            .collect();
        let ys = Matrix::matmul_t_many(&products);
        let mut row = vec![0f32; 64];
        for (p, y) in products.iter().zip(&ys) {
            assert_eq!(y.len(), p.m * rows);
            for r in 0..rows {
                w.row_into(p.expert, r, &mut row);
                for i in 0..p.m {
                    let want: f64 = row
                        .iter()
                        .zip(&p.x[i * 64..(i + 1) * 64])
                        .map(|(a, b)| (*a as f64) * (*b as f64))
                        .sum();
                    let got = y[i * rows + r] as f64;
                    assert!(
                        (got - want).abs() < 1e-4,
                        "expert {} m {} row {r} x {i}: {got} vs {want}",
                        p.expert,
                        p.m
                    );
                }
            }
        }
    }

    #[test]
    fn select_and_concat_rows_are_lossless() {
        let w = small_affine();
        let picked = w.select_rows(&[2, 0]);
        let (mut a, mut b) = (vec![0f32; 64], vec![0f32; 64]);
        picked.row_into(0, 0, &mut a);
        w.row_into(0, 2, &mut b);
        assert_eq!(a, b);
        let both = Matrix::concat_rows(&[&w, &picked]).unwrap();
        assert_eq!(both.rows(), 5);
        both.row_into(0, 4, &mut a);
        w.row_into(0, 0, &mut b);
        assert_eq!(a, b);
    }
}
