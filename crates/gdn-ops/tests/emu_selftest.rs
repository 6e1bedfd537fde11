//! Self-test of the Metal emulator's threadgroup features (`kernels/emu/metal_emu.h`):
//! `kernels/emu/emu_selftest.cpp` runs small MSL-style kernels (a threadgroup-memory
//! reduction across 4 simdgroups with barriers, every simdgroup function against a plain
//! loop, simdgroup matrix products against a plain matmul) and misuses the emulator must abort on, each with the message a kernel developer
//! would need.
//!
//! Needs clang-19 and libclang-rt-19-dev like the other emulation tests; it never skips.

mod emu;

static HARNESS: emu::Harness = emu::Harness::metal("emu_selftest");

fn run(case: u32) -> Result<Vec<f32>, String> {
    HARNESS.run(&case.to_le_bytes())
}

/// The case's (kernel, plain loop) pairs, which must agree bit for bit.
fn check_pairs(case: u32, what: &str, expected_pairs: usize) {
    let out = run(case).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(out.len(), 2 * expected_pairs, "{what}: output size");
    for (i, pair) in out.chunks_exact(2).enumerate() {
        assert_eq!(
            pair[0].to_bits(),
            pair[1].to_bits(),
            "{what}: value {i}: the kernel gave {}, the plain loop {}",
            pair[0],
            pair[1]
        );
    }
}

/// The case must fail, and its message must contain `message`.
fn check_aborts(case: u32, what: &str, message: &str) {
    match run(case) {
        Ok(out) => panic!(
            "{what}: the emulator let it pass ({} values printed)",
            out.len()
        ),
        Err(e) => assert!(
            e.contains(message),
            "{what}: failed, but without `{message}`: {e}"
        ),
    }
}

#[test]
fn threadgroup_reduction_with_barriers() {
    // 3 threadgroup sums, then 3·128 "memory was poisoned before the first write" flags.
    check_pairs(0, "threadgroup reduction", 3 + 3 * 128);
}

#[test]
fn simdgroup_functions_match_plain_loops() {
    // 64 threads, 16 functions each.
    check_pairs(1, "simdgroup functions", 64 * 16);
}

#[test]
fn thread_returning_before_a_barrier_aborts() {
    check_aborts(
        2,
        "early return",
        "metal_emu: divergent barrier: thread 0 waits at threadgroup_barrier while thread 63 returned",
    );
}

#[test]
fn barriers_from_different_places_abort() {
    check_aborts(
        3,
        "split barrier",
        "metal_emu: divergent barrier: thread 0 waits at threadgroup_barrier at",
    );
}

#[test]
fn threadgroup_memory_over_32k_aborts() {
    check_aborts(
        4,
        "32 KB + 16 of threadgroup memory",
        "metal_emu: 32784 bytes of threadgroup memory requested; Metal allows at most 32768",
    );
}

#[test]
fn lane_skipping_a_simdgroup_function_aborts() {
    check_aborts(
        5,
        "divergent simd_max",
        "metal_emu: divergent simdgroup 0: lane 1 reached simd_max while lane 0 returned",
    );
}

#[test]
fn non_uniform_shuffle_mask_aborts() {
    check_aborts(
        6,
        "varying xor mask",
        "simd_shuffle_xor: lane 0 passed mask 0 but lane 1 passed 1",
    );
}

#[test]
fn more_than_1024_threads_abort() {
    check_aborts(
        7,
        "1056 threads",
        "metal_emu: 1056 threads per threadgroup; Metal allows 1 to 1024",
    );
}

#[test]
fn write_past_threadgroup_memory_faults() {
    check_aborts(8, "threadgroup memory overrun", "SIGSEGV");
}

#[test]
fn simdgroup_matrices_match_a_plain_matmul() {
    // 3 products of [16, 16]: float, half times bfloat, and simdgroup_multiply with a
    // diagonal matrix stored transposed.
    check_pairs(9, "simdgroup matrices", 3 * 16 * 16);
}

#[test]
fn lane_dependent_simdgroup_matrix_aborts() {
    check_aborts(
        10,
        "make_filled_simdgroup_matrix(lane)",
        "simdgroup_store: lane 1 holds a different operand a than lane 0",
    );
}

#[test]
fn lane_dependent_simdgroup_load_address_aborts() {
    check_aborts(
        11,
        "simdgroup_load(out + lane)",
        "simdgroup_load: lane 1 passed address",
    );
}
