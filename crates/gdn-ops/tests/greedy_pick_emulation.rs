//! The shipped greedy pick kernels run on the CPU and compared with the CPU twin
//! (`gdn_ops::ops::greedy_pick`, on the same rounded logits): `kernels/greedy_pick.metal`
//! compiled as C++ with the Metal emulation header, and the bodies of `kernels/greedy_pick.cu`
//! through `kernels/emu/cuda/`, both with their hosts' two passes and geometry
//! (`GreedyPickParams::new`), and on geometries the host never picks (empty slices, one block,
//! more blocks than a simdgroup has lanes), over the op's cases (tests/common/greedy_pick.rs)
//! up to the emulator's size bound.
//!
//! Gate, per case: the `[N, 2]` words equal to the twin's (the pick is exact: a maximum and a
//! count). The harnesses guard every buffer, and check that the slice pass writes every
//! partial record (see kernels/emu/guarded_buffer.h).

mod common;
mod emu;

use candle_core::Tensor;
use common::greedy_pick::{
    cases as op_cases, logits, Case as OpCase, Values, DTYPES, EMULATION_MAX_VALUES,
};
use common::{failures, values, Input};
use gdn_ops::ops::greedy_pick::{greedy_pick, GreedyPickParams, THREADS};

const DTYPE_NAMES: [&str; 3] = ["f32", "f16", "bf16"];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    Metal,
    Cuda,
}

fn harness(kernel: Kernel) -> &'static emu::Harness {
    static METAL: emu::Harness = emu::Harness::metal("greedy_pick_harness");
    static CUDA: emu::Harness = emu::Harness::cuda("greedy_pick_cuda_harness");
    match kernel {
        Kernel::Metal => &METAL,
        Kernel::Cuda => &CUDA,
    }
}

struct Case {
    dtype: usize,
    p: GreedyPickParams,
    kind: Values,
    /// `[rows, vocab]`, rounded to the dtype.
    logits: Tensor,
}

impl Case {
    /// Case `i` of the op's cases, with the host's geometry.
    fn of_op(i: usize, c: OpCase, dtype: usize) -> Self {
        Self {
            dtype,
            p: GreedyPickParams::new(c.rows, c.vocab),
            kind: c.values,
            logits: c.logits(i, dtype),
        }
    }

    /// `p` as given: the harnesses accept any covering geometry.
    fn with_geometry(seed: u64, dtype: usize, p: GreedyPickParams, kind: Values) -> Self {
        let (rows, vocab) = (p.rows as usize, p.vocab as usize);
        Self {
            dtype,
            p,
            kind,
            logits: logits(rows, vocab, kind, DTYPES[dtype], seed),
        }
    }

    fn label(&self, kernel: Kernel) -> String {
        format!(
            "{kernel:?} greedy_pick_{} N={} V={} B={} slice={} {:?}",
            DTYPE_NAMES[self.dtype],
            self.p.rows,
            self.p.vocab,
            self.p.blocks,
            self.p.slice,
            self.kind
        )
    }

    fn run(&self, kernel: Kernel) -> Result<Vec<u32>, String> {
        let mut input = Input::new(b"GPICKEM1");
        let p = self.p;
        for h in [self.dtype as u32, p.rows, p.vocab, p.blocks, p.slice] {
            input.u32(h);
        }
        input.f32s(&values(&self.logits));
        let out = harness(kernel).run(&input.0)?;
        if out.len() != 2 * p.rows as usize {
            return Err(format!(
                "harness wrote {} words, expected {}",
                out.len(),
                2 * p.rows
            ));
        }
        Ok(out.iter().map(|f| f.to_bits()).collect())
    }

    fn check(&self, kernel: Kernel) -> Option<String> {
        let got = match self.run(kernel) {
            Ok(r) => r,
            Err(e) => return Some(e),
        };
        let want: Vec<u32> = greedy_pick(&self.logits)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        (got != want).then(|| format!("(index, non-finite) {got:?}, twin {want:?}"))
    }
}

/// The op's cases the emulator runs in time ([`EMULATION_MAX_VALUES`]), at every dtype, and
/// geometries of the emulation's own.
fn cases() -> Vec<Case> {
    let mut out = vec![];
    for (i, c) in op_cases().into_iter().enumerate() {
        if c.rows * c.vocab <= EMULATION_MAX_VALUES {
            out.extend((0..3).map(|dt| Case::of_op(i, c, dt)));
        }
    }
    let mut next = common::seeds(104_729);
    // Geometries the host never picks: empty last slices; one block for a long row; more
    // blocks (40) than the finish pass has lanes.
    let geometry = |rows, vocab, blocks, slice| GreedyPickParams {
        rows,
        vocab,
        blocks,
        slice,
    };
    for (p, kind) in [
        (geometry(2, 5, 4, 2), Values::MaxLast),
        (geometry(1, 9, 8, 2), Values::Levels(2)),
        (geometry(1, 3_000, 1, 3_000), Values::MaxLast),
        (geometry(2, 4_000, 40, 100), Values::MaxLast),
        (geometry(2, 4_000, 40, 100), Values::Levels(3)),
        (geometry(1, 4_000, 40, 100), Values::NonFinite(9)),
    ] {
        out.push(Case::with_geometry(next(), 0, p, kind));
    }
    out
}

fn check_kernel(kernel: Kernel) {
    harness(kernel).path();
    let jobs = cases();
    let failures: Vec<String> = failures(&jobs, |c| {
        c.check(kernel)
            .map(|e| format!("[{}] {e}", c.label(kernel)))
    });
    common::assert_no_failures(&failures, jobs.len(), "cases disagree with the twin");
}

#[test]
fn shipped_metal_greedy_pick_matches_the_cpu_twin() {
    check_kernel(Kernel::Metal);
}

#[test]
fn shipped_cuda_greedy_pick_bodies_match_the_cpu_twin() {
    check_kernel(Kernel::Cuda);
}

/// What the C++ build cannot see: buffer indices, the parameter struct, the names, the block
/// width the host launches.
#[test]
fn greedy_pick_abi_in_source() {
    emu::assert_params(
        "greedy_pick.h",
        "GreedyPickParams",
        &["rows", "vocab", "blocks", "slice"],
    );
    assert_eq!(std::mem::size_of::<GreedyPickParams>(), 4 * 4);
    emu::assert_params(
        "greedy_pick.h",
        "GreedyPickPartial",
        &["float value", "index", "nonfinite"],
    );
    let header = emu::shipped_source("kernels/params/greedy_pick.h");
    assert!(header.contains(&format!("#define GREEDY_PICK_THREADS {THREADS}")));
    let flat = emu::shipped_source_including("kernels/greedy_pick.metal", "greedy_pick.h");
    emu::assert_buffers(
        &flat,
        "#define GREEDY_PICK_SLICES(",
        &["logits", "partials", "p"],
    );
    emu::assert_buffers(&flat, "void greedy_pick_finish(", &["partials", "out", "p"]);
    for (tag, msl) in [("f32", "float"), ("f16", "half")] {
        let line = format!("GREEDY_PICK_SLICES(greedy_pick_slices_{tag}, {msl})");
        assert!(flat.contains(&line), "missing `{line}`");
    }
    assert!(
        flat.contains(
            "#if defined(__HAVE_BFLOAT__) GREEDY_PICK_SLICES(greedy_pick_slices_bf16, bfloat) #endif"
        ),
        "the bfloat instantiation must be guarded"
    );
    let cu = emu::shipped_source("kernels/greedy_pick.cu");
    for tag in DTYPE_NAMES {
        assert!(
            cu.contains(&format!("GREEDY_PICK_ENTRY({tag}, ")),
            "missing {tag}"
        );
    }
    assert!(cu.contains("extern \"C\" __global__ void greedy_pick_finish("));
}
