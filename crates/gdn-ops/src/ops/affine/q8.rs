//! The opt-in 8-bit-activation path of the CPU matvec (llama.cpp's approach on the same
//! problem): each 64-element chunk of the activation row is rounded once to i8 with its own
//! scale, and 4-bit weights are dotted with it in integers ([`q8_kernel`](super::q8_kernel)).
//! It changes the numbers (the activation rounding), so it is a separate mode, judged by the
//! KL gate (tests/q8_activations.rs).
//!
//! This file is the mode and its dispatch: a matrix's products run the interleaved kernel
//! ([`q8_interleaved`](super::q8_interleaved)) where its words were repacked at load, else
//! the plain one. Both kernels take slices, so neither reads the matrix type back.

use super::matrix::{AffineMatrix, GroupParams};
use super::q8_kernel::{rows_dot_plain, PlainRows};
pub use super::q8_kernel::{supports_format, Q8Row, CHUNK};
use std::cell::Cell;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(false) };
}

/// Whether decode-shaped products on this thread use 8-bit activations.
pub fn enabled() -> bool {
    ENABLED.with(Cell::get)
}

/// Turns the mode on or off for the current thread until dropped (the model enters one per
/// forward call, so models loaded with and without it can share a process).
pub struct Scope(#[allow(dead_code)] crate::thread_flag::FlagScope);

impl Scope {
    pub fn enter(on: bool) -> Self {
        Self(crate::thread_flag::FlagScope::enter(&ENABLED, on))
    }
}

/// Whether a matrix takes the 8-bit-activation path: 4-bit, groups of 64 or a larger power
/// of two.
pub fn supports(m: &AffineMatrix) -> bool {
    supports_format(m.bits, m.group_size)
}

/// `Σ_j w[row, j] · x[j]` with `x` rounded per chunk: per group
/// `scale · Σ_chunks dx · Σ q·xq + bias · Σ x` (`group_sums` holds the exact `Σ x`).
pub fn row_dot(m: &AffineMatrix, row: usize, x: &Q8Row, group_sums: &[f32]) -> f32 {
    let mut out = [0f32];
    rows_dot(m, row, 1, std::slice::from_ref(x), group_sums, &mut out);
    out[0]
}

/// [`row_dot`] of the consecutive weight rows `first .. first + rows` with every activation
/// row of `xs`, into `out` as `[rows, xs.len()]`. `group_sums` is `[xs.len(), groups]`.
///
/// Every (weight row, activation row) pair gets the same arithmetic, in the same order,
/// whatever the batch: a prompt token's products are bit for bit those of a decoded token.
/// A matrix repacked at load ([`AffineMatrix::into_q8_interleaved`]) runs the interleaved
/// kernel ([`q8_interleaved`](super::q8_interleaved)) instead, for every product alike.
pub fn rows_dot(
    m: &AffineMatrix,
    first: usize,
    rows: usize,
    xs: &[Q8Row],
    group_sums: &[f32],
    out: &mut [f32],
) {
    assert_eq!(out.len(), rows * xs.len(), "output is [rows, activations]");
    assert_eq!(group_sums.len(), xs.len() * m.groups_per_row());
    if let Some(interleaved) = m.q8_interleaved() {
        return interleaved.rows_dot(first, rows, xs, group_sums, out);
    }
    // Scales and biases stay in their stored dtype: the kernel widens them as it goes.
    match (m.scales(), m.biases()) {
        (GroupParams::Bf16(s), GroupParams::Bf16(b)) => {
            rows_dot_plain(&plain(m, s, b), first, xs, group_sums, out)
        }
        (GroupParams::F16(s), GroupParams::F16(b)) => {
            rows_dot_plain(&plain(m, s, b), first, xs, group_sums, out)
        }
        (scales, biases) => {
            let (s, b) = (scales.to_f32_vec(), biases.to_f32_vec());
            rows_dot_plain(&plain(m, &s, &b), first, xs, group_sums, out)
        }
    }
}

/// `m`'s plain-layout words with its scales and biases in the type the kernel widens.
fn plain<'a, P>(m: &'a AffineMatrix, scales: &'a [P], biases: &'a [P]) -> PlainRows<'a, P> {
    PlainRows {
        words: m.packed(),
        scales,
        biases,
        words_per_row: m.words_per_row(),
        groups_per_row: m.groups_per_row(),
        group_size: m.group_size,
    }
}

#[cfg(test)]
mod row_tests {
    use super::super::packing::pack_row;
    use super::*;

    /// The 8-bit-activation dot is the exact dot up to the activation rounding: within
    /// 1% of Σ|w·x| on random rows at every supported group size.
    #[test]
    fn row_dot_tracks_the_exact_dot() {
        for group in [64, 128] {
            let cols = 256;
            let q: Vec<u32> = (0..cols as u32).map(|j| (j * 11 + 5) % 16).collect();
            let groups = cols / group;
            let scales: Vec<f32> = (0..groups).map(|g| 0.02 + 0.01 * g as f32).collect();
            let biases: Vec<f32> = (0..groups).map(|g| -0.1 + 0.03 * g as f32).collect();
            let m =
                AffineMatrix::new(4, group, [1, 1, cols], pack_row(&q, 4), scales, biases).unwrap();
            let x: Vec<f32> = (0..cols)
                .map(|j| ((j * 29 % 41) as f32 - 20.0) / 7.0)
                .collect();
            let sums: Vec<f32> = x.chunks(group).map(|c| c.iter().sum()).collect();
            let mut w = vec![0f32; cols];
            m.dequantize_row(0, &mut w);
            let exact: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
            let scale: f32 = w.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            let got = row_dot(&m, 0, &Q8Row::quantize(&x), &sums);
            assert!(
                (got - exact).abs() <= 0.01 * scale,
                "group {group}: {got} vs {exact} (Σ|wx| {scale})"
            );
        }
    }

    /// A batch of activation rows (a prompt) gets, pair for pair, the bits of one row at a
    /// time (decode): six rows cover a full block of four and a remainder.
    #[test]
    fn batched_rows_match_single_rows() {
        let (rows, cols, group, n) = (3, 256, 64, 6);
        let q: Vec<u32> = (0..(rows * cols) as u32)
            .map(|j| (j * 7 + 1) % 16)
            .collect();
        let groups = rows * cols / group;
        let scales: Vec<f32> = (0..groups).map(|g| 0.03 + 0.002 * g as f32).collect();
        let biases: Vec<f32> = (0..groups).map(|g| 0.01 * g as f32 - 0.05).collect();
        let m =
            AffineMatrix::new(4, group, [1, rows, cols], pack_row(&q, 4), scales, biases).unwrap();
        let x: Vec<f32> = (0..n * cols)
            .map(|j| ((j * 17 % 61) as f32 - 30.0) / 11.0)
            .collect();
        let xs: Vec<Q8Row> = x.chunks(cols).map(Q8Row::quantize).collect();
        let sums: Vec<f32> = x.chunks(group).map(|c| c.iter().sum()).collect();
        let mut batched = vec![0f32; rows * n];
        rows_dot(&m, 0, rows, &xs, &sums, &mut batched);
        let gpr = cols / group;
        for r in 0..rows {
            for j in 0..n {
                let one = row_dot(&m, r, &xs[j], &sums[j * gpr..(j + 1) * gpr]);
                let got = batched[r * n + j];
                assert_eq!(got.to_bits(), one.to_bits(), "row {r}, activation {j}");
            }
        }
    }
}
