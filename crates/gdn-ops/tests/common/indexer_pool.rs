//! `indexer_pool`'s cases, run by every backend's test alike: the CPU twin against the composed
//! candle ops (tests/indexer_pool.rs), the Metal kernel and the CUDA body in emulation
//! (tests/indexer_pool_emulation.rs) and the CUDA kernel (tests/cuda_indexer_pool.rs): one list
//! of shapes, one input generator.

use super::random::Rng;
use candle_core::{DType, Device, Tensor};
use gdn_ops::ops::indexer_pool::PoolCall;

/// The projection's dtypes, in the harnesses' type-code order.
pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// One step's pooling: the indexer's sizes and the rows it writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Case {
    /// Query heads before the key in the projection row.
    pub heads: usize,
    pub dim: usize,
    /// c: the tail's rows.
    pub rows: usize,
    pub capacity: usize,
    pub rope_dims: usize,
    pub tail_row: usize,
    pub block_row: usize,
}

const fn case(
    heads: usize,
    dim: usize,
    rows: usize,
    capacity: usize,
    rope_dims: usize,
    tail_row: usize,
    block_row: usize,
) -> Case {
    Case {
        heads,
        dim,
        rows,
        capacity,
        rope_dims,
        tail_row,
        block_row,
    }
}

/// Every backend's cases, at every dtype.
pub fn cases() -> Vec<Case> {
    vec![
        // The release config (4 heads of 128, compression 4, RoPE over 64 of the 128 values):
        // the first key of a block, a middle one, the one that completes it; a later block.
        case(4, 128, 4, 64, 64, 0, 0),
        case(4, 128, 4, 64, 64, 2, 17),
        case(4, 128, 4, 64, 64, 3, 63),
        case(4, 128, 4, 128, 64, 1, 100),
        // Other widths: one rotated pair, all rotated, a partner in another lane (h = 8), a key that
        // does not fill the last lane round, the widest key, a one-row tail.
        case(2, 64, 3, 8, 2, 1, 5),
        case(1, 96, 2, 4, 96, 1, 3),
        case(3, 48, 5, 6, 16, 4, 0),
        case(1, 100, 4, 4, 36, 2, 2),
        case(1, 1024, 4, 2, 512, 3, 1),
        case(0, 32, 1, 1, 32, 0, 0),
    ]
}

/// Rows past their buffers: the kernels write nothing.
pub fn out_of_range_cases() -> Vec<Case> {
    vec![
        case(4, 128, 4, 64, 64, 4, 3),
        case(4, 128, 4, 64, 64, 1, 64),
    ]
}

/// A case's inputs on the CPU (the projection rounded to its dtype, the tail holding an older
/// block's keys, the blocks random), built from one seed.
pub struct Inputs {
    pub qk: Tensor,
    pub key_offset: usize,
    pub tail: Tensor,
    pub blocks: Tensor,
    pub tail_row: Tensor,
    pub block_row: Tensor,
    pub cos: Tensor,
    pub sin: Tensor,
    pub norm: Tensor,
    pub eps: f32,
}

impl Case {
    pub fn inputs(&self, dtype: DType, seed: u64) -> Inputs {
        let mut rng = Rng::new(seed);
        let dev = &Device::Cpu;
        let width = (self.heads + 1) * self.dim + 3;
        let v = |rng: &mut Rng, n: usize, lo: f32, hi: f32| -> Vec<f32> {
            (0..n).map(|_| rng.uniform(lo, hi)).collect()
        };
        let f32s = |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape, dev).unwrap();
        let qk = f32s(v(&mut rng, width, -3.0, 3.0), &[1, width])
            .to_dtype(dtype)
            .unwrap();
        let half = self.rope_dims / 2;
        let angles = v(&mut rng, half, -3.2, 3.2);
        let row =
            |r: usize| Tensor::from_vec(vec![r as u32; self.dim], (1, self.dim), dev).unwrap();
        Inputs {
            qk,
            key_offset: self.heads * self.dim,
            tail: f32s(
                v(&mut rng, self.rows * self.dim, -3.0, 3.0),
                &[self.rows, self.dim],
            ),
            blocks: f32s(
                v(&mut rng, self.capacity * self.dim, -1.0, 1.0),
                &[self.capacity, self.dim],
            ),
            tail_row: row(self.tail_row),
            block_row: row(self.block_row),
            cos: f32s(angles.iter().map(|a| a.cos()).collect(), &[1, half]),
            sin: f32s(angles.iter().map(|a| a.sin()).collect(), &[1, half]),
            norm: f32s(v(&mut rng, self.dim, 0.5, 1.5), &[self.dim]),
            eps: 1e-6,
        }
    }
}

impl Inputs {
    /// The inputs on `dev` (fresh copies: the op writes the tail and the blocks in place).
    pub fn to_device(&self, dev: &Device) -> Inputs {
        let on = |t: &Tensor| t.to_device(dev).unwrap().copy().unwrap();
        Inputs {
            qk: on(&self.qk),
            key_offset: self.key_offset,
            tail: on(&self.tail),
            blocks: on(&self.blocks),
            tail_row: on(&self.tail_row),
            block_row: on(&self.block_row),
            cos: on(&self.cos),
            sin: on(&self.sin),
            norm: on(&self.norm),
            eps: self.eps,
        }
    }

    pub fn call(&self) -> PoolCall<'_> {
        PoolCall {
            qk: &self.qk,
            key_offset: self.key_offset,
            tail: &self.tail,
            blocks: &self.blocks,
            tail_row: &self.tail_row,
            block_row: &self.block_row,
            cos: &self.cos,
            sin: &self.sin,
            norm: &self.norm,
            eps: self.eps,
        }
    }

    /// The tail and the blocks, flat, on the host.
    pub fn buffers(&self) -> (Vec<f32>, Vec<f32>) {
        let flat = |t: &Tensor| {
            t.to_device(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        (flat(&self.tail), flat(&self.blocks))
    }
}
