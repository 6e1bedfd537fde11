//! The shipped Metal kernels `kernels/affine.metal`, compiled as C++ with clang-19 and the
//! Metal emulation header (`kernels/emu/`), run on the CPU for all nine
//! `affine_qmv_{in}_{sc}`, nine `affine_dequant_{out}_{sc}` and nine
//! `affine_qmv_swiglu_{in}_{sc}` kernels and compared with the
//! Rust reference of MLX affine quantization, [`gdn_ops::ops::affine::AffineMatrix`]: qmv and
//! qmv_swiglu over the family's cases (tests/common/affine.rs), dequant over its own.
//!
//! Needs Debian's `clang-19` and `libclang-rt-19-dev` (the harness links with
//! `--rtlib=compiler-rt`, for bf16 conversions that libgcc 12 lacks). Without them this test
//! fails; it never skips. `GDN_EMU_CXX` overrides the compiler.
//!
//! The harness launches the geometry of `crates/gdn-ops/src/metal/affine.rs` and guards every
//! buffer: a read past an input's end or a write to an input faults, a write outside an
//! output or an output element left unwritten fails the case.
//!
//! Gates, per case:
//! - qmv: every `y` within `(n + 3)·2⁻²⁴·Σⱼ(|s·qⱼ| + |b|)·|xⱼ| + 1 ulp of InT` of the exact
//!   `Σⱼ wⱼ·xⱼ` (f64, over the reference's f32 `dequantize_row` values). `n = 46 + ⌈K/256⌉`
//!   bounds the f32 roundings any one term passes through in the kernel (product, 8-term
//!   chunk sum, scale or bias product, their sum, one accumulation per 256 columns, and a
//!   simd_sum that is at worst sequential over 32 lanes); the 3 covers the reference's own
//!   f32 `s·q + b`; the ulp is the one rounding to InT. The bound is relative to the terms
//!   before cancellation, so it is sound whatever the signs, and tight enough (about 3e-6 of
//!   that sum) that dropping one column of 2048 fails it.
//! - qmv_swiglu: every activation within what the qmv allowance of its gate and up products,
//!   plus one rounding of each to InT, can move `silu(g)·u` (|silu'| ≤ 1.1), plus 1e-6
//!   relative for f32 exp and products and one ulp of InT for the final rounding.
//! - dequant: bit for bit the reference's f32 `s·q + b` rounded once to OutT (NaN for a row
//!   id past the stacked matrix). Exact because the harness is built with
//!   `-ffp-contract=off`, so the kernel's `s * q + b` is the same multiply and add as the
//!   reference's. On a GPU the Metal compiler may fuse it into one fma: with f16 or bf16
//!   scales (MLX checkpoints) that changes nothing, since `s·q` is exact in f32, but with
//!   f32 scales it can move the f32 value by one ulp before the rounding, so bit-exactness
//!   there is a property of the emulation only. (Built with fma, the f32-scale cases fail
//!   this gate: it does tell the two apart.)

mod common;
mod emu;

use common::affine::{cases as op_cases, inputs, pairs, seed, Case as OpCase, Gather, Kind};
use common::affine::{widths, AFFINE_PARAMS, BITS, GROUPS};
use common::{failures_on_all_cores, scaled_matrix, Rng, Ty, TYPES};
use gdn_ops::ops::affine::{dequantize_row, unpack_row, AffineMatrix};
use std::sync::Mutex;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    Qmv,
    Dequant,
    /// `affine_qmv_swiglu_*`: a stacked gate-and-up matrix, read like qmv.
    Swiglu,
    /// `affine_qmv_pass_*`: 2..=8 dense rows in one pass (checked against [`Kernel::Qmv`]).
    Pass,
}

impl Kernel {
    fn name(self) -> &'static str {
        [
            "affine_qmv",
            "affine_dequant",
            "affine_qmv_swiglu",
            "affine_qmv_pass",
        ][self as usize]
    }
}

const KERNELS: [Kernel; 3] = [Kernel::Qmv, Kernel::Dequant, Kernel::Swiglu];

// The dequant gate is bit for bit: no fma contraction of s * q + b.
static HARNESS: emu::Harness = emu::Harness::metal_with("affine_harness", &["-ffp-contract=off"]);

/// Everything one emulated launch needs.
struct Case {
    kernel: Kernel,
    /// InT (qmv) or OutT (dequant).
    vt: Ty,
    /// ScT.
    st: Ty,
    m: AffineMatrix,
    /// qmv: `[x_rows, cols]`, rounded to InT. Empty for dequant.
    x: Vec<f32>,
    x_rows: usize,
    x_div: usize,
    ids: Option<Vec<u32>>,
    out_rows: usize,
    label: String,
}

fn tag(v: Ty, s: Ty) -> String {
    format!("{}_{}", v.name(), s.name())
}

/// Case `i` of the family's cases (tests/common/affine.rs) on the qmv or qmv_swiglu kernel.
fn qmv_case(i: usize, c: &OpCase) -> Case {
    let x = inputs(c, seed(i));
    let kernel = match c.kind {
        Kind::Products => Kernel::Qmv,
        Kind::Swiglu => Kernel::Swiglu,
    };
    Case {
        kernel,
        vt: c.x,
        st: c.scales,
        m: x.m,
        x: x.x,
        x_rows: c.x_rows(),
        x_div: c.x_div(),
        ids: (c.gather != Gather::Dense).then_some(x.ids),
        out_rows: c.out_rows(),
        label: format!("{}_{} {}", kernel.name(), tag(c.x, c.scales), c.label()),
    }
}

/// A dequant case's matrix: `[experts, rows, cols]`, scales of `scale_mag` (see
/// [`scaled_matrix`]).
#[derive(Clone, Copy)]
struct Shape {
    experts: usize,
    rows: usize,
    cols: usize,
    bits: usize,
    group_size: usize,
    scale_mag: Option<f32>,
}

impl Shape {
    fn new(experts: usize, rows: usize, cols: usize, bits: usize, group_size: usize) -> Self {
        Self {
            experts,
            rows,
            cols,
            bits,
            group_size,
            scale_mag: None,
        }
    }
}

fn dequant_case(
    seed: u64,
    vt: Ty,
    st: Ty,
    shape: Shape,
    ids: Option<Vec<u32>>,
    out_rows: usize,
) -> Case {
    let mut rng = Rng::new(seed);
    let s = shape;
    let dims = [s.experts, s.rows, s.cols];
    let m = scaled_matrix(
        &mut rng,
        s.bits,
        s.group_size,
        dims,
        st.dtype(),
        s.scale_mag,
    );
    let label = format!(
        "affine_dequant_{} E={} R={} K={} bits={} gs={} M={out_rows} ids={ids:?} scale_mag={:?}",
        tag(vt, st),
        shape.experts,
        shape.rows,
        shape.cols,
        shape.bits,
        shape.group_size,
        shape.scale_mag
    );
    Case {
        kernel: Kernel::Dequant,
        vt,
        st,
        m,
        x: vec![],
        x_rows: 0,
        x_div: 1,
        ids,
        out_rows,
        label,
    }
}

/// The family's products and SwiGLU cases on the qmv and qmv_swiglu kernels, and the dequant
/// kernel's own cases.
fn cases() -> Vec<Case> {
    let mut out: Vec<Case> = op_cases()
        .iter()
        .enumerate()
        .map(|(i, c)| qmv_case(i, c))
        .collect();
    let pairs = pairs();
    let mut next_seed = common::seeds(104_729);
    // dequant: every width x group size x instantiation, with and without row ids.
    for (bi, &bits) in BITS.iter().enumerate() {
        for (gi, &gs) in GROUPS.iter().enumerate() {
            for (pi, &(vt, st)) in pairs.iter().enumerate() {
                let k = widths(gs)[(bi + gi + pi) % 4];
                let (e, r) = [(1, 13), (3, 5), (2, 1)][(bi + pi) % 3];
                let shape = Shape::new(e, r, k, bits, gs);
                let seed = next_seed();
                if (bi + gi + pi) % 2 == 0 {
                    let mut rng = Rng::new(seed ^ 0xABCD);
                    let mut ids: Vec<u32> = (0..4).map(|_| rng.below(e * r) as u32).collect();
                    ids[3] = ids[0]; // a repeat
                    out.push(dequant_case(seed, vt, st, shape, Some(ids), 4));
                } else {
                    // The first rows, or all of them.
                    let m = if pi % 2 == 0 { e * r } else { 1 };
                    out.push(dequant_case(seed, vt, st, shape, None, m));
                }
            }
        }
    }
    for (i, &vt) in TYPES.iter().enumerate() {
        for mag in [1e-6f32, 3e5] {
            let mut shape = Shape::new(1, 4, 640, BITS[(i * 2 + (mag > 1.0) as usize) % 6], 128);
            shape.scale_mag = Some(mag);
            out.push(dequant_case(next_seed(), vt, Ty::Bf16, shape, None, 4));
        }
    }
    // A row id past the stacked matrix (E*R = 6): that row is NaN, the others as usual.
    out.push(dequant_case(
        next_seed(),
        Ty::F16,
        Ty::F32,
        Shape::new(2, 3, 192, 3, 64),
        Some(vec![5, 6, 0]),
        3,
    ));
    out
}

fn run_harness(c: &Case) -> Result<Vec<f32>, String> {
    let m = &c.m;
    let mut bytes = b"AFFEMU01".to_vec();
    let header = [
        c.kernel as usize,
        c.vt.code() as usize,
        c.st.code() as usize,
        m.experts,
        m.rows,
        m.cols,
        m.bits,
        m.group_size,
        c.out_rows,
        c.x_div,
        c.ids.is_some() as usize,
        c.x_rows,
    ];
    for h in header {
        bytes.extend_from_slice(&(h as u32).to_le_bytes());
    }
    for w in m.packed() {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    let (scales, biases) = (m.scales().to_f32_vec(), m.biases().to_f32_vec());
    for f in scales.iter().chain(&biases).chain(&c.x) {
        bytes.extend_from_slice(&f.to_le_bytes());
    }
    for id in c.ids.iter().flatten() {
        bytes.extend_from_slice(&id.to_le_bytes());
    }
    let floats = HARNESS.run(&bytes)?;
    let want = c.out_rows
        * match c.kernel {
            Kernel::Qmv | Kernel::Pass => m.rows,
            Kernel::Dequant => m.cols,
            Kernel::Swiglu => m.rows / 2,
        };
    if floats.len() != want {
        return Err(format!(
            "harness wrote {} floats, expected {want}",
            floats.len()
        ));
    }
    Ok(floats)
}

/// `|y − want|` as a multiple of `allowed` (infinite for a NaN or infinite `y`).
fn excess(y: f64, want: f64, allowed: f64) -> f64 {
    if y.is_finite() {
        (y - want).abs() / allowed
    } else {
        f64::INFINITY
    }
}

/// Checks a qmv case; returns a description of what is wrong.
fn check_qmv(c: &Case, got: &[f32]) -> Option<String> {
    let m = &c.m;
    let (k, r) = (m.cols, m.rows);
    let (mut worst, mut report) = (0f64, None);
    for i in 0..c.out_rows {
        let e = c.ids.as_ref().map_or(0, |ids| ids[i] as usize);
        let x = &c.x[(i / c.x_div) * k..][..k];
        for row_in_expert in 0..r {
            let (want, products) = exact_product(m, e * r + row_in_expert, x);
            let y = got[i * r + row_in_expert] as f64;
            let allowed = products + c.vt.ulp64(y.abs().max(want.abs()));
            let excess = excess(y, want, allowed);
            if excess > worst {
                worst = excess;
                report = Some(format!(
                    "y[{i}, {row_in_expert}] = {y:e} vs exact {want:e}: off by {:.3e}, {excess:.3e}x the allowed {allowed:.3e}",
                    (y - want).abs()
                ));
            }
        }
    }
    let mut w = WORST_QMV.lock().unwrap();
    *w = w.max(worst);
    if worst > 1.0 {
        report
    } else {
        None
    }
}

/// The exact `x·W[row]` (f64, over the reference's f32 `dequantize_row` values) and the
/// allowance of the kernel's f32 product, without the final rounding to InT: `n·2⁻²⁴·
/// Σⱼ(|s·qⱼ| + |b|)·|xⱼ|` (see the module's gates).
fn exact_product(m: &AffineMatrix, row: usize, x: &[f32]) -> (f64, f64) {
    let (k, gs) = (m.cols, m.group_size);
    let (wpr, gpr) = (m.words_per_row(), m.groups_per_row());
    let n = 46 + k.div_ceil(256) + 3;
    let gamma = n as f64 * 2f64.powi(-24) * 1.001;
    let (mut w, mut q) = (vec![0f32; k], vec![0f32; k]);
    let (scales, biases) = (m.scales().to_f32_vec(), m.biases().to_f32_vec());
    m.dequantize_row(row, &mut w);
    unpack_row(&m.packed()[row * wpr..][..wpr], m.bits, &mut q);
    let (mut want, mut magnitude) = (0f64, 0f64);
    for j in 0..k {
        let (s, b) = (scales[row * gpr + j / gs], biases[row * gpr + j / gs]);
        want += w[j] as f64 * x[j] as f64;
        magnitude += ((s as f64 * q[j] as f64).abs() + (b as f64).abs()) * (x[j] as f64).abs();
    }
    (want, gamma * magnitude)
}

/// Checks a qmv_swiglu case: every activation within what the errors of g and u (their f32
/// products, then one rounding each to InT) can move `silu(g)·u` (|silu'| <= 1.1), plus f32
/// exp and product error and the final rounding to InT.
fn check_swiglu(c: &Case, got: &[f32]) -> Option<String> {
    let m = &c.m;
    let (k, im) = (m.cols, m.rows / 2);
    let silu = |g: f64| g / (1.0 + (-g).exp());
    let (mut worst, mut report) = (0f64, None);
    for i in 0..c.out_rows {
        let e = c.ids.as_ref().expect("gathered")[i] as usize;
        let x = &c.x[(i / c.x_div) * k..][..k];
        for a in 0..im {
            let (g, g_err) = exact_product(m, e * m.rows + a, x);
            let (u, u_err) = exact_product(m, e * m.rows + im + a, x);
            let dg = g_err + c.vt.ulp64(g.abs() + g_err);
            let du = u_err + c.vt.ulp64(u.abs() + u_err);
            let want = silu(g) * u;
            let y = got[i * im + a] as f64;
            let allowed = 1.1 * dg * (u.abs() + du)
                + silu(g).abs() * du
                + 1e-6 * want.abs()
                + c.vt.ulp64(y.abs().max(want.abs()));
            let excess = excess(y, want, allowed);
            if excess > worst {
                worst = excess;
                report = Some(format!(
                    "act[{i}, {a}] = {y:e} vs exact {want:e} (g {g:e}, u {u:e}): {excess:.3e}x the allowed {allowed:.3e}"
                ));
            }
        }
    }
    if worst > 1.0 {
        report
    } else {
        None
    }
}

/// The largest qmv error seen, as a fraction of its allowance (how tight the gate is).
static WORST_QMV: Mutex<f64> = Mutex::new(0.0);

/// Checks a dequant case bit for bit; returns a description of what is wrong.
fn check_dequant(c: &Case, got: &[f32]) -> Option<String> {
    let m = &c.m;
    let k = m.cols;
    let (wpr, gpr) = (m.words_per_row(), m.groups_per_row());
    let mut row_values = vec![0f32; k];
    let (scales, biases) = (m.scales().to_f32_vec(), m.biases().to_f32_vec());
    let (mut bad, mut first) = (0, None);
    for i in 0..c.out_rows {
        let src = c.ids.as_ref().map_or(i, |ids| ids[i] as usize);
        let valid = src < m.experts * m.rows;
        if valid {
            // Through the free function too, so both reference entry points agree.
            dequantize_row(
                &m.packed()[src * wpr..][..wpr],
                &scales[src * gpr..][..gpr],
                &biases[src * gpr..][..gpr],
                m.bits,
                &mut row_values,
            );
        }
        for j in 0..k {
            let g = got[i * k + j];
            let ok = if valid {
                g.to_bits() == c.vt.round(row_values[j]).to_bits()
            } else {
                g.is_nan()
            };
            if !ok {
                bad += 1;
                first.get_or_insert(format!(
                    "out[{i}, {j}] = {g:e} vs {}",
                    if valid {
                        format!("{:e}", c.vt.round(row_values[j]))
                    } else {
                        "NaN (row id out of range)".into()
                    }
                ));
            }
        }
    }
    first.map(|f| format!("{bad} of {} values differ, first {f}", got.len()))
}

/// `affine_qmv_pass_*` over 2..=8 dense rows against `affine_qmv_*` over the same rows (a
/// threadgroup row each, each row alone): the same bits, every bit width, each (x, scales)
/// type, row counts held for 2, 4 and 8, rows past a simdgroup's 4 and a threadgroup's 8.
#[test]
fn one_pass_over_several_rows_gives_each_row_its_bits_alone() {
    let mut rng = Rng::new(0x28_29);
    let mut jobs = vec![];
    for (k, rows) in (2..=8).enumerate() {
        for (i, &bits) in BITS.iter().enumerate() {
            let (vt, st) = (TYPES[(i + k) % 3], TYPES[(i + 2 * k) % 3]);
            let group = GROUPS[(i + k) % GROUPS.len()];
            let cols = 2 * 256.max(group);
            let m = scaled_matrix(&mut rng, bits, group, [1, 21, cols], st.dtype(), None);
            let x: Vec<f32> = (0..rows * cols)
                .map(|_| vt.round(rng.uniform(-1.0, 1.0)))
                .collect();
            let label = format!("{rows} rows, {bits}-bit group {group}, {}", tag(vt, st));
            jobs.push(Case {
                kernel: Kernel::Pass,
                vt,
                st,
                m,
                x,
                x_rows: rows,
                x_div: 1,
                ids: None,
                out_rows: rows,
                label,
            });
        }
    }
    let failures = failures_on_all_cores(&jobs, |c| {
        let alone = Case {
            kernel: Kernel::Qmv,
            m: c.m.clone(),
            x: c.x.clone(),
            ids: None,
            label: c.label.clone(),
            ..*c
        };
        let (pass, rows) = match (run_harness(c), run_harness(&alone)) {
            (Ok(p), Ok(r)) => (p, r),
            (Err(e), _) | (_, Err(e)) => return Some(format!("[{}] {e}", c.label)),
        };
        let differ = pass
            .iter()
            .zip(&rows)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        differ.map(|i| {
            format!(
                "[{}] row {} output {}: {} in one pass, {} alone",
                c.label,
                i / c.m.rows,
                i % c.m.rows,
                pass[i],
                rows[i]
            )
        })
    });
    assert!(
        failures.is_empty(),
        "{} of {} cases differ: {failures:?}",
        failures.len(),
        jobs.len()
    );
}

#[test]
fn shipped_affine_kernels_match_the_cpu_reference() {
    let started = Instant::now();
    HARNESS.path();
    let jobs = cases();
    // Coverage the cases are meant to have.
    for kernel in KERNELS {
        for (v, s) in pairs() {
            assert!(jobs
                .iter()
                .any(|c| (c.kernel, c.vt, c.st) == (kernel, v, s)));
        }
        for bits in BITS {
            for gs in GROUPS {
                assert!(jobs
                    .iter()
                    .any(|c| c.kernel == kernel && c.m.bits == bits && c.m.group_size == gs));
            }
        }
    }
    let failures = failures_on_all_cores(&jobs, |c| {
        let bad = match run_harness(c) {
            Err(e) => Some(e),
            Ok(got) => match c.kernel {
                Kernel::Qmv => check_qmv(c, &got),
                Kernel::Dequant => check_dequant(c, &got),
                Kernel::Swiglu => check_swiglu(c, &got),
                Kernel::Pass => Some("the pass kernel is checked by its own test".into()),
            },
        };
        bad.map(|bad| format!("[{}] {bad}", c.label))
    });
    eprintln!(
        "{} cases ({} qmv, {} dequant, {} qmv_swiglu) in {:.1}s; worst qmv error {:.3} of its allowance",
        jobs.len(),
        jobs.iter().filter(|c| c.kernel == Kernel::Qmv).count(),
        jobs.iter().filter(|c| c.kernel == Kernel::Dequant).count(),
        jobs.iter().filter(|c| c.kernel == Kernel::Swiglu).count(),
        started.elapsed().as_secs_f32(),
        *WORST_QMV.lock().unwrap()
    );
    // Per kernel: how many of its cases fail, and the first failure.
    let mut report = vec![];
    for kernel in KERNELS {
        for (v, s) in pairs() {
            let of = |i: usize| (jobs[i].kernel, jobs[i].vt, jobs[i].st) == (kernel, v, s);
            let mine: Vec<_> = failures.iter().filter(|(i, _)| of(*i)).collect();
            if let Some((_, first)) = mine.first() {
                let total = (0..jobs.len()).filter(|&i| of(i)).count();
                report.push(format!(
                    "{}_{}: {} of {total} cases fail, first {first}",
                    kernel.name(),
                    tag(v, s),
                    mine.len()
                ));
            }
        }
    }
    let what = "emulated kernel runs disagree with the reference";
    common::assert_none_failed(failures.len(), jobs.len(), what, &report);
}

/// What the C++ build cannot see: the buffer indices (attributes, ignored by clang) and the
/// parameter struct the Rust host side mirrors.
#[test]
fn kernel_abi_in_source() {
    emu::assert_params("affine.h", "AffineParams", &AFFINE_PARAMS);
    assert_eq!(
        std::mem::size_of::<gdn_ops::ops::affine::AffineParams>(),
        7 * 4
    );
    let src = std::fs::read_to_string(emu::workspace_root().join("kernels/affine.metal")).unwrap();
    // Without comments: the field comments are documentation, not ABI.
    let code: String = src
        .lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let flat = squash(&code);
    assert!(
        flat.contains("#include \"params/affine.h\""),
        "affine.metal must take AffineParams from kernels/params/affine.h"
    );
    let kernels = [
        (
            "#define AFFINE_QMV(",
            &["w", "scales", "biases", "x", "ids", "y", "p"][..],
        ),
        (
            "#define AFFINE_DEQUANT(",
            &["w", "scales", "biases", "ids", "out", "p"][..],
        ),
        (
            "#define AFFINE_QMV_SWIGLU(",
            &["w", "scales", "biases", "x", "ids", "y", "p"][..],
        ),
        (
            "#define AFFINE_QMV_PASS(",
            &["w", "scales", "biases", "x", "y", "p"][..],
        ),
    ];
    for (start, buffers) in kernels {
        emu::assert_buffers(&flat, start, buffers);
    }
    for (v, s) in pairs() {
        for (kernel, mac) in [
            (Kernel::Qmv, "AFFINE_QMV"),
            (Kernel::Dequant, "AFFINE_DEQUANT"),
            (Kernel::Swiglu, "AFFINE_QMV_SWIGLU"),
            (Kernel::Pass, "AFFINE_QMV_PASS"),
        ] {
            let line = format!(
                "{mac}({}_{}, {}, {})",
                kernel.name(),
                tag(v, s),
                v.msl(),
                s.msl()
            );
            assert!(flat.contains(&line), "missing `{line}`");
        }
    }
}
