//! Launch geometry of the wide decode products (`affine_wide_*` in kernels/affine.cu): which
//! matrices they cover and how a launch is shaped. Backend-free arithmetic, so that it is
//! tested on any machine; scripts/gpu/affine_decode_cuda.py mirrors it for the GPU harness.
//!
//! A lane reads a 16-byte chunk of a row per step (32 four-bit or 16 eight-bit values), `lpr`
//! lanes share a row, and a row group of a warp computes `rows` outputs (for the SwiGLU,
//! activations: each reads a gate row and an up row), so a warp keeps `rows` (or `2·rows`)
//! 16-byte loads per lane in flight instead of the one-warp-per-row kernel's single word.

/// Warps per block (`kWideWarps` in kernels/affine.cu).
pub const WARPS: usize = 4;

/// Values of one 16-byte chunk at `bits` bits.
fn chunk_values(bits: usize) -> usize {
    128 / bits
}

/// Whether the wide kernels cover a matrix: 4 or 8 bits, rows of whole chunks (at least 8 of
/// them, so that a row group has its lanes' work), and groups of whole chunks (every MLX group
/// size, 32/64/128, is). Alignment of the buffers is the caller's check (16-byte loads).
pub fn covers(bits: usize, group_size: usize, cols: usize) -> bool {
    if !matches!(bits, 4 | 8) {
        return false;
    }
    let v = chunk_values(bits);
    cols.is_multiple_of(v) && cols / v >= 8 && group_size.is_multiple_of(v)
}

/// Lanes that share a row: a full warp when a row has at least 32 chunks, else 16 or 8.
pub fn lanes_per_row(bits: usize, cols: usize) -> usize {
    match cols / chunk_values(bits) {
        c if c >= 32 => 32,
        c if c >= 16 => 16,
        _ => 8,
    }
}

/// Output rows per row group: 2 for the products when that still gives every SM a block, else
/// 1; 1 for the SwiGLU (which reads two rows per output already). Measured on the H100 at
/// Qwen3-Next-80B's decode shapes (docs/perf-notes-gpu.md, issue 25): 2 rows beat 4 on every
/// large projection (the in-projection 12.6 against 14.8 µs) and 1 on the 2 048-row ones; the
/// SwiGLU ran 11.1 µs with 1 activation a group against 12.7 with 2; the 513-row router wants
/// its 129 blocks of 1 row.
pub fn rows_per_group(
    outputs: usize,
    out_rows: usize,
    lpr: usize,
    swiglu: bool,
    sms: usize,
) -> usize {
    if !swiglu && blocks_x(outputs, lpr, 2) * out_rows >= sms {
        2
    } else {
        1
    }
}

/// Blocks along the outputs: `WARPS · 32 / lpr` row groups of `rows` outputs each per block.
pub fn blocks_x(outputs: usize, lpr: usize, rows: usize) -> usize {
    outputs.div_ceil(WARPS * (32 / lpr) * rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_follows_whole_chunks() {
        // Qwen3-Next-80B: projections of 2048 and 4096 columns, experts' down of 512, router 8-bit.
        for (bits, cols) in [
            (4, 2048),
            (4, 4096),
            (4, 512),
            (8, 2048),
            (4, 256),
            (8, 128),
        ] {
            assert!(covers(bits, 64, cols), "{bits}-bit {cols}");
        }
        assert!(
            !covers(4, 64, 224),
            "7 chunks: too few for a row group of 8 lanes"
        );
        assert!(!covers(4, 64, 272), "not whole chunks");
        assert!(!covers(3, 64, 2048) && !covers(2, 32, 2048) && !covers(6, 64, 2048));
        assert!(!covers(8, 8, 2048), "a group smaller than a chunk");
    }

    #[test]
    fn geometry_at_the_decode_shapes() {
        assert_eq!(lanes_per_row(4, 2048), 32);
        assert_eq!(lanes_per_row(4, 512), 16);
        assert_eq!(lanes_per_row(4, 256), 8);
        assert_eq!(lanes_per_row(8, 256), 16);
        // GDN in-projection, 12 352 rows: 2 rows a group, 1 544 blocks.
        assert_eq!(rows_per_group(12352, 1, 32, false, 132), 2);
        assert_eq!(blocks_x(12352, 32, 2), 1544);
        // Out-projection, 2 048 rows: 256 blocks of 2 rows a group.
        assert_eq!(rows_per_group(2048, 1, 32, false, 132), 2);
        // Gathered gate/up over 11 slots: one activation a group.
        assert_eq!(rows_per_group(512, 11, 32, true, 132), 1);
        // Router, 513 rows of 8 bits: 65 blocks of 2 rows would leave SMs idle; 129 of 1.
        assert_eq!(rows_per_group(513, 1, 32, false, 132), 1);
        assert_eq!(blocks_x(513, 32, 1), 129);
    }
}
