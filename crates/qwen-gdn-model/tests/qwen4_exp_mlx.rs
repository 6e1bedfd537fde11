//! The mlx-vlm 4-bit layout of `qwen4_exp` (models/qwen4-exp-tiny-4bit, converted by mlx-vlm
//! 0.7.10's own code) against its reference: transformers fp32 on the dequantized weights.
//!
//! - every weight the loaders read, dequantized, is the one transformers ran on (f64 row and
//!   column sums recorded by the generator);
//! - the 4-bit group-32 n-gram tables gathered row by row from the mapped file, and FP8 e4m3
//!   tables (the official checkpoint's format) decoded as mlx decodes them;
//! - each layer (PLE, hyper-connections, GDN, MoE, QSA, lm_head) on transformers' own inputs;
//! - the errors a broken table gives.

mod common;

use candle_core::{DType, Device, Tensor};
use common::qwen4_exp::Fixture;
use common::{models_dir, rel_max_diff, Reference};
use qwen_gdn_model::config::qwen4_exp::PleConfig;
use qwen_gdn_model::config::LayerKind;
use qwen_gdn_model::families::qwen4_exp::hyper_connection::HyperConnection;
use qwen_gdn_model::families::qwen4_exp::ngram_row_format::e4m3_to_f32;
use qwen_gdn_model::families::qwen4_exp::ple::PerLayerEmbedding;
use qwen_gdn_model::families::qwen4_exp::qsa_indexer::QsaIndexer;
use qwen_gdn_model::families::qwen4_exp::{ngram_tables, output_gate};
use qwen_gdn_model::layers::attention::Attention;
use qwen_gdn_model::layers::gdn::GatedDeltaNet;
use qwen_gdn_model::layers::linear::Linear;
use qwen_gdn_model::layers::moe::SparseMoe;
use qwen_gdn_model::weights::{Checkpoint, Matrix};
use qwen_gdn_model::Config;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const NAME: &str = "qwen4-exp-tiny-4bit";

fn fixture() -> PathBuf {
    models_dir().join(NAME)
}

fn open(dir: &Path) -> (Config, Checkpoint) {
    let cfg = Config::from_dir(dir).unwrap();
    let ckpt = Checkpoint::open(dir, &cfg).unwrap();
    (cfg, ckpt)
}

/// The fixture's PLE settings.
fn ple_config(cfg: &Config) -> &PleConfig {
    cfg.qwen4_exp.as_ref().unwrap().ple.as_ref().unwrap()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap()
}

/// `values` (`[rows, cols]` row-major) has the recorded row and column sums of `mlx_name`.
fn assert_sums(r: &Reference, mlx_name: &str, values: &[f32], cols: usize) {
    let want_rows = f64s(r.get(&format!("deq_rows.{mlx_name}")));
    let want_cols = f64s(r.get(&format!("deq_cols.{mlx_name}")));
    assert_eq!(
        (values.len(), cols),
        (want_rows.len() * want_cols.len(), want_cols.len()),
        "{mlx_name}: shape"
    );
    let mut rows = vec![0f64; want_rows.len()];
    let mut col_sums = vec![0f64; cols];
    for (i, row) in values.chunks_exact(cols).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            rows[i] += v as f64;
            col_sums[j] += v as f64;
        }
    }
    for (what, got, want) in [
        ("row", &rows, &want_rows),
        ("column", &col_sums, &want_cols),
    ] {
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-3);
        for (k, (g, w)) in got.iter().zip(want.iter()).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * scale,
                "{mlx_name}: {what} {k} sums to {g}, transformers' weight to {w}"
            );
        }
    }
}

fn matrix_values(m: &Matrix) -> Vec<f32> {
    let (e, rows, cols) = (m.experts(), m.rows(), m.cols());
    let mut out = vec![0f32; e * rows * cols];
    for (i, row) in out.chunks_exact_mut(cols).enumerate() {
        m.row_into(i / rows, i % rows, row);
    }
    out
}

/// The hash constants transformers keeps as buffers (integers: checked by the table locator).
fn is_hash_buffer(name: &str) -> bool {
    name.ends_with("layer_multipliers")
        || name.ends_with("ngram_heads_vocab_sizes")
        || name.ends_with("ngram_heads_offsets")
}

/// Every tensor of the checkpoint, read by the loader function the layers use for it and
/// dequantized, against the weights transformers computed the reference with.
#[test]
fn every_weight_is_what_the_reference_ran_on() {
    let (cfg, ckpt) = open(&fixture());
    assert!(!ckpt.raw_hf, "mlx-vlm layout detected as raw HF");
    let r = Reference::load(NAME);
    let ple_kernel = ple_config(&cfg).conv_kernel;
    let dev = &Device::Cpu;
    let mut checked = BTreeSet::new();
    let (mut quantized, mut matrices) = (0, 0);
    for key in r.0.keys().filter_map(|k| k.strip_prefix("deq_rows.")) {
        if key.starts_with("vision_tower.") || key.contains(".ngram_embedding.shards.") {
            continue; // skipped by the loader / the table test below
        }
        let name = key.strip_prefix("language_model.").unwrap();
        let rows = r.get(&format!("deq_rows.{key}")).dim(0).unwrap();
        let cols = r.get(&format!("deq_cols.{key}")).dim(0).unwrap();
        let module = name.strip_suffix(".weight").unwrap_or(name);
        quantized += usize::from(ckpt.contains(&format!("{module}.scales")));
        matrices += usize::from(
            !name.ends_with("conv1d.weight") && ckpt.shape(name).is_some_and(|s| s.len() > 1),
        );
        let values: Vec<f32> = if let Some((mlp, proj)) = module.split_once(".switch_mlp.") {
            let e = cfg.num_experts;
            let m = ckpt
                .experts(mlp, proj, e, rows / e, cols, &cfg)
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
            matrix_values(&m)
        } else if name.ends_with("conv1d.weight") {
            // Stored [C, K, 1]: the recorded rows are the single values.
            let k = if name.contains(".ple.") {
                ple_kernel
            } else {
                cfg.linear_conv_kernel_dim
            };
            let w = ckpt.conv1d(name, rows / k, k, dev).unwrap();
            w.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        } else if name.ends_with(".q_norm.weight") || name.ends_with(".k_norm.weight") {
            // Zero-centred in this layout too: loaded as 1 + w.
            let w = ckpt.norm(name, cols, dev).unwrap();
            w.to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|v| v - 1.0)
                .collect()
        } else if ckpt.shape(name).is_some_and(|s| s.len() == 1) {
            let w = ckpt.tensor(name, &[cols], dev).unwrap();
            w.to_vec1::<f32>().unwrap()
        } else {
            let m = ckpt
                .matrix(module, rows, cols, &cfg)
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
            matrix_values(&m)
        };
        assert_sums(&r, key, &values, cols);
        checked.insert(name.to_string());
    }
    // Nothing of the checkpoint escaped the comparison.
    let all: BTreeSet<String> = ckpt
        .names()
        .into_iter()
        .filter(|n| !n.ends_with(".scales") && !n.ends_with(".biases") && !is_hash_buffer(n))
        .filter(|n| !n.contains(".ngram_embedding."))
        .collect();
    assert_eq!(checked, all);
    // As in the release: every linear, the embedding and lm_head quantized.
    assert_eq!((quantized, matrices), (84, 84));
}

/// The quantized tables: located (mlx-vlm's shard sizes), 4-bit group 32 as mlx-vlm's
/// fallback makes them, every row gathered from the mapped file equal to the dequantized
/// shards, and ids outside the table refused.
#[test]
fn quantized_ngram_tables_gather_the_dequantized_rows() {
    let (cfg, ckpt) = open(&fixture());
    let r = Reference::load(NAME);
    let ple = cfg.qwen4_exp.as_ref().unwrap().ple.clone().unwrap();
    let width = ple.row_width();
    assert_eq!(width, 32, "row width of the fixture");
    let tables = ngram_tables::locate(&ckpt, &cfg).unwrap();
    assert_eq!(tables.len(), 2);
    for t in &tables {
        assert!(t.quantized, "layer {}", t.layer);
        let sizes: Vec<usize> = t.shards.iter().map(|s| s.1).collect();
        assert_eq!(sizes, vec![171, 171, 170], "mlx-vlm's divmod sizes");
        let table = t.open(&ckpt, width).unwrap();
        let all: Vec<u64> = (0..table.rows).collect();
        let rows = table.gather(&all).unwrap();
        let mut start = 0;
        for (j, &n) in sizes.iter().enumerate() {
            let key = format!(
                "language_model.model.layers.{}.ple.ple_embedding.ngram_embedding.shards.{j}.weight",
                t.layer
            );
            assert_sums(&r, &key, &rows[start * width..(start + n) * width], width);
            start += n;
        }
        // Any order, repeats, both ends of every shard.
        let ids = [511u64, 0, 170, 171, 341, 342, 170, 511];
        let picked = table.gather(&ids).unwrap();
        for (row, &id) in picked.chunks_exact(width).zip(&ids) {
            let at = id as usize * width;
            assert_eq!(row, &rows[at..at + width], "row {id}");
        }
        let e = format!("{:#}", table.gather(&[3, 512]).unwrap_err());
        assert!(
            e.contains("n-gram row 512 outside the table (512 rows)"),
            "{e}"
        );
    }
}

/// A copy of the fixture with tensors dropped (`drop`) and added (`add`).
fn fixture_edited(
    dir: &Path,
    drop: impl Fn(&str) -> bool,
    add: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
) {
    for entry in std::fs::read_dir(fixture()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut kept: Vec<(String, TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(name, _)| !drop(name))
        .collect();
    for (name, dtype, shape, data) in &add {
        kept.push((
            name.clone(),
            TensorView::new(*dtype, shape.clone(), data).unwrap(),
        ));
    }
    safetensors::serialize_to_file(kept, None, &dir.join("model.safetensors")).unwrap();
}

/// [`fixture_edited`] in a fresh folder, opened: the folder (kept while it is used), the
/// config and the checkpoint.
fn open_edited(
    drop: impl Fn(&str) -> bool,
    add: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
) -> (tempfile::TempDir, Config, Checkpoint) {
    let dir = tempfile::tempdir().unwrap();
    fixture_edited(dir.path(), drop, add);
    let (cfg, ckpt) = open(dir.path());
    (dir, cfg, ckpt)
}

/// The official FP8 table format (U8 e4m3 shards and one `weight_scale`), decoded as
/// `mx.from_fp8` decodes every code, times the scale.
#[test]
fn fp8_ngram_tables_are_decoded_and_scaled() {
    let r = Reference::load(NAME);
    let mlx: Vec<f32> = r.get("fp8_e4m3_values").to_vec1().unwrap();
    for (code, &want) in mlx.iter().enumerate() {
        let got = e4m3_to_f32(code as u8);
        assert!(
            got == want || (got.is_nan() && want.is_nan()),
            "e4m3 code {code:#04x}: {got} vs mlx {want}"
        );
    }

    let (cfg, _) = open(&fixture());
    let width = ple_config(&cfg).row_width();
    let prefix = "language_model.model.layers.1.ple.ple_embedding.ngram_embedding";
    // Every finite code, in a pattern that differs per row and column.
    let code = |row: usize, col: usize| -> u8 {
        let c = ((row * 37 + col * 11) % 256) as u8;
        if c & 0x7f == 0x7f {
            0x3c
        } else {
            c
        }
    };
    let scale = 0.375f32;
    let mut add = vec![];
    for (j, rows) in [(0, 200usize), (1, 312)] {
        let data: Vec<u8> = (0..rows * width)
            .map(|i| code(j * 200 + i / width, i % width))
            .collect();
        add.push((
            format!("{prefix}.shards.{j}.weight"),
            Dtype::U8,
            vec![rows, width],
            data,
        ));
    }
    add.push((
        format!("{prefix}.weight_scale"),
        Dtype::F32,
        vec![],
        scale.to_le_bytes().to_vec(),
    ));
    let (_dir, cfg, ckpt) = open_edited(|n| n.starts_with(&format!("{prefix}.shards.")), add);
    let t = ngram_tables::locate(&ckpt, &cfg).unwrap();
    assert!(!t[0].quantized);
    let table = t[0].open(&ckpt, width).unwrap();
    let ids = [0u64, 199, 200, 511, 57];
    let got = table.gather(&ids).unwrap();
    for (row, &id) in got.chunks_exact(width).zip(&ids) {
        for (col, &v) in row.iter().enumerate() {
            let want = mlx[code(id as usize, col) as usize] * scale;
            assert_eq!(v, want, "row {id} col {col}");
        }
    }

    // FP8 shards without their scale.
    let (_dir, cfg, ckpt) = open_edited(
        |n| n.starts_with(&format!("{prefix}.shards.")),
        vec![(
            format!("{prefix}.shards.0.weight"),
            Dtype::U8,
            vec![512, width],
            vec![0; 512 * width],
        )],
    );
    let t = ngram_tables::locate(&ckpt, &cfg).unwrap();
    let e = format!("{:#}", t[0].open(&ckpt, width).unwrap_err());
    assert!(
        e.contains("is U8 (FP8)") && e.contains("weight_scale"),
        "{e}"
    );
}

/// Broken tables: one line naming the file and the key.
#[test]
fn broken_tables_give_one_line_errors() {
    // No table for layer 3: the key as mlx-vlm spells it, in the file holding layer 3's PLE.
    let (_dir, cfg, ckpt) = open_edited(
        |n| n.contains("layers.3.ple.ple_embedding.ngram_embedding"),
        vec![],
    );
    let e = format!("{:#}", ngram_tables::locate(&ckpt, &cfg).unwrap_err());
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("model.safetensors: qwen4_exp layer 3"), "{e}");
    assert!(
        e.contains("no n-gram table")
            && e.contains(
                "`language_model.model.layers.3.ple.ple_embedding.ngram_embedding.shards.0.weight`"
            ),
        "{e}"
    );

    // A quantized shard without its biases.
    let (_dir, cfg, ckpt) = open_edited(
        |n| n.ends_with("layers.1.ple.ple_embedding.ngram_embedding.shards.1.biases"),
        vec![],
    );
    let t = ngram_tables::locate(&ckpt, &cfg).unwrap();
    let e = format!("{:#}", t[0].open(&ckpt, 32).unwrap_err());
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("model.safetensors: n-gram table `language_model.model.layers.1.ple.ple_embedding.ngram_embedding.shards.1.weight` is quantized but has no `biases`"),
        "{e}"
    );

    // config.json declares another format for a shard than the file holds.
    let dir = tempfile::tempdir().unwrap();
    fixture_edited(dir.path(), |_| false, vec![]);
    let path = dir.path().join("config.json");
    let mut j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let shard = "language_model.model.layers.3.ple.ple_embedding.ngram_embedding.shards.2";
    j["quantization"][shard]["bits"] = 8.into();
    std::fs::write(&path, j.to_string()).unwrap();
    let (cfg, ckpt) = open(dir.path());
    let e = format!("{:#}", ngram_tables::locate(&ckpt, &cfg).unwrap_err());
    assert!(
        e.contains(&format!("n-gram table `{shard}.weight`: stored as 4-bit group 32, but config.json declares 8-bit group 32")),
        "{e}"
    );

    // Scales of another group size than the packed rows allow.
    let name = "language_model.model.layers.1.ple.ple_embedding.ngram_embedding.shards.0";
    let bf16_ones =
        |n: usize| -> Vec<u8> { (0..n).flat_map(|_| half::bf16::ONE.to_le_bytes()).collect() };
    let (_dir, cfg, ckpt) = open_edited(
        |n| n == format!("{name}.scales") || n == format!("{name}.biases"),
        vec![
            (
                format!("{name}.scales"),
                Dtype::BF16,
                vec![171, 3],
                bf16_ones(171 * 3),
            ),
            (
                format!("{name}.biases"),
                Dtype::BF16,
                vec![171, 3],
                bf16_ones(171 * 3),
            ),
        ],
    );
    let e = format!("{:#}", ngram_tables::locate(&ckpt, &cfg).unwrap_err());
    assert!(e.contains("do not fit 32-wide rows"), "{e}");
}

common::qwen4_exp::layer_gates! { NAME;
    /// Both PLE blocks on transformers' input streams, whole and in chunks, with their rows
    /// gathered from the 4-bit tables.
    per_layer_embeddings_match_transformers => per_layer_embeddings_match,
    /// Every hyper-connection (4-bit down/up/inject projections), the final mixer and the
    /// 4-bit lm_head, on transformers' inputs.
    hyper_connections_and_lm_head_match_transformers => hyper_connections_and_lm_head_match,
    /// The GDN mixers (4-bit projections, [C, K, 1] conv, sigmoid output gate).
    gdn_mixers_match_transformers => gdn_mixers_match,
    /// The MoE blocks: stacked 4-bit experts, 8-bit router and shared-expert gate.
    moe_blocks_match_transformers => moe_blocks_match,
}

/// The QSA layer: the indexer's selection for every query, and the attention output whole
/// and step by step (zero-centred q/k norms loaded as 1 + w in this layout too).
#[test]
fn qsa_attention_matches_transformers() {
    Fixture::open(NAME).qsa_attention_matches();
}

/// The fused decode step's QSA selection on the device: transformers' selection for every
/// query after a 5-token prefill, with no read-back.
#[test]
fn qsa_device_selection_matches_transformers() {
    // Positions 5..90 on the device, sparse from position 11 on.
    let sparse = Fixture::open(NAME).qsa_device_selection_matches();
    assert!(sparse >= 79, "only {sparse} sparse queries");
}

/// Loading every part of the model the way `Model::load` will (each layer's loaders, the
/// 4-bit embedding, lm_head, the tables) uses every tensor of the checkpoint: only the vision
/// tower is left, as a warning, so the leftover check of `Model::load` will pass. The
/// embedding's rows are transformers' `tf_embed` (repeated over the streams).
#[test]
fn loading_every_layer_uses_every_tensor() {
    let (cfg, ckpt) = open(&fixture());
    let r = Reference::load(NAME);
    let (h, l) = (cfg.hidden_size, cfg.num_hidden_layers);
    for i in 0..l {
        let p = format!("model.layers.{i}");
        for hc in ["attn_hyper_connection", "mlp_hyper_connection"] {
            HyperConnection::load(&ckpt, &format!("{p}.{hc}"), &cfg, true).unwrap();
        }
        match cfg.layer_kind(i) {
            LayerKind::LinearAttention => {
                GatedDeltaNet::load(&ckpt, &format!("{p}.linear_attn"), &cfg, output_gate(&cfg))
                    .unwrap();
            }
            LayerKind::FullAttention => {
                Attention::load(&ckpt, &format!("{p}.self_attn"), &cfg).unwrap();
                QsaIndexer::load(&ckpt, &format!("{p}.self_attn"), &cfg).unwrap();
            }
        }
        SparseMoe::load(&ckpt, &format!("{p}.mlp"), &cfg).unwrap();
    }
    for table in ngram_tables::locate(&ckpt, &cfg).unwrap() {
        PerLayerEmbedding::load(&ckpt, &table, &cfg).unwrap();
    }
    HyperConnection::load(&ckpt, "model.hyper_connection_mixer", &cfg, false).unwrap();
    Linear::load(&ckpt, "lm_head", cfg.vocab_size, h, &cfg).unwrap();
    let embed = ckpt
        .matrix("model.embed_tokens", cfg.vocab_size, h, &cfg)
        .unwrap();
    assert!(matches!(embed, Matrix::Affine(_)), "4-bit embedding");
    let ids = r.ids("tf_ids");
    let want = r.get("tf_embed").narrow(1, 0, h).unwrap();
    let mut rows = vec![0f32; ids.len() * h];
    for (row, &id) in rows.chunks_exact_mut(h).zip(&ids) {
        embed.row_into(0, id as usize, row);
    }
    let got = Tensor::from_vec(rows, (ids.len(), h), &Device::Cpu).unwrap();
    assert_eq!(rel_max_diff(&got, &want), 0.0, "embedding rows");
    let note = ckpt
        .leftovers()
        .unwrap()
        .expect("the vision tower is skipped");
    assert!(
        note.ends_with("ignoring tensors the text model does not use: 1 vision tower"),
        "{note}"
    );
}
