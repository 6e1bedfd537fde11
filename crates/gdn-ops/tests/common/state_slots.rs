//! The GDN state kernels over B sequences (`gdn_conv_prep_slots`,
//! `gated_delta_update_norm_slots`), run by every backend's test alike: each sequence its own
//! random state tensor, and the slot op's outputs and states against the per-sequence op's
//! on each row, on the same device, bit for bit, over a few steps (tests/state_slots.rs on the
//! CPU twins, tests/cuda_state_slots.rs on the GPU). The states differ between sequences, so a
//! slot op that reads another row's state (every row slot 0's, say) fails.

use super::compare::values;
use super::dtype::Ty;
use super::gated_delta::GdnDims as CaseDims;
use super::gated_delta_norm::{norm_tensors, z_of};
use super::gdn_conv_prep::{dims, Tensors};
use super::random::Rng;
use candle_core::{DType, Device, Tensor};
use gdn_ops::ops::gated_delta_norm::{gated_delta_update_norm, Gate};
use gdn_ops::ops::gated_delta_norm_slots::gated_delta_update_norm_slots;
use gdn_ops::ops::gdn_conv_prep::{gdn_conv_prep, ConvPrepDims};
use gdn_ops::ops::gdn_conv_prep_slots::gdn_conv_prep_slots;

/// A recurrence case: B sequences of one token at (Hk, Hv, Dk, Dv).
pub type RecurrenceCase = (usize, usize, usize, usize, usize);

/// Qwen3-Next-80B-A3B's decode at B = 3 and B = 5 (5 × 32 heads: past the CUDA cluster
/// kernel's 128, which a one-sequence launch still takes), GQA 2 with small heads, and Dv not a
/// multiple of 4 (CUDA's one-block-a-head kernel).
pub fn recurrence_cases() -> Vec<RecurrenceCase> {
    vec![
        (3, 16, 32, 128, 128),
        (5, 16, 32, 128, 128),
        (2, 2, 4, 64, 64),
        (3, 2, 4, 64, 50),
    ]
}

/// Conv front cases: B sequences at Qwen3-Next's dims, and a narrow GQA-2 layer with 2 taps.
pub fn conv_cases() -> Vec<(usize, ConvPrepDims)> {
    vec![(3, dims(16, 128, 32, 128, 4)), (5, dims(2, 32, 4, 64, 2))]
}

fn bits(t: &Tensor) -> Vec<u32> {
    values(t).iter().map(|x| x.to_bits()).collect()
}

/// Sequence b's own state: row b of `all` as a separate contiguous tensor on `dev`.
fn split(all: &Tensor, dev: &Device) -> Vec<Tensor> {
    (0..all.dim(0).unwrap())
        .map(|b| {
            all.narrow(0, b, 1)
                .unwrap()
                .to_device(dev)
                .unwrap()
                .copy()
                .unwrap()
        })
        .collect()
}

/// `gated_delta_update_norm_slots` on `dev` against `gated_delta_update_norm` per row on
/// `dev`, three steps, outputs and states bit for bit. Returns the slot op's outputs and
/// final states (for a cross-device check).
pub fn assert_recurrence_slots_exact(
    dev: &Device,
    (b, hk, hv, dk, dv): RecurrenceCase,
    dtype: DType,
    state_dtype: DType,
    gate: Gate,
    seed: u64,
) -> (Vec<Tensor>, Vec<Tensor>) {
    let what = format!("recurrence slots B{b} Hk{hk} Hv{hv} Dk{dk} Dv{dv} {dtype:?}/{state_dtype:?} {gate:?} on {dev:?}");
    let d = CaseDims::new(b, 1, hk, hv, dk, dv);
    let [_, _, _, _, _, state, _, _] = norm_tensors(&mut Rng::new(seed), d, dtype, state_dtype);
    let (slot_states, row_states) = (split(&state, dev), split(&state, dev));
    let mut outs = Vec::new();
    for step in 0..3u64 {
        let [q, k, v, g, beta, _, proj, w] =
            norm_tensors(&mut Rng::new(seed + 1 + step), d, dtype, state_dtype);
        let up = |t: &Tensor| t.to_device(dev).unwrap();
        let (q, k, v, g, beta, w) = (up(&q), up(&k), up(&v), up(&g), up(&beta), up(&w));
        let z = z_of(&up(&proj), d);
        let got =
            gated_delta_update_norm_slots(&q, &k, &v, &g, &beta, &slot_states, &z, &w, 1e-6, gate)
                .unwrap();
        let want = (0..b)
            .map(|r| {
                let row = |t: &Tensor| t.narrow(0, r, 1).unwrap();
                gated_delta_update_norm(
                    &row(&q),
                    &row(&k),
                    &row(&v),
                    &row(&g),
                    &row(&beta),
                    &row_states[r],
                    &row(&z),
                    &w,
                    1e-6,
                    gate,
                )
                .unwrap()
            })
            .collect::<Vec<_>>();
        let want = Tensor::cat(&want, 0).unwrap();
        assert_eq!(got.dims(), want.dims(), "{what}");
        assert_eq!(bits(&got), bits(&want), "{what}: step {step} output");
        for (r, (s, w)) in slot_states.iter().zip(&row_states).enumerate() {
            assert_eq!(
                bits(s),
                bits(w),
                "{what}: step {step} state of sequence {r}"
            );
        }
        outs.push(got);
    }
    (outs, slot_states)
}

/// `gdn_conv_prep_slots` on `dev` against `gdn_conv_prep` per row on `dev`, three steps,
/// outputs and conv states bit for bit. Returns the slot op's q, k, v, g, beta of every step
/// and the final conv states.
pub fn assert_conv_slots_exact(
    dev: &Device,
    (b, d): (usize, ConvPrepDims),
    ty: Ty,
    seed: u64,
) -> (Vec<Tensor>, Vec<Tensor>) {
    let what = format!("conv slots B{b} {d:?} {ty:?} on {dev:?}");
    let first = Tensors::random(d, b, 1, ty, seed);
    let (slot_states, row_states) = (split(&first.state, dev), split(&first.state, dev));
    let mut outs = Vec::new();
    for step in 0..3u64 {
        let t = Tensors::random(d, b, 1, ty, seed + 1 + step);
        let [qkv, bb, a] = t.views(dev).map(|x| x.squeeze(1).unwrap());
        let up = |x: &Tensor| x.to_device(dev).unwrap();
        let (taps, dt_bias, neg_a_exp) =
            (up(&first.taps), up(&first.dt_bias), up(&first.neg_a_exp));
        let got = gdn_conv_prep_slots(&qkv, &bb, &a, &slot_states, &taps, &dt_bias, &neg_a_exp, d)
            .unwrap();
        let per_row = (0..b)
            .map(|r| {
                let row = |x: &Tensor| x.narrow(0, r, 1).unwrap();
                gdn_conv_prep(
                    &row(&qkv),
                    &row(&bb),
                    &row(&a),
                    &row_states[r],
                    &taps,
                    &dt_bias,
                    &neg_a_exp,
                    d,
                )
                .unwrap()
            })
            .collect::<Vec<_>>();
        let stacked = |f: fn(&gdn_ops::ops::gdn_conv_prep::ConvPrepOut) -> &Tensor| {
            Tensor::cat(&per_row.iter().map(f).collect::<Vec<_>>(), 0).unwrap()
        };
        for (name, g, w) in [
            ("q", &got.q, stacked(|o| &o.q)),
            ("k", &got.k, stacked(|o| &o.k)),
            ("v", &got.v, stacked(|o| &o.v)),
            ("g", &got.g, stacked(|o| &o.g)),
            ("beta", &got.beta, stacked(|o| &o.beta)),
        ] {
            assert_eq!(g.dims(), w.dims(), "{what}: {name}");
            assert_eq!(bits(g), bits(&w), "{what}: step {step} {name}");
            outs.push(g.clone());
        }
        for (r, (s, w)) in slot_states.iter().zip(&row_states).enumerate() {
            assert_eq!(
                bits(s),
                bits(w),
                "{what}: step {step} conv state of sequence {r}"
            );
        }
    }
    (outs, slot_states)
}

/// An attention prep case: B sequences at (Nq, Nkv, Dh, R), sequence `r` with KV buffers of
/// capacity `8 + 5r` at position `3r + 1` (each its own length and capacity).
pub type PrepCase = (usize, usize, usize, usize, usize);

/// Qwen3-Next-80B-A3B's attention (16 query heads, 2 KV heads, Dh 256, R 64) at B = 3, and a
/// small GQA-2 layer at B = 5 with every feature rotated.
pub fn prep_cases() -> Vec<PrepCase> {
    vec![(3, 16, 2, 256, 64), (5, 4, 2, 64, 64)]
}

/// `attn_prep_slots` on `dev` against `attn_prep` per row on `dev`, two steps (positions
/// advancing), q, gate and every KV buffer bit for bit. Returns the slot op's q and gate of
/// every step and its final buffers.
pub fn assert_prep_slots_exact(
    dev: &Device,
    (b, nq, nkv, dh, rope): PrepCase,
    ty: Ty,
    seed: u64,
) -> (Vec<Tensor>, Vec<Tensor>) {
    use gdn_ops::ops::attn_prep::attn_prep;
    use gdn_ops::ops::attn_prep_slots::attn_prep_slots;
    let what = format!("attn_prep slots B{b} Nq{nq} Nkv{nkv} Dh{dh} R{rope} {ty:?} on {dev:?}");
    let mut rng = Rng::new(seed);
    let t =
        |rng: &mut Rng, shape: &[usize], lo: f32, hi: f32| random_on(rng, shape, lo, hi, ty, dev);
    let buffers = |rng: &mut Rng| {
        (0..b)
            .map(|r| t(rng, &[1, nkv, 8 + 5 * r, dh], -1.0, 1.0))
            .collect::<Vec<_>>()
    };
    let (keys, values) = (buffers(&mut rng), buffers(&mut rng));
    let copies = |v: &[Tensor]| v.iter().map(|x| x.copy().unwrap()).collect::<Vec<_>>();
    let (row_keys, row_values) = (copies(&keys), copies(&values));
    let q_norm = t(&mut rng, &[dh], 0.5, 1.5);
    let k_norm = t(&mut rng, &[dh], 0.5, 1.5);
    let inv_freq = Tensor::new(super::attn_prep::inv_freq(rope).as_slice(), dev).unwrap();
    let mut outs = Vec::new();
    for step in 0..2u32 {
        let qkv = t(&mut rng, &[b, (2 * nq + 2 * nkv) * dh], -3.0, 3.0);
        let positions = (0..b)
            .map(|r| Tensor::new(&[3 * r as u32 + 1 + step], dev).unwrap())
            .collect::<Vec<_>>();
        let (q, gate) = attn_prep_slots(
            &qkv, &q_norm, &k_norm, 1e-6, &inv_freq, &positions, &keys, &values,
        )
        .unwrap();
        let (want_q, want_gate): (Vec<_>, Vec<_>) = (0..b)
            .map(|r| {
                attn_prep(
                    &qkv.narrow(0, r, 1).unwrap(),
                    &q_norm,
                    &k_norm,
                    1e-6,
                    &inv_freq,
                    &positions[r],
                    &row_keys[r],
                    &row_values[r],
                )
                .unwrap()
            })
            .unzip();
        let want_q = Tensor::cat(&want_q, 0).unwrap();
        let want_gate = Tensor::cat(&want_gate, 0).unwrap();
        assert_eq!(q.dims(), want_q.dims(), "{what}");
        assert_eq!(bits(&q), bits(&want_q), "{what}: step {step} q");
        assert_eq!(bits(&gate), bits(&want_gate), "{what}: step {step} gate");
        for r in 0..b {
            assert_eq!(
                bits(&keys[r]),
                bits(&row_keys[r]),
                "{what}: step {step} keys of sequence {r}"
            );
            assert_eq!(
                bits(&values[r]),
                bits(&row_values[r]),
                "{what}: step {step} values of sequence {r}"
            );
        }
        outs.push(q);
        outs.push(gate);
    }
    (outs, keys.into_iter().chain(values).collect())
}

/// An attention decode case: (Nq, Nkv, Dh) and each sequence's KV capacity; sequence `r`
/// attends up to position `cap_r − 1 − r` (each its own length).
pub type DecodeCase = (usize, usize, usize, Vec<usize>);

/// Ragged capacities that take every body a one-sequence launch picks: one pass (≤ 128
/// positions), the split into a few ranges (the shipped pair where rows are not 16 bytes a
/// lane, else the pipelined pass), 32 ranges from 4 096 on (head pairs where the GQA group is
/// even: Qwen3-Next in f16/bf16 and Dh 128 in f32; the pipelined pass for the odd group of 3).
pub fn decode_cases() -> Vec<DecodeCase> {
    vec![
        (16, 2, 256, vec![64, 300, 4160, 129]),
        (4, 2, 128, vec![200, 8, 4100]),
        (6, 2, 256, vec![130, 4100]),
    ]
}

/// `attn_decode_slots` on `dev` against `attn_decode` per row on `dev`, bit for bit. Returns
/// the slot op's output.
pub fn assert_decode_slots_exact(
    dev: &Device,
    (nq, nkv, dh, caps): &DecodeCase,
    ty: Ty,
    seed: u64,
) -> Tensor {
    use gdn_ops::ops::attn_decode::attn_decode;
    use gdn_ops::ops::attn_decode_slots::attn_decode_slots;
    let (nq, nkv, dh) = (*nq, *nkv, *dh);
    let b = caps.len();
    let what = format!("attn_decode slots Nq{nq} Nkv{nkv} Dh{dh} caps {caps:?} {ty:?} on {dev:?}");
    let mut rng = Rng::new(seed);
    let t =
        |rng: &mut Rng, shape: &[usize], lo: f32, hi: f32| random_on(rng, shape, lo, hi, ty, dev);
    let buffers = |rng: &mut Rng, lo: f32, hi: f32| {
        caps.iter()
            .map(|&cap| t(rng, &[1, nkv, cap, dh], lo, hi))
            .collect::<Vec<_>>()
    };
    let keys = buffers(&mut rng, -1.0, 1.0);
    let values = buffers(&mut rng, -2.0, 2.0);
    let q = t(&mut rng, &[b, nq, dh], -1.0, 1.0);
    let gate = t(&mut rng, &[b, nq * dh], -4.0, 4.0);
    let positions = caps
        .iter()
        .enumerate()
        .map(|(r, &cap)| Tensor::new(&[cap.saturating_sub(1 + r) as u32], dev).unwrap())
        .collect::<Vec<_>>();
    let got = attn_decode_slots(&q, &gate, &keys, &values, &positions).unwrap();
    let want = (0..b)
        .map(|r| {
            let row = |x: &Tensor| x.narrow(0, r, 1).unwrap();
            attn_decode(&row(&q), &row(&gate), &keys[r], &values[r], &positions[r]).unwrap()
        })
        .collect::<Vec<_>>();
    let want = Tensor::cat(&want, 0).unwrap();
    assert_eq!(got.dims(), want.dims(), "{what}");
    let (got_bits, want_bits) = (bits(&got), bits(&want));
    let row = nq * dh;
    for r in 0..b {
        let (g, w) = (&got_bits[r * row..][..row], &want_bits[r * row..][..row]);
        let differ = g.iter().zip(w).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ, 0,
            "{what}: sequence {r}: {differ} of {row} values differ"
        );
    }
    got
}

/// A random tensor of `shape` in [lo, hi), in `ty`, on `dev`.
fn random_on(rng: &mut Rng, shape: &[usize], lo: f32, hi: f32, ty: Ty, dev: &Device) -> Tensor {
    rng.tensor(shape, lo, hi)
        .to_dtype(ty.dtype())
        .unwrap()
        .to_device(dev)
        .unwrap()
}
