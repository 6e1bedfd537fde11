//! The host cost of one candle op on CUDA, next to our own kernel launches, with the GPU work
//! negligible (small tensors): what bounds decode on a GPU when a token is ~2 800 launches
//! (docs/perf-notes-gpu.md). Build with `--features cuda` (scripts/gpu/build-cuda.sh's
//! environment) and run on the GPU machine:
//!
//!   cargo build --release -p gdn-ops --features cuda --example cuda_dispatch
//!   cuda_dispatch            # prints µs per op for each kind, medians of 5 runs of 2 000 ops
#[cfg(feature = "cuda")]
fn main() -> anyhow::Result<()> {
    use candle_core::{DType, Device, Tensor};
    use gdn_ops::ops::affine::AffineTensor;
    use std::time::Instant;

    let dev = Device::new_cuda(0)?;
    let sync = || dev.synchronize();
    let x = Tensor::randn(0f32, 1.0, (1, 2048), &dev)?.to_dtype(DType::BF16)?;
    let y = x.clone();
    // A 4-bit [512, 2048] matrix, group 64, bf16 scales: one expert projection's shape.
    let (rows, cols) = (512usize, 2048usize);
    let packed = Tensor::zeros((rows, cols / 8), DType::U32, &dev)?;
    let scales = Tensor::ones((rows, cols / 64), DType::BF16, &dev)?;
    let biases = Tensor::zeros((rows, cols / 64), DType::BF16, &dev)?;
    let matrix = AffineTensor {
        bits: 4,
        group_size: 64,
        experts: 1,
        rows,
        cols,
        packed,
        scales,
        biases,
    };

    let time = |name: &str, op: &dyn Fn() -> anyhow::Result<Tensor>| -> anyhow::Result<()> {
        const OPS: usize = 2000;
        let mut per_op = Vec::new();
        for run in 0..6 {
            sync()?;
            let start = Instant::now();
            for _ in 0..OPS {
                op()?;
            }
            let host = start.elapsed();
            sync()?;
            let all = start.elapsed();
            if run > 0 {
                per_op.push((host.as_secs_f64(), all.as_secs_f64()));
            }
        }
        per_op.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (host, all) = per_op[per_op.len() / 2];
        println!(
            "{name:<40} {:7.2} µs per op issued, {:7.2} µs per op with the GPU drained",
            host / OPS as f64 * 1e6,
            all / OPS as f64 * 1e6
        );
        Ok(())
    };
    time("candle add (bf16, 2048)", &|| Ok((&x + &y)?))?;
    time("candle silu (bf16, 2048)", &|| Ok(x.silu()?))?;
    time("candle to_dtype bf16 -> f32 (2048)", &|| {
        Ok(x.to_dtype(DType::F32)?)
    })?;
    time("candle sum_keepdim (bf16, 2048)", &|| Ok(x.sum_keepdim(1)?))?;
    time("ours: affine product 4-bit [512, 2048]", &|| {
        matrix.matmul_t(&x)
    })?;
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("cuda_dispatch: build with --features cuda (see scripts/gpu/build-cuda.sh)");
    std::process::exit(2);
}
