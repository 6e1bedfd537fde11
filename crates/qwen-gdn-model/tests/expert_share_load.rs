//! Issue 31: an expert-parallel rank reads only its own experts' bytes from the checkpoint
//! (`ModelPart::Experts`). On every MoE fixture (stacked quantized experts, raw Qwen3.5-MoE's
//! fused gate-and-up stacks, one tensor per expert), each share of a three-way split gets
//! exactly the rows of those experts that a whole load gets, and reads exactly the whole
//! load's bytes less the other experts' bytes (counted here from the safetensors headers).

mod common;

use qwen_gdn_collective::split_experts;
use qwen_gdn_model::weights::{Checkpoint, Matrix};
use qwen_gdn_model::{Config, ModelPart};
use safetensors::SafeTensors;
use std::ops::Range;
use std::path::Path;

const PROJECTIONS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// Every MoE block's expert stacks, as the MoE loader asks for them.
fn expert_stacks(ckpt: &Checkpoint, cfg: &Config) -> Vec<Matrix> {
    let (e, im, h) = (cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size);
    let mut out = vec![];
    for i in 0..cfg.num_hidden_layers {
        let mlp = format!("model.layers.{i}.mlp");
        if !ckpt.contains(&format!("{mlp}.gate.weight")) {
            continue; // a dense layer
        }
        for proj in PROJECTIONS {
            let (rows, cols) = if proj == "down_proj" {
                (h, im)
            } else {
                (im, h)
            };
            out.push(
                ckpt.experts(&mlp, proj, e, rows, cols, cfg)
                    .unwrap_or_else(|err| panic!("{mlp}.{proj}: {err:#}")),
            );
        }
    }
    out
}

/// The bytes of the experts outside `share`, from the checkpoint's headers alone: a stacked
/// tensor's rows of the other experts, and the other experts' own tensors, as many times as
/// the loader reads them.
fn other_experts_bytes(dir: &Path, experts: usize, share: &Range<usize>) -> u64 {
    let raw = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&raw).unwrap();
    let mut bytes = 0;
    for (name, view) in st.tensors() {
        // Raw Qwen3.5-MoE's fused gate-and-up stack is read twice: for the gate and for the up.
        let reads = if name.ends_with(".gate_up_proj") {
            2
        } else {
            1
        };
        let len = view.data().len() as u64 * reads;
        let Some((_, rest)) = name
            .split_once(".experts.")
            .or(name.split_once(".switch_mlp."))
        else {
            continue;
        };
        match rest.split('.').next().and_then(|i| i.parse::<usize>().ok()) {
            Some(own) if !share.contains(&own) => bytes += len,
            Some(_) => {}
            None => bytes += len / experts as u64 * (experts - share.len()) as u64,
        }
    }
    bytes
}

fn rows_of(m: &Matrix, expert: usize) -> Vec<Vec<f32>> {
    (0..m.rows())
        .map(|r| {
            let mut out = vec![0f32; m.cols()];
            m.row_into(expert, r, &mut out);
            out
        })
        .collect()
}

#[test]
fn each_share_reads_its_own_experts_and_nothing_of_the_others() {
    let mut checked = 0;
    for name in common::CHECKPOINTS.iter().chain(&common::QWEN4_EXP) {
        let dir = common::models_dir().join(name);
        let cfg = Config::from_dir(&dir).unwrap();
        if cfg.num_experts == 0 {
            continue;
        }
        let whole = Checkpoint::open(&dir, &cfg).unwrap();
        let all = expert_stacks(&whole, &cfg);
        assert!(!all.is_empty(), "{name}: no MoE block found");
        let whole_read = whole.bytes_read();
        for share in split_experts(cfg.num_experts, 3).unwrap() {
            let mut part = Checkpoint::open(&dir, &cfg).unwrap();
            part.restrict_to(
                &ModelPart::Experts {
                    share: share.clone(),
                },
                cfg.tie_word_embeddings,
            );
            let mine = expert_stacks(&part, &cfg);
            for (m, w) in mine.iter().zip(&all) {
                assert_eq!(m.experts(), share.len(), "{name}: share {share:?}");
                for (local, global) in share.clone().enumerate() {
                    assert!(
                        rows_of(m, local) == rows_of(w, global),
                        "{name}: share {share:?}: expert {global} differs from the whole load's"
                    );
                }
            }
            let others = other_experts_bytes(&dir, cfg.num_experts, &share);
            assert!(others > 0, "{name}: no other experts' bytes counted");
            assert_eq!(
                part.bytes_read(),
                whole_read - others,
                "{name}: share {share:?} read {} bytes, the whole load's {whole_read} less the \
                 other experts' {others}",
                part.bytes_read()
            );
        }
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} MoE fixtures checked");
}
