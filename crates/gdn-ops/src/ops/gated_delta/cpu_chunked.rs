//! The chunked (WY) form of the gated-delta recurrence on the CPU, for prefill.
//!
//! The recurrence of `mod.rs` is rewritten per chunk of `C` tokens as small matrix products.
//! Per value head, with the state `S` `[Dv, Dk]` at the chunk's start, `γᵢ = Π_{l≤i} g_l` and
//! `D_ij = γᵢ/γⱼ = Π_{j<l≤i} g_l` (j ≤ i):
//!
//! ```text
//! A  = I + strictly_lower(β_i · D_ij · kᵢ·kⱼ)               (unit lower triangular)
//! Δ  = A⁻¹ · (β ⊙ (V − γ ⊙ K Sᵀ))                            (the written values δᵢ)
//! Y  = γ ⊙ Q Sᵀ + (lower(D ⊙ Q Kᵀ)) · Δ                      (diagonal included)
//! S ← γ_last · S + Δᵀ · (D_last ⊙ K)                         (D_last,j = γ_last/γⱼ)
//! ```
//!
//! which unrolls `S ← g·S; δ = β(v − S·k); S ← S + δ⊗k; y = S·q` exactly; only the order of
//! the f32 sums differs from the token-by-token reference (`cpu.rs`). Because `g` is the decay
//! itself (not its logarithm), every `D_ij` is a product of the chunk's own decays, taken in
//! f64 per (i, j): it underflows gracefully to 0 for fast decay and never divides one prefix
//! product by another (0/0 once the prefix underflows).
//!
//! The state is held transposed (`[Dk, Dv]`) in f32 for the whole call, so that every product
//! reads its right-hand side row by row; it is read once and written once in its own dtype,
//! as the recurrence does. All buffers are padded with zeros to tiles of 16 columns: zero
//! keys, queries and values add nothing, so the padding is exact. The last chunk of a call
//! may be shorter: it runs through the same code on fewer rows. A padding token (mask 0)
//! enters as `g = 1`, `β = 0`, which leaves the state as it is, and its output is 0.
//!
//! Work is split over (batch, key head): the value heads that share a key head share
//! `K Kᵀ` and `Q Kᵀ`.

use super::cpu::{update_on_host, HostForm, HostInputs, StateElem};
use super::{GdnDims, Inputs};
use anyhow::Result;
use candle_core::Tensor;
use rayon::prelude::*;

/// Tokens per chunk (fla's and transformers' choice): `C²` work per token stays below the
/// `Dk·Dv` products while the products stay large enough to run at the FMA rate.
pub const CHUNK: usize = 64;
/// Output columns per register tile (one AVX-512 register, two AVX2 ones).
const LANES: usize = 16;
/// Output rows per register tile: 4 × 16 accumulators, four AVX-512 registers or eight AVX2
/// ones, with room for the operands (8 rows ran slower on AVX-512: docs/perf-notes.md).
const ROWS: usize = 4;

pub(crate) fn gated_delta_update(dims: GdnDims, inputs: &Inputs, state: &Tensor) -> Result<Tensor> {
    update_on_host(Chunked, dims, inputs, state)
}

/// The chunked (WY) form.
struct Chunked;

fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}

impl HostForm for Chunked {
    const NAME: &'static str = "gated-delta-update-chunked";

    fn run<S: StateElem>(&self, x: &HostInputs, state: &mut [S]) -> Vec<f32> {
        let d = x.dims;
        let (t_len, dv, hv_n) = (d.steps, d.value_dim, d.value_heads);
        let group = hv_n / d.key_heads;
        let head_state = d.value_dim * d.key_dim;
        if t_len == 0 || head_state == 0 {
            return vec![0f32; d.batch * hv_n * t_len * dv];
        }
        // Per-head outputs `[T, Dv]`, grouped by key head (value head hv = hk·group + h).
        let mut y_heads = vec![0f32; d.batch * hv_n * t_len * dv];
        state
            .par_chunks_mut(group * head_state)
            .zip(y_heads.par_chunks_mut(group * t_len * dv))
            .enumerate()
            .for_each(|(kv_head, (s_group, y_group))| {
                let (b, hk) = (kv_head / d.key_heads, kv_head % d.key_heads);
                run_group(x, b, hk, s_group, y_group);
            });
        y_heads
    }
}

/// Runs one key head's group with the code compiled for the selected level's float copy: the
/// products use fused multiply-adds where the level guarantees them (a software `fma`
/// would be a library call per product).
fn run_group<S: StateElem>(op: &HostInputs, b: usize, hk: usize, s: &mut [S], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
        fn avx512<S: StateElem>(op: &HostInputs, b: usize, hk: usize, s: &mut [S], y: &mut [f32]) {
            group_body::<S, true>(op, b, hk, s, y)
        }
        #[target_feature(enable = "avx2,fma")]
        fn avx2<S: StateElem>(op: &HostInputs, b: usize, hk: usize, s: &mut [S], y: &mut [f32]) {
            group_body::<S, true>(op, b, hk, s, y)
        }
        use crate::simd::FloatCopy;
        match crate::simd::level().float_copy() {
            // SAFETY: the selected level's CPU features include each copy's.
            FloatCopy::Avx512 => unsafe { avx512(op, b, hk, s, y) },
            // SAFETY: as above.
            FloatCopy::Avx2 => unsafe { avx2(op, b, hk, s, y) },
            FloatCopy::Portable => group_body::<S, false>(op, b, hk, s, y),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // aarch64 always has a fused multiply-add; other targets take the plain one.
        group_body::<S, { cfg!(target_arch = "aarch64") }>(op, b, hk, s, y)
    }
}

/// `acc + a·b`, fused where the caller's level has the instruction.
#[inline(always)]
fn madd<const FMA: bool>(acc: f32, a: f32, b: f32) -> f32 {
    if FMA {
        a.mul_add(b, acc)
    } else {
        acc + a * b
    }
}

/// The buffers of one key head's group, allocated once per call. Chunk-indexed matrices
/// have `CHUNK` as their row stride; head-dim matrices the padded dims `dkp`, `dvp`.
struct Work {
    dkp: usize,
    dvp: usize,
    /// Per value head of the group: the state transposed, `[dkp, dvp]`.
    st: Vec<Vec<f32>>,
    q: Vec<f32>,
    k: Vec<f32>,
    /// `Kᵀ` `[dkp, CHUNK]`.
    kt: Vec<f32>,
    kk: Vec<f32>,
    qk: Vec<f32>,
    /// `D_ij` (j ≤ i) `[CHUNK, CHUNK]`, and `γᵢ`.
    decay: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    /// Strictly lower `β_i D_ij kᵢ·kⱼ`, then `A⁻¹`.
    l: Vec<f32>,
    a_inv: Vec<f32>,
    /// Lower (with diagonal) `D ⊙ Q Kᵀ`.
    attn: Vec<f32>,
    v: Vec<f32>,
    /// `K Sᵀ`, then the right-hand side `β(V − γ K Sᵀ)`.
    r: Vec<f32>,
    delta: Vec<f32>,
    out: Vec<f32>,
    /// `(D_last ⊙ K)ᵀ` `[dkp, CHUNK]`.
    krt: Vec<f32>,
    /// The products' packed row tiles.
    pack: Vec<f32>,
}

impl Work {
    fn new(dk: usize, dv: usize, group: usize) -> Self {
        let (dkp, dvp) = (round_up(dk, LANES), round_up(dv, LANES));
        let z = |n: usize| vec![0f32; n];
        Self {
            dkp,
            dvp,
            st: (0..group).map(|_| z(dkp * dvp)).collect(),
            q: z(CHUNK * dkp),
            k: z(CHUNK * dkp),
            kt: z(dkp * CHUNK),
            kk: z(CHUNK * CHUNK),
            qk: z(CHUNK * CHUNK),
            decay: z(CHUNK * CHUNK),
            gamma: z(CHUNK),
            beta: z(CHUNK),
            l: z(CHUNK * CHUNK),
            a_inv: z(CHUNK * CHUNK),
            attn: z(CHUNK * CHUNK),
            v: z(CHUNK * dvp),
            r: z(CHUNK * dvp),
            delta: z(CHUNK * dvp),
            out: z(CHUNK * dvp),
            krt: z(dkp * CHUNK),
            pack: z(ROWS * dkp.max(CHUNK)),
        }
    }
}

/// One key head's group over all chunks. `s` holds the group's states `[group, Dv, Dk]`,
/// `y` its outputs `[group, T, Dv]`.
#[inline(always)]
fn group_body<S: StateElem, const FMA: bool>(
    op: &HostInputs,
    b: usize,
    hk: usize,
    s: &mut [S],
    y: &mut [f32],
) {
    let d = op.dims;
    let (t_len, dk, dv) = (d.steps, d.key_dim, d.value_dim);
    let group = d.value_heads / d.key_heads;
    let mut w = Work::new(dk, dv, group);
    let (dkp, dvp) = (w.dkp, w.dvp);
    for (h, st) in w.st.iter_mut().enumerate() {
        let src = &s[h * dv * dk..(h + 1) * dv * dk];
        for (i, row) in src.chunks_exact(dk).enumerate() {
            for (j, x) in row.iter().enumerate() {
                st[j * dvp + i] = x.load();
            }
        }
    }
    let kept = |t: usize| op.mask.as_ref().is_none_or(|m| m[b * t_len + t] != 0.0);
    for c0 in (0..t_len).step_by(CHUNK) {
        let c = CHUNK.min(t_len - c0);
        // Rows and columns the products run over: the chunk rounded up to a tile.
        let cp = round_up(c, LANES);
        load_keys(op, &mut w, b, hk, c0, c, cp);
        // `K Kᵀ` and `Q Kᵀ` on and below the diagonal tiles, shared by the group.
        Gemm::new(
            [cp, cp, dkp],
            (&w.k, dkp),
            (&w.kt, CHUNK),
            (&mut w.kk, CHUNK),
            &mut w.pack,
        )
        .out_lower()
        .run::<FMA>();
        Gemm::new(
            [cp, cp, dkp],
            (&w.q, dkp),
            (&w.kt, CHUNK),
            (&mut w.qk, CHUNK),
            &mut w.pack,
        )
        .out_lower()
        .run::<FMA>();
        for h in 0..group {
            let hv = hk * group + h;
            load_values(op, &mut w, b, hv, c0, c, cp, &kept);
            chunk_head::<FMA>(&mut w, h, c, cp);
            let y_head = &mut y[h * t_len * dv..(h + 1) * t_len * dv];
            for i in 0..c {
                let y_t = &mut y_head[(c0 + i) * dv..(c0 + i + 1) * dv];
                if kept(c0 + i) {
                    y_t.copy_from_slice(&w.out[i * dvp..i * dvp + dv]);
                } else {
                    y_t.fill(0.0);
                }
            }
        }
    }
    for (h, st) in w.st.iter().enumerate() {
        let dst = &mut s[h * dv * dk..(h + 1) * dv * dk];
        for (i, row) in dst.chunks_exact_mut(dk).enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                *x = S::store(st[j * dvp + i]);
            }
        }
    }
}

/// The chunk's queries and keys (zero past `c` and past `Dk`), and `Kᵀ`.
#[inline(always)]
fn load_keys(op: &HostInputs, w: &mut Work, b: usize, hk: usize, c0: usize, c: usize, cp: usize) {
    let d = op.dims;
    let dk = d.key_dim;
    let dkp = w.dkp;
    for i in 0..cp {
        let (q_row, k_row) = (
            &mut w.q[i * dkp..(i + 1) * dkp],
            &mut w.k[i * dkp..(i + 1) * dkp],
        );
        if i < c {
            let at = ((b * d.steps + c0 + i) * d.key_heads + hk) * dk;
            q_row[..dk].copy_from_slice(&op.q[at..at + dk]);
            k_row[..dk].copy_from_slice(&op.k[at..at + dk]);
            q_row[dk..].fill(0.0);
            k_row[dk..].fill(0.0);
        } else {
            q_row.fill(0.0);
            k_row.fill(0.0);
        }
    }
    for i in 0..cp {
        for j in 0..dkp {
            w.kt[j * CHUNK + i] = w.k[i * dkp + j];
        }
    }
}

/// One value head's chunk inputs: `v`, `β` and the decays, with a padding token (masked)
/// as `g = 1`, `β = 0` so that it leaves the state as it is.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn load_values(
    op: &HostInputs,
    w: &mut Work,
    b: usize,
    hv: usize,
    c0: usize,
    c: usize,
    cp: usize,
    kept: &impl Fn(usize) -> bool,
) {
    let d = op.dims;
    let (dv, dvp) = (d.value_dim, w.dvp);
    let mut g = [1f64; CHUNK];
    for (i, g_i) in g.iter_mut().enumerate().take(cp) {
        let row = &mut w.v[i * dvp..(i + 1) * dvp];
        let gate_at = (b * d.steps + c0 + i) * d.value_heads + hv;
        if i < c && kept(c0 + i) {
            row[..dv].copy_from_slice(&op.v[gate_at * dv..(gate_at + 1) * dv]);
            row[dv..].fill(0.0);
            w.beta[i] = op.beta[gate_at];
            *g_i = op.g[gate_at] as f64;
        } else {
            row.fill(0.0);
            w.beta[i] = 0.0;
        }
    }
    // γᵢ and D_ij by running products (never a quotient of prefixes, see the module docs).
    let mut gamma = 1f64;
    for i in 0..cp {
        let row = &mut w.decay[i * CHUNK..(i + 1) * CHUNK];
        if i >= c {
            row[..cp].fill(0.0);
            w.gamma[i] = 0.0;
            continue;
        }
        gamma *= g[i];
        w.gamma[i] = gamma as f32;
        let mut p = 1f64;
        row[i] = 1.0;
        for j in (0..i).rev() {
            p *= g[j + 1];
            row[j] = p as f32;
        }
        row[i + 1..cp].fill(0.0);
    }
}

/// One value head's chunk: the triangular system, the written values, the output rows
/// (`w.out`) and the state advanced to the chunk's end.
#[inline(always)]
fn chunk_head<const FMA: bool>(w: &mut Work, h: usize, c: usize, cp: usize) {
    let (dkp, dvp) = (w.dkp, w.dvp);
    // L (strictly lower) and the decayed attention (lower with its diagonal), zero elsewhere.
    for i in 0..cp {
        for j in 0..cp {
            let at = i * CHUNK + j;
            let dij = w.decay[at];
            w.l[at] = if j < i {
                w.beta[i] * dij * w.kk[at]
            } else {
                0.0
            };
            w.attn[at] = if j <= i { dij * w.qk[at] } else { 0.0 };
        }
    }
    // A⁻¹ = (I + L)⁻¹ by forward substitution: row i = eᵢ − Σ_{j<i} L_ij · row j.
    for i in 0..cp {
        let (done, rest) = w.a_inv.split_at_mut(i * CHUNK);
        let row = &mut rest[..CHUNK];
        row[..cp].fill(0.0);
        row[i] = 1.0;
        for j in 0..i {
            let lij = w.l[i * CHUNK + j];
            if lij != 0.0 {
                let prev = &done[j * CHUNK..j * CHUNK + j + 1];
                for (x, p) in row[..=j].iter_mut().zip(prev) {
                    *x = madd::<FMA>(*x, -lij, *p);
                }
            }
        }
    }
    let st = &mut w.st[h];
    // R = β ⊙ (V − γ ⊙ K Sᵀ).
    Gemm::new(
        [cp, dvp, dkp],
        (&w.k, dkp),
        (st, dvp),
        (&mut w.r, dvp),
        &mut w.pack,
    )
    .run::<FMA>();
    for i in 0..cp {
        let (beta, gamma) = (w.beta[i], w.gamma[i]);
        let (r, v) = (
            &mut w.r[i * dvp..(i + 1) * dvp],
            &w.v[i * dvp..(i + 1) * dvp],
        );
        for (r, v) in r.iter_mut().zip(v) {
            *r = beta * (v - gamma * *r);
        }
    }
    // Δ = A⁻¹ R.
    Gemm::new(
        [cp, dvp, cp],
        (&w.a_inv, CHUNK),
        (&w.r, dvp),
        (&mut w.delta, dvp),
        &mut w.pack,
    )
    .a_lower()
    .run::<FMA>();
    // Y = γ ⊙ Q Sᵀ + attn Δ.
    Gemm::new(
        [cp, dvp, dkp],
        (&w.q, dkp),
        (st, dvp),
        (&mut w.out, dvp),
        &mut w.pack,
    )
    .run::<FMA>();
    for i in 0..cp {
        let gamma = w.gamma[i];
        w.out[i * dvp..(i + 1) * dvp]
            .iter_mut()
            .for_each(|x| *x *= gamma);
    }
    Gemm::new(
        [cp, dvp, cp],
        (&w.attn, CHUNK),
        (&w.delta, dvp),
        (&mut w.out, dvp),
        &mut w.pack,
    )
    .a_lower()
    .accumulate()
    .run::<FMA>();
    // Sᵀ ← γ_last Sᵀ + (D_last ⊙ K)ᵀ Δ.
    let last = &w.decay[(c - 1) * CHUNK..c * CHUNK];
    for j in 0..dkp {
        let (dst, src) = (
            &mut w.krt[j * CHUNK..j * CHUNK + cp],
            &w.kt[j * CHUNK..j * CHUNK + cp],
        );
        for ((x, k), dl) in dst.iter_mut().zip(src).zip(last) {
            *x = k * dl;
        }
    }
    let gamma_last = w.gamma[c - 1];
    st.iter_mut().for_each(|x| *x *= gamma_last);
    Gemm::new(
        [dkp, dvp, cp],
        (&w.krt, CHUNK),
        (&w.delta, dvp),
        (st, dvp),
        &mut w.pack,
    )
    .accumulate()
    .run::<FMA>();
}

/// `c[m, n] (+)= a[m, depth] · b[depth, n]`, all row-major with the given strides; `m` a
/// multiple of `ROWS`, `n` of `LANES`.
struct Gemm<'a> {
    a: &'a [f32],
    lda: usize,
    b: &'a [f32],
    ldb: usize,
    m: usize,
    n: usize,
    depth: usize,
    /// `a[i][p] = 0` for `p > i`: a row tile stops at its last row's diagonal.
    a_lower: bool,
    /// Only the tiles that reach the diagonal or below it are computed.
    out_lower: bool,
    /// Add to `c` instead of overwriting it.
    accumulate: bool,
    c: &'a mut [f32],
    ldc: usize,
    /// Room for a row tile of `a`: `ROWS × depth`.
    pack: &'a mut [f32],
}

impl<'a> Gemm<'a> {
    /// `c[m, n] = a[m, depth] · b[depth, n]` with `[m, n, depth]`, each matrix given with its
    /// row stride; dense, overwriting `c`, until a flag below says otherwise.
    #[inline(always)]
    fn new(
        [m, n, depth]: [usize; 3],
        (a, lda): (&'a [f32], usize),
        (b, ldb): (&'a [f32], usize),
        (c, ldc): (&'a mut [f32], usize),
        pack: &'a mut [f32],
    ) -> Self {
        Self {
            a,
            lda,
            b,
            ldb,
            m,
            n,
            depth,
            a_lower: false,
            out_lower: false,
            accumulate: false,
            c,
            ldc,
            pack,
        }
    }

    /// `a` is lower triangular (see the field).
    #[inline(always)]
    fn a_lower(self) -> Self {
        Self {
            a_lower: true,
            ..self
        }
    }

    /// Only the output tiles on and below the diagonal are needed (see the field).
    #[inline(always)]
    fn out_lower(self) -> Self {
        Self {
            out_lower: true,
            ..self
        }
    }

    /// Adds the product to `c`.
    #[inline(always)]
    fn accumulate(self) -> Self {
        Self {
            accumulate: true,
            ..self
        }
    }

    #[inline(always)]
    fn run<const FMA: bool>(self) {
        gemm::<FMA>(self)
    }
}

/// The register-tiled product: `ROWS × LANES` accumulators stay in registers while the depth
/// goes by, one broadcast of `a` per row and one row of `b` per step.
#[inline(always)]
fn gemm<const FMA: bool>(p: Gemm) {
    debug_assert!(p.m.is_multiple_of(ROWS) && p.n.is_multiple_of(LANES));
    for i0 in (0..p.m).step_by(ROWS) {
        let depth = if p.a_lower {
            (i0 + ROWS).min(p.depth)
        } else {
            p.depth
        };
        // The row tile's `a`, packed depth-major: one contiguous group of ROWS per step.
        let a_tile = &mut p.pack[..depth * ROWS];
        for r in 0..ROWS {
            let a_row = &p.a[(i0 + r) * p.lda..][..depth];
            for (k, a) in a_row.iter().enumerate() {
                a_tile[k * ROWS + r] = *a;
            }
        }
        for j0 in (0..p.n).step_by(LANES) {
            if p.out_lower && j0 >= i0 + ROWS {
                break;
            }
            let mut acc = [[0f32; LANES]; ROWS];
            if p.accumulate {
                for (r, acc) in acc.iter_mut().enumerate() {
                    acc.copy_from_slice(&p.c[(i0 + r) * p.ldc + j0..][..LANES]);
                }
            }
            let b_rows = p.b[j0..].chunks(p.ldb).take(depth);
            debug_assert_eq!(b_rows.len(), depth);
            for (a_col, b_row) in a_tile.chunks_exact(ROWS).zip(b_rows) {
                let b_row: &[f32; LANES] = b_row[..LANES].try_into().expect("a full tile");
                for (acc, a) in acc.iter_mut().zip(a_col) {
                    for (x, b) in acc.iter_mut().zip(b_row) {
                        *x = madd::<FMA>(*x, *a, *b);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                p.c[(i0 + r) * p.ldc + j0..][..LANES].copy_from_slice(acc);
            }
        }
    }
}
