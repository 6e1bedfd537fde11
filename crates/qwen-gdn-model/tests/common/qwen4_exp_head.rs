//! Qwen3.8-Flash-Next's MTP head against mlx-vlm's drafter references (models/mtp/reference/),
//! the same for each source of the head: the raw HF layout (tests/mtp_qwen4_exp.rs) and
//! mlx-vlm's separate drafter folders (tests/mtp_qwen4_exp_drafter.rs).

use super::{argmax_rows, flat, models_dir, rel_max_diff, Reference};
use candle_core::{Device, Tensor};
use qwen_gdn_model::Model;

/// models/mtp/reference/`name`.safetensors.
pub fn mtp_reference(name: &str) -> Reference {
    let path = models_dir()
        .join("mtp")
        .join("reference")
        .join(format!("{name}.safetensors"));
    Reference(
        candle_core::safetensors::load(&path, &Device::Cpu)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
}

/// The head over every recorded pair (mlx-vlm's streams, the ids) in one causal call: its
/// logits.
pub fn head_logits_on(model: &Model, streams: &Tensor, ids: &[u32]) -> Tensor {
    let n = ids.len();
    let streams = streams.narrow(0, 0, n - 1).unwrap().unsqueeze(0).unwrap();
    let mut cache = model.mtp_head().unwrap().new_cache();
    let out = model.mtp_forward(&streams, &ids[1..], &mut cache).unwrap();
    model.mtp_logits(&out).unwrap()
}

/// The pair rows whose QSA selection has a margin, and the tied ones: the indexer's block
/// scores are ReLU sums, so blocks at exactly 0 tie at the top-k cut-off now and then, and
/// which one mlx's argpartition keeps is its own choice (ours keeps the first).
pub fn rows_with_a_margin(reference: &Reference) -> (Vec<u32>, Vec<u32>) {
    let margins = flat(reference.get("head_selection_margins"));
    let (mut rows, mut tied) = (vec![], vec![]);
    for (i, m) in margins.iter().enumerate() {
        match *m > 1e-4 {
            true => rows.push(i as u32),
            false => tied.push(i as u32),
        }
    }
    (rows, tied)
}

pub fn select(t: &Tensor, rows: &[u32]) -> Tensor {
    t.index_select(&Tensor::new(rows, t.device()).unwrap(), 0)
        .unwrap()
}

/// mlx-vlm's `draft_block` after its prefill over the pairs up to the reference's `chain_at`,
/// replayed on `model`: the first draft from the pairs, the next ones each from (the head's
/// own output streams, the previous draft). Our tokens and the logits' error relative to
/// max|logit| of the reference's.
pub fn chained_drafts(model: &Model, reference: &Reference) -> (Vec<u32>, f32) {
    let ids = reference.ids("ids");
    let at = reference.ids("chain_at")[0] as usize;
    let n = reference.ids("chain_tokens").len();
    let streams = reference.get("streams").unsqueeze(0).unwrap();
    let mut cache = model.mtp_head().unwrap().new_cache();
    let out = model
        .mtp_forward(
            &streams.narrow(1, 0, at + 1).unwrap(),
            &ids[1..at + 2],
            &mut cache,
        )
        .unwrap();
    let mut h = out.narrow(1, at, 1).unwrap();
    let (mut tokens, mut logits) = (vec![], vec![]);
    loop {
        let l = model.mtp_logits(&h).unwrap();
        let t = argmax_rows(&l)[0];
        tokens.push(t);
        logits.push(l);
        if tokens.len() == n {
            break;
        }
        h = model.mtp_forward(&h, &[t], &mut cache).unwrap();
    }
    let err = rel_max_diff(
        &Tensor::cat(&logits, 0).unwrap(),
        reference.get("chain_logits"),
    );
    eprintln!("chain from {at}: {tokens:?}, logits off by {err:.2e}");
    (tokens, err)
}
