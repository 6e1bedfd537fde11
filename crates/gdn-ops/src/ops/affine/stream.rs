//! Launch geometry of the streamed decode products (`affine_stream_*` in
//! kernels/affine_stream.cu): which matrices they cover and how a launch is shaped.
//! Backend-free arithmetic, tested on any machine; scripts/gpu/affine_stream_cuda.py mirrors
//! it for the GPU harness.
//!
//! The streamed kernels sum exactly what the wide ones ([`super::wide`]) sum, lane for lane, with
//! x staged once per block in shared memory and each weight unpacked in place (three
//! instructions a value instead of ~seven), and a warp walks several row groups with the next
//! group's loads in flight. A lane's chunks of a row (`steps`: 1, 2 or 4) are a template
//! parameter, so that a round's loads live in registers.

use super::wide;

/// Warps per block (`kStreamWarps` in kernels/affine_stream.cu).
pub const WARPS: usize = wide::WARPS;

/// Chunk steps of a lane per row the kernels are instantiated for.
const MAX_STEPS: usize = 4;

/// Values of one 16-byte chunk at `bits` bits.
fn chunk_values(bits: usize) -> usize {
    128 / bits
}

/// A lane's chunks of a row, rounded up to an instantiated count (1, 2 or 4).
pub fn steps(bits: usize, cols: usize, lpr: usize) -> usize {
    match (cols / chunk_values(bits)).div_ceil(lpr) {
        0 | 1 => 1,
        2 => 2,
        _ => 4,
    }
}

/// Whether the streamed kernels take a matrix the wide ones take: at most four chunks a lane
/// (so the round's loads fit in registers) and groups of a power-of-two count of chunks (a
/// chunk's group is a shift); every MLX group size (32, 64, 128) at 4 and 8 bits is one.
pub fn covers(bits: usize, group_size: usize, cols: usize) -> bool {
    if !wide::covers(bits, group_size, cols) {
        return false;
    }
    let lpr = wide::lanes_per_row(bits, cols);
    (cols / chunk_values(bits)).div_ceil(lpr) <= MAX_STEPS
        && (group_size / chunk_values(bits)).is_power_of_two()
}

/// Whether the streamed kernels cover a matrix with every lane's chunk steps used (the chunks a
/// row are exactly lanes × steps, at least 2 steps): their best case (2 048 or 4 096 columns
/// at 4 bits), against which the tensor-core kernels gain nothing measurable
/// ([`super::mma::preferred`]).
pub fn fills_lanes(bits: usize, group_size: usize, cols: usize) -> bool {
    if !covers(bits, group_size, cols) {
        return false;
    }
    let lpr = wide::lanes_per_row(bits, cols);
    let steps = steps(bits, cols, lpr);
    steps >= 2 && cols / chunk_values(bits) == lpr * steps
}

/// Dynamic shared memory of a block: x of one output row in f32 and each chunk's sum.
pub fn shared_bytes(bits: usize, cols: usize) -> usize {
    4 * (cols + cols / chunk_values(bits))
}

/// Blocks an SM holds at once, from the registers a round's loads take (rows read × steps):
/// measured on the H200 (ptxas: ≤ 64 registers at 2, ~120 at 4, ~165 at 8).
fn resident_blocks(rows_read: usize, steps: usize) -> usize {
    match rows_read * steps {
        0..=2 => 8,
        3..=4 => 4,
        _ => 2,
    }
}

/// The launch of one product: rows per row group and blocks along the outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub rows: usize,
    pub steps: usize,
    pub blocks_x: usize,
}

/// Rows per row group and the grid's width: as many blocks as the SMs hold at once (each warp
/// then walks several row groups, the next one's loads in flight), never more than the row
/// groups need. Two rows a group only where one row a group would not fill that many blocks
/// anyway (a 2 048-row projection) and two still give every SM a block; the SwiGLU reads two
/// rows a group already. Measured on the H200 at Qwen3-Next-80B's decode shapes
/// (docs/perf-notes-gpu.md, "The streamed products").
pub fn launch(
    bits: usize,
    cols: usize,
    outputs: usize,
    out_rows: usize,
    swiglu: bool,
    sms: usize,
) -> Launch {
    let lpr = wide::lanes_per_row(bits, cols);
    let steps = steps(bits, cols, lpr);
    let rows_read = |rows: usize| if swiglu { 2 * rows } else { rows };
    let target = |rows: usize| {
        (resident_blocks(rows_read(rows), steps) * sms)
            .div_ceil(out_rows)
            .max(1)
    };
    let full = |rows: usize| wide::blocks_x(outputs, lpr, rows);
    let rows = if !swiglu && full(1) <= target(1) && full(2) * out_rows >= sms {
        2
    } else {
        1
    };
    Launch {
        rows,
        steps,
        blocks_x: full(rows).min(target(rows)),
    }
}

/// Activation rows the one-pass kernels (`affine_stream_rows_b<bits>_t<T>_*`) take: a verify
/// pass of up to 8 tokens, a batched step of up to 8 sequences.
pub const PASS_ROWS: std::ops::RangeInclusive<usize> = 2..=8;

/// The instantiated row capacity (`t<T>` in the kernel's name: 2, 4 or 8) that holds
/// `x_rows` rows.
pub fn pass_capacity(x_rows: usize) -> usize {
    match x_rows {
        0..=2 => 2,
        3..=4 => 4,
        _ => 8,
    }
}

/// Shared memory an SM of an H100/H200 gives its blocks (228 KB, 1 KB of it reserved a block).
const SM_SHARED_BYTES: usize = 228 * 1024;

/// Dynamic shared memory of a one-pass block: the T rows of x in f32 and each chunk's sum.
pub fn pass_shared_bytes(bits: usize, cols: usize, x_rows: usize) -> usize {
    x_rows * shared_bytes(bits, cols)
}

/// Whether one pass over the weights takes `x_rows` dense rows of this matrix: the streamed
/// kernels take it, 2..=8 rows, and the rows of x fit a block's shared memory (227 KB on an
/// H100/H200: 8 rows of 4 096 columns take 135 KB).
pub fn pass_covers(bits: usize, group_size: usize, cols: usize, x_rows: usize) -> bool {
    covers(bits, group_size, cols)
        && PASS_ROWS.contains(&x_rows)
        && pass_shared_bytes(bits, cols, x_rows) + 1024 <= SM_SHARED_BYTES
}

/// The launch of one pass over `x_rows` rows: one weight row a row group (the unpacked chunk
/// and the round's loads stay in registers whatever the rows), as many blocks as the SMs hold
/// at once by registers (as the one-row kernel at its steps) and by shared memory, never more
/// than the row groups need.
pub fn pass_launch(bits: usize, cols: usize, outputs: usize, x_rows: usize, sms: usize) -> Launch {
    let lpr = wide::lanes_per_row(bits, cols);
    let steps = steps(bits, cols, lpr);
    let by_shared = SM_SHARED_BYTES / (pass_shared_bytes(bits, cols, x_rows) + 1024);
    let resident = resident_blocks(1, steps).min(by_shared).max(1);
    Launch {
        rows: 1,
        steps,
        blocks_x: wide::blocks_x(outputs, lpr, 1).min(resident * sms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_is_the_wide_kernels_within_four_chunks_a_lane() {
        // Qwen3-Next-80B: 2 048 and 4 096 columns at 4 bits, the router's 2 048 at 8, the
        // experts' down of 512.
        for (bits, cols) in [(4, 2048), (4, 4096), (8, 2048), (4, 512), (4, 256)] {
            assert!(covers(bits, 64, cols), "{bits}-bit {cols}");
        }
        assert!(!covers(4, 64, 8192), "8 chunks a lane");
        assert!(!covers(8, 64, 4096), "8 chunks a lane at 8 bits");
        assert!(!covers(4, 96, 2016), "3 chunks a group");
        assert!(!covers(4, 64, 272), "not the wide kernels' either");
        assert_eq!(steps(4, 2048, 32), 2);
        assert_eq!(steps(4, 4096, 32), 4);
        assert_eq!(steps(4, 512, 16), 1);
        assert_eq!(steps(4, 2304, 32), 4, "72 chunks: 3 a lane, rounded up");
        assert_eq!(shared_bytes(4, 2048), 4 * (2048 + 64));
        assert!(fills_lanes(4, 64, 2048) && fills_lanes(4, 64, 4096));
        assert!(!fills_lanes(4, 64, 2560), "80 chunks on 32 lanes × 4 steps");
        assert!(!fills_lanes(4, 64, 512), "one step a lane");
        assert!(!fills_lanes(4, 64, 640), "20 chunks on 16 lanes × 2 steps");
        assert!(!fills_lanes(4, 64, 6144), "not streamed");
    }

    #[test]
    fn launches_at_the_decode_shapes_are_the_fastest_measured() {
        let at = |bits, cols, outputs, out_rows, swiglu| {
            let l = launch(bits, cols, outputs, out_rows, swiglu, 132);
            (l.rows, l.steps, l.blocks_x)
        };
        // GDN in-projection and attention q/k/v: one row a group, 8 blocks an SM.
        assert_eq!(at(4, 2048, 12352, 1, false), (1, 2, 1056));
        assert_eq!(at(4, 2048, 9216, 1, false), (1, 2, 1056));
        // Out-projections of 2 048 rows: two rows a group, every row group its own warp.
        assert_eq!(at(4, 4096, 2048, 1, false), (2, 4, 256));
        // The 8-bit router: 129 blocks of one row a group.
        assert_eq!(at(8, 2048, 513, 1, false), (1, 4, 129));
        // Experts' gate/up (SwiGLU) and down over 11 slots.
        assert_eq!(at(4, 2048, 512, 11, true), (1, 2, 48));
        assert_eq!(at(4, 512, 2048, 11, false), (1, 1, 96));
        // The head.
        assert_eq!(at(4, 2048, 151936, 1, false), (1, 2, 1056));
    }

    #[test]
    fn one_pass_launches_hold_the_rows_of_x_in_shared_memory() {
        let at = |cols, outputs, x_rows| {
            let l = pass_launch(4, cols, outputs, x_rows, 132);
            (l.rows, l.steps, l.blocks_x)
        };
        // In-projection at 4 rows (33 KB of x): 6 blocks an SM (8 at one row); at 8 (66 KB): 3.
        assert_eq!(at(2048, 12352, 4), (1, 2, 792));
        assert_eq!(at(2048, 12352, 8), (1, 2, 396));
        // Out-projection of 4 096 columns at 8 rows (135 KB): one block an SM.
        assert_eq!(at(4096, 2048, 8), (1, 4, 132));
        // Few outputs: the row groups bound the grid.
        assert_eq!(at(2048, 64, 2), (1, 2, 16));
        assert!(pass_covers(4, 64, 4096, 8));
        assert!(!pass_covers(4, 64, 4096, 9), "9 rows: one launch a row");
        assert!(!pass_covers(4, 64, 4096, 1), "1 row: the one-row kernel");
        assert!(!pass_covers(4, 64, 8192, 2), "8 chunks a lane");
        let capacities: Vec<usize> = PASS_ROWS.map(pass_capacity).collect();
        assert_eq!(capacities, [2, 4, 4, 8, 8, 8, 8]);
    }
}
