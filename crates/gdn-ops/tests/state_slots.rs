//! The state kernels over B sequences on the CPU twins: `gdn_conv_prep_slots`,
//! `gated_delta_update_norm_slots` and `attn_prep_slots` against the per-sequence ops row by
//! row, bit for bit (tests/common/state_slots.rs), and the slot ops' input checks.

mod common;

use candle_core::{DType, Device, Tensor};
use common::state_slots::{
    assert_conv_slots_exact, assert_decode_slots_exact, assert_prep_slots_exact,
    assert_recurrence_slots_exact, conv_cases, decode_cases, prep_cases, recurrence_cases,
};
use common::TYPES;
use gdn_ops::ops::gated_delta_norm::Gate;
use gdn_ops::ops::gated_delta_norm_slots::gated_delta_update_norm_slots;

#[test]
fn recurrence_slots_are_the_per_sequence_op() {
    for (i, c) in recurrence_cases().into_iter().enumerate() {
        for (j, (dtype, st)) in [
            (DType::F32, DType::F32),
            (DType::F32, DType::BF16),
            (DType::BF16, DType::F32),
        ]
        .into_iter()
        .enumerate()
        {
            let gate = [Gate::Silu, Gate::Sigmoid][(i + j) % 2];
            assert_recurrence_slots_exact(&Device::Cpu, c, dtype, st, gate, 100 + 10 * i as u64);
        }
    }
}

#[test]
fn conv_slots_are_the_per_sequence_op() {
    for (i, c) in conv_cases().into_iter().enumerate() {
        for ty in TYPES {
            assert_conv_slots_exact(&Device::Cpu, c, ty, 200 + 10 * i as u64 + ty as u64);
        }
    }
}

#[test]
fn attn_prep_slots_are_the_per_sequence_op() {
    for (i, c) in prep_cases().into_iter().enumerate() {
        for ty in TYPES {
            assert_prep_slots_exact(&Device::Cpu, c, ty, 500 + 10 * i as u64 + ty as u64);
        }
    }
}

#[test]
fn attn_decode_slots_are_the_per_sequence_op() {
    for (i, c) in decode_cases().iter().enumerate() {
        for ty in TYPES {
            assert_decode_slots_exact(&Device::Cpu, c, ty, 700 + 10 * i as u64 + ty as u64);
        }
    }
}

/// One line for each bad call of the decode's slot op: no sequences, a buffer count that is
/// not q's rows, sequences of different head dims.
#[test]
fn attn_decode_slots_reject_bad_calls() {
    use gdn_ops::ops::attn_decode_slots::attn_decode_slots;
    let dev = Device::Cpu;
    let (nq, nkv) = (4, 2);
    let q = |dh: usize| Tensor::zeros((2, nq, dh), DType::F32, &dev).unwrap();
    let gate = |dh: usize| Tensor::zeros((2, nq * dh), DType::F32, &dev).unwrap();
    let kv = |dh: usize| Tensor::zeros((1, nkv, 8, dh), DType::F32, &dev).unwrap();
    let pos = Tensor::new(&[3u32], &dev).unwrap();
    let run = |q: &Tensor, gate: &Tensor, kv: &[Tensor], n: usize| {
        let positions = vec![pos.clone(); n];
        attn_decode_slots(q, gate, kv, kv, &positions)
            .unwrap_err()
            .to_string()
    };
    let none = run(&q(32), &gate(32), &[], 0);
    assert!(none.contains("no sequences"), "{none}");
    let count = run(&q(32), &gate(32), &[kv(32)], 1);
    assert!(count.contains("for 1 positions"), "{count}");
    let heads = run(&q(32), &gate(32), &[kv(32), kv(64)], 2);
    assert!(heads.contains("keys"), "{heads}");
    for e in [none, count, heads] {
        assert!(!e.contains('\n'), "{e}");
    }
}

/// One line for each bad call: no states, a state count that is not q's rows, states of
/// different dtypes, a state of the wrong shape.
#[test]
fn recurrence_slots_reject_bad_states() {
    let dev = Device::Cpu;
    let (b, hk, hv, dk, dv) = (2, 1, 2, 32, 32);
    let q = Tensor::zeros((b, 1, hk, dk), DType::F32, &dev).unwrap();
    let v = Tensor::zeros((b, 1, hv, dv), DType::F32, &dev).unwrap();
    let g = Tensor::ones((b, 1, hv), DType::F32, &dev).unwrap();
    let z = v.clone();
    let w = Tensor::ones(dv, DType::F32, &dev).unwrap();
    let state = |dtype: DType, dv: usize| Tensor::zeros((1, hv, dv, dk), dtype, &dev).unwrap();
    let run = |states: &[Tensor]| {
        gated_delta_update_norm_slots(&q, &q, &v, &g, &g, states, &z, &w, 1e-6, Gate::Silu)
            .unwrap_err()
            .to_string()
    };
    assert!(run(&[]).contains("no sequences"), "{}", run(&[]));
    let one = run(&[state(DType::F32, dv)]);
    assert!(one.contains("2 rows of q for 1 states"), "{one}");
    let mixed = run(&[state(DType::F32, dv), state(DType::BF16, dv)]);
    assert!(mixed.contains("state 1 is BF16"), "{mixed}");
    let shape = run(&[state(DType::F32, dv), state(DType::F32, dv + 1)]);
    assert!(shape.contains("state"), "{shape}");
    assert!(!shape.contains('\n'), "{shape}");
}

/// The slot ops' address tables are uploaded once per batch composition
/// (`gdn_ops::slot_tables`): a second call on the same buffers uploads nothing; a sequence
/// whose buffer is reallocated (a KV buffer grown), one that leaves, and one that joins each
/// cost one upload; a composition seen before is still kept; `clear` drops them all. Counted
/// on the CPU twins, which look tables up as the CUDA launchers do.
#[test]
fn slot_tables_are_uploaded_once_per_batch_composition() {
    use gdn_ops::launches::uploads;
    use gdn_ops::ops::attn_decode_slots::attn_decode_slots;
    use gdn_ops::slot_tables;
    let dev = Device::Cpu;
    let (nq, nkv, dh) = (4, 2, 32);
    let kv = |cap: usize| Tensor::ones((1, nkv, cap, dh), DType::F32, &dev).unwrap();
    let pos = Tensor::new(&[2u32, 3, 4], &dev).unwrap();
    let positions: Vec<Tensor> = (0..3).map(|i| pos.narrow(0, i, 1).unwrap()).collect();
    let mut keys = vec![kv(8), kv(16), kv(8)];
    let mut values = vec![kv(8), kv(16), kv(8)];
    let uploads_of = |keys: &[Tensor], values: &[Tensor], positions: &[Tensor]| {
        let b = keys.len();
        let q = Tensor::ones((b, nq, dh), DType::F32, &dev).unwrap();
        let gate = Tensor::ones((b, nq * dh), DType::F32, &dev).unwrap();
        let before = uploads();
        attn_decode_slots(&q, &gate, keys, values, positions).unwrap();
        uploads() - before
    };
    slot_tables::clear();
    assert_eq!(uploads_of(&keys, &values, &positions), 1, "first call");
    assert_eq!(uploads_of(&keys, &values, &positions), 0, "same buffers");
    assert_eq!(
        uploads_of(&keys, &values, &positions),
        0,
        "same buffers again"
    );
    // Sequence 1's keys replaced by a buffer of the same shape: the words change through
    // the address alone.
    keys[1] = kv(16);
    assert_eq!(
        uploads_of(&keys, &values, &positions),
        1,
        "a buffer reallocated"
    );
    assert_eq!(uploads_of(&keys, &values, &positions), 0, "steady again");
    // Sequence 0's KV grows (both buffers reallocated at twice the capacity).
    keys[0] = kv(16);
    values[0] = kv(16);
    assert_eq!(
        uploads_of(&keys, &values, &positions),
        1,
        "a KV buffer grown"
    );
    assert_eq!(uploads_of(&keys, &values, &positions), 0, "steady again");
    assert_eq!(
        uploads_of(&keys[..2], &values[..2], &positions[..2]),
        1,
        "a sequence left"
    );
    assert_eq!(
        uploads_of(&keys, &values, &positions),
        0,
        "the composition before is kept"
    );
    let joined = [keys.clone(), vec![kv(8)]].concat();
    let joined_values = [values.clone(), vec![kv(8)]].concat();
    let four = Tensor::new(&[2u32, 3, 4, 5], &dev).unwrap();
    let four: Vec<Tensor> = (0..4).map(|i| four.narrow(0, i, 1).unwrap()).collect();
    assert_eq!(
        uploads_of(&joined, &joined_values, &four),
        1,
        "a sequence joined"
    );
    assert!(slot_tables::kept() >= 3);
    slot_tables::clear();
    assert_eq!(slot_tables::kept(), 0);
    assert_eq!(uploads_of(&keys, &values, &positions), 1, "after clear");
}
