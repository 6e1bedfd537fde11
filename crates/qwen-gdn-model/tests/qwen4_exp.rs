//! `qwen4_exp` (Qwen3.8-Flash-Next) against its fixture, models/qwen4-exp-tiny-hf, and its
//! transformers fp32 reference: the config, the n-gram hash, the n-gram table check, every
//! layer on transformers' own inputs, and the errors a broken config or checkpoint gives.
//! The whole model's gates (logits, argmaxes, 32 greedy tokens, decode step by step across
//! the QSA budget, bf16 GDN states, the device plan in f32 and bf16) run on both fixtures:
//! this one (`raw_hf::*`) and the mlx-vlm 4-bit layout (`mlx_4bit::*`,
//! models/qwen4-exp-tiny-4bit, whose layers are checked in tests/qwen4_exp_mlx.rs).

mod common;

use candle_core::Device;
use common::qwen4_exp::Fixture;
use common::{argmax_rows, greedy, kl_and_top1, models_dir, rel_max_diff, Reference};
use qwen_gdn_model::config::qwen4_exp::{OutputGate, Qwen4LayerType};
use qwen_gdn_model::config::LayerKind;
use qwen_gdn_model::families::qwen4_exp::ngram_hash::NgramHash;
use qwen_gdn_model::families::qwen4_exp::ngram_tables;
use qwen_gdn_model::weights::Checkpoint;
use qwen_gdn_model::{Config, Model, Plan, StateDtype};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::path::{Path, PathBuf};

const NAME: &str = "qwen4-exp-tiny-hf";

fn fixture() -> PathBuf {
    models_dir().join(NAME)
}

fn config_json() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap()).unwrap()
}

fn parse(j: &Value) -> anyhow::Result<Config> {
    Config::from_json_str(&j.to_string(), "config.json")
}

fn parse_err(j: &Value) -> String {
    format!("{:#}", parse(j).unwrap_err())
}

/// A tensor of a safetensors file as little-endian i64 / i32 values.
fn ints(st: &SafeTensors, name: &str) -> Vec<i64> {
    let t = st.tensor(name).unwrap();
    match t.dtype() {
        Dtype::I64 => t
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        Dtype::I32 => t
            .data()
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as i64)
            .collect(),
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn config_of_the_fixture() {
    let cfg = Config::from_dir(&fixture()).unwrap();
    let q = cfg.qwen4_exp.as_ref().expect("qwen4_exp part");
    use Qwen4LayerType::*;
    assert_eq!(
        q.layer_types,
        [
            LinearAttention,
            LinearAttention,
            IndexedAttention,
            LinearAttention
        ]
    );
    assert_eq!(cfg.layer_kind(2), LayerKind::FullAttention);
    assert_eq!(cfg.layer_kind(3), LayerKind::LinearAttention);
    assert_eq!((q.hc_count, q.hc_lowrank), (4, 32));
    assert_eq!(q.output_gate, OutputGate::Sigmoid);
    let qsa = q.qsa.unwrap();
    assert_eq!(
        (qsa.n_heads, qsa.head_dim, qsa.budget, qsa.compress_ratio),
        (2, 16, 8, 4)
    );
    assert_eq!(qsa.block_topk(), 2);
    let ple = q.ple.as_ref().unwrap();
    assert_eq!(ple.layers, vec![1, 3], "one-based ple_layer_ids [2, 4]");
    assert_eq!(
        (ple.heads(), ple.row_width(), ple.eos_token_id),
        (4, 16, 1986)
    );
    assert!(q.unknown_fields.is_empty(), "{:?}", q.unknown_fields);
    assert_eq!(
        (cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok),
        (64, 4, 2)
    );
}

#[test]
fn ngram_ids_match_transformers() {
    let cfg = Config::from_dir(&fixture()).unwrap();
    let ple = cfg.qwen4_exp.as_ref().unwrap().ple.clone().unwrap();
    let reference =
        std::fs::read(models_dir().join(format!("reference/{NAME}.safetensors"))).unwrap();
    let reference = SafeTensors::deserialize(&reference).unwrap();
    let weights = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let weights = SafeTensors::deserialize(&weights).unwrap();
    let tokens: Vec<u32> = ints(&reference, "tf_ids")
        .iter()
        .map(|&t| t as u32)
        .collect();
    assert!(
        tokens[1..].contains(&ple.eos_token_id),
        "the prompt must cross an eos"
    );
    for (p, &layer) in ple.layers.iter().enumerate() {
        let hash = NgramHash::new(&ple, p, cfg.vocab_size);
        // The constants transformers saved as buffers.
        let buf = |what: &str| {
            ints(
                &weights,
                &format!("model.language_model.layers.{layer}.ple.ple_embedding.{what}"),
            )
        };
        let as_i64 = |v: &[u64]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
        assert_eq!(
            buf("layer_multipliers"),
            as_i64(&hash.multipliers),
            "layer {layer}"
        );
        assert_eq!(buf("ngram_heads_vocab_sizes"), as_i64(&hash.head_sizes));
        assert_eq!(buf("ngram_heads_offsets"), as_i64(&hash.head_offsets));
        // The rows transformers gathered for every position of the prompt...
        let want = ints(&reference, &format!("ple_ngram_ids.{layer}"));
        let (whole, _) = hash.ids(&hash.initial_context(), &tokens);
        assert_eq!(as_i64(&whole), want, "layer {layer}: whole prompt");
        // ...and token by token with the carried context, as decode computes them.
        let mut ctx = hash.initial_context();
        let mut stepped = vec![];
        for &t in &tokens {
            let (ids, next) = hash.ids(&ctx, &[t]);
            stepped.extend(ids);
            ctx = next;
        }
        assert_eq!(as_i64(&stepped), want, "layer {layer}: token by token");
    }
}

#[test]
fn ngram_tables_are_located_with_their_uneven_shards() {
    let cfg = Config::from_dir(&fixture()).unwrap();
    let ckpt = Checkpoint::open(&fixture(), &cfg).unwrap();
    let tables = ngram_tables::locate(&ckpt, &cfg).unwrap();
    assert_eq!(tables.len(), 2);
    for t in &tables {
        let rows: Vec<usize> = t.shards.iter().map(|s| s.1).collect();
        assert_eq!(
            rows,
            vec![171, 171, 170],
            "torch.chunk sizes, layer {}",
            t.layer
        );
        assert_eq!(t.rows, 512);
        assert!(!t.quantized);
    }
}

/// A copy of the fixture whose model.safetensors lacks the tensors `drop` selects.
fn fixture_without(dir: &Path, drop: impl Fn(&str) -> bool) {
    for entry in std::fs::read_dir(fixture()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(name, _)| !drop(name))
        .collect();
    safetensors::serialize_to_file(kept, None, &dir.join("model.safetensors")).unwrap();
}

fn load_error(dir: &Path) -> String {
    match Model::load(dir, &Device::Cpu, &common::run_options()) {
        Ok(_) => panic!("{}: loaded", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

/// The whole fixture in a temp dir, its config.json with `text_config.<key>` = `value`.
fn fixture_with_text_config(key: &str, value: serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fixture_without(dir.path(), |_| false);
    let mut j = config_json();
    j["text_config"][key] = value;
    std::fs::write(dir.path().join("config.json"), j.to_string()).unwrap();
    dir
}

#[test]
fn broken_checkpoints_give_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    fixture_without(dir.path(), |n| {
        n.contains("layers.3.ple.ple_embedding.ngram_embedding")
    });
    let e = load_error(dir.path());
    assert!(
        e.contains("layer 3") && e.contains("no n-gram table") && e.contains("shard_0.weight"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");

    // A config whose hash seed is not the checkpoint's: the saved multipliers disagree.
    let dir = fixture_with_text_config("seed", 1235.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("layer_multipliers") && e.contains("another n-gram hashing"),
        "{e}"
    );

    let dir = tempfile::tempdir().unwrap();
    fixture_without(dir.path(), |n| {
        n.ends_with("layers.1.ple.ple_embedding.ngram_embedding.shard_1.weight")
    });
    let e = load_error(dir.path());
    assert!(e.contains("lacks shard 1"), "{e}");

    // A QSA budget the context can never reach: refused at load, naming the file and field.
    let dir = fixture_with_text_config("indexer_budget", 8192.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("config.json")
            && e.contains("`indexer_budget` = 8192 is larger than the context"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
}

/// Fields a later release may add are ignored (the notice is checked in
/// `config_errors_and_notices`): the model loads and computes the same logits.
#[test]
fn unknown_config_fields_are_ignored_at_load() {
    let dir = fixture_with_text_config("qsa_sink_tokens", 4.into());
    let model = Model::load(dir.path(), &Device::Cpu, &common::run_options()).unwrap();
    let r = Reference::load(NAME);
    let logits = model
        .forward(&r.ids("tf_ids")[..8], &mut model.new_cache())
        .unwrap();
    let want = r.get("tf_logits").narrow(0, 0, 8).unwrap();
    assert!(rel_max_diff(&logits, &want) <= 1e-3);
}

// ---- The end-to-end gates, one function per gate over the fixture's name, run on both
// fixtures (`raw_hf`: models/qwen4-exp-tiny-hf, `mlx_4bit`: models/qwen4-exp-tiny-4bit, whose
// reference is transformers on its dequantized weights). The device-plan gates run on the
// GPU with `QWEN_GDN_TEST_DEVICE=cuda` (scripts/gpu/test-cuda.sh runs `qwen4_exp device_plan`).

/// Prefill of `first` tokens, then one token per call: every position's logits.
fn stepped(model: &Model, tokens: &[u32], first: usize) -> candle_core::Tensor {
    let mut cache = model.new_cache();
    let mut rows = vec![model.forward(&tokens[..first], &mut cache).unwrap()];
    for &t in &tokens[first..] {
        rows.push(model.forward_last(&[t], &mut cache).unwrap());
    }
    assert_eq!(cache.offset, tokens.len());
    candle_core::Tensor::cat(&rows, 0)
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap()
}

/// The whole prompt in one forward: logits within 1e-3 of max|logit| and every argmax.
/// Only the parts a text model skips by design are left over (the raw HF fixture has one
/// vision and one MTP tensor, mlx-vlm drops the MTP tensor); every n-gram shard and hash
/// buffer is used.
fn whole_forward_matches_transformers(name: &str) {
    let model = common::load(name);
    let warnings = model.load_warnings().join("\n");
    assert!(
        warnings.contains("1 vision tower")
            && !warnings.contains("ngram")
            && warnings.lines().count() == 1,
        "{name}: {warnings}"
    );
    let r = Reference::load(name);
    let tokens = r.ids("tf_ids");
    let logits = model.forward(&tokens, &mut model.new_cache()).unwrap();
    let want = r.get("tf_logits");
    let d = rel_max_diff(&logits, want);
    eprintln!("{name}: logits rel diff {d:e}");
    assert!(d <= 1e-3, "{name}: logits: {d:e} of max|logit|");
    assert_eq!(argmax_rows(&logits), argmax_rows(want), "{name}: argmaxes");
}

/// transformers' greedy tokens (prompt prefilled, then one token per call).
fn greedy_tokens_match_transformers(name: &str) {
    let model = common::load(name);
    let r = Reference::load(name);
    let want = r.ids("greedy_ids");
    assert_eq!(want.len(), 32);
    assert_eq!(
        greedy(&model, &r.ids("greedy_prompt_ids"), 32),
        want,
        "{name}"
    );
}

/// A 5-token prefill then one token per call (transformers' `decode_logits` protocol), and
/// prefill chunks of other sizes: the same logits as the whole forward. The 100-token prompt
/// runs far past the QSA budget (8 tokens: sparse from the 12th token on), through both PLE
/// layers' conv windows and across the `<|im_end|>` that cuts the n-grams.
fn decode_step_by_step_equals_the_whole_forward(name: &str) {
    let model = common::load(name);
    let r = Reference::load(name);
    let tokens = r.ids("tf_ids");
    let budget = model
        .config()
        .qwen4_exp
        .as_ref()
        .and_then(|q| q.qsa)
        .unwrap()
        .budget;
    assert!(
        tokens.len() > 10 * budget,
        "{name}: the prompt must cross the QSA budget"
    );
    let whole = model.forward(&tokens, &mut model.new_cache()).unwrap();
    for first in [5usize, 1, 13, 64] {
        let steps = stepped(&model, &tokens, first);
        let d = rel_max_diff(&steps, &whole);
        assert!(
            d <= 1e-4,
            "{name}: prefill {first} then steps vs whole: {d:e}"
        );
        if first == 5 {
            let d = rel_max_diff(&steps, r.get("decode_logits"));
            assert!(d <= 1e-3, "{name}: vs transformers' decode_logits: {d:e}");
            assert_eq!(argmax_rows(&steps), argmax_rows(r.get("decode_logits")));
        }
    }
    // Chunked prefill through `prefill` (no logits), then the last token.
    let mut cache = model.new_cache();
    model
        .prefill(&tokens[..tokens.len() - 1], &mut cache, 7)
        .unwrap();
    let last = model
        .forward_last(&tokens[tokens.len() - 1..], &mut cache)
        .unwrap();
    let want = whole.narrow(0, tokens.len() - 1, 1).unwrap();
    assert!(
        rel_max_diff(&last, &want) <= 1e-4,
        "{name}: chunked prefill"
    );
}

/// GDN recurrent states stored in bf16 (opt-in): close to the f32 run by its KL gate.
fn bf16_gdn_states_stay_close(name: &str) {
    let model = common::load(name);
    let r = Reference::load(name);
    let tokens = r.ids("tf_ids");
    let stepped = |dtype| {
        let mut cache = model.new_cache_with(dtype);
        let mut rows = vec![model.forward(&tokens[..5], &mut cache).unwrap()];
        for &t in &tokens[5..] {
            rows.push(model.forward(&[t], &mut cache).unwrap());
        }
        candle_core::Tensor::cat(&rows, 0).unwrap()
    };
    let (bf16, f32) = (stepped(StateDtype::Bf16), stepped(StateDtype::F32));
    let (kl, top1) = kl_and_top1(&bf16, r.get("tf_logits"));
    eprintln!("{name}: bf16 GDN states: KL {kl:.2e}, top-1 {top1:.3}");
    assert!(kl < 1e-3 && top1 >= 0.95, "{name}: kl {kl:e}, top-1 {top1}");
    let d = rel_max_diff(&bf16, &f32);
    assert!(
        d > 1e-6,
        "{name}: bf16 states gave the f32 logits ({d:e}): not rounded"
    );
}

/// The device plan in f32 (composed ops on the device; the CPU here, a GPU with
/// `QWEN_GDN_TEST_DEVICE=cuda`): the same gates as the reference plan.
fn device_plan_f32_matches_transformers(name: &str) {
    let model = common::load_device_plan(name, candle_core::DType::F32);
    assert_eq!(model.plan(), Plan::Device);
    // Its decode steps (`stepped`, `greedy`) run the fused GDN mixers and MoE blocks.
    assert!(model.fused_decode());
    let r = Reference::load(name);
    let tokens = r.ids("tf_ids");
    let whole = model
        .forward(&tokens, &mut model.new_cache())
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap();
    let d = rel_max_diff(&whole, r.get("tf_logits"));
    eprintln!("{name}: device plan f32 logits rel diff {d:e}");
    assert!(d <= 1e-3, "{name}: logits: {d:e} of max|logit|");
    assert_eq!(
        argmax_rows(&whole),
        argmax_rows(r.get("tf_logits")),
        "{name}"
    );
    let d = rel_max_diff(&stepped(&model, &tokens, 5), &whole);
    assert!(d <= 1e-4, "{name}: steps vs whole: {d:e}");
    assert_eq!(
        greedy(&model, &r.ids("greedy_prompt_ids"), 32),
        r.ids("greedy_ids"),
        "{name}"
    );
}

/// The fused decode step (GDN mixers, MoE blocks and every hyper-connection with the final
/// mixer on the fused kernels' CPU twins) against the composed step it replaces, in f32:
/// token by token from an empty cache and after a prefill, logits within 1e-4 of max|logit|
/// with every argmax, and the same greedy tokens. Every MoE block where the experts are
/// stacked is covered (all of the quantized fixture's), so the kernels are what is compared
/// there. Each hyper-connection's fused parts (norm, mixing, injection with the next norm)
/// are also compared with its composed forward and injection on the fixture's own weights.
fn fused_decode_matches_composed(name: &str) {
    let mut model = common::load_device_plan(name, candle_core::DType::F32);
    assert!(model.fused_decode());
    let decoder = model.qwen4_exp().unwrap();
    assert!(decoder.fused_hyper_connections(), "{name}");
    hyper_connections_fused_match_composed(name, decoder);
    let coverage = model.fused_coverage_per_layer();
    assert_eq!(coverage.len(), decoder.layers.len());
    for (i, (layer, c)) in decoder.layers.iter().zip(coverage).enumerate() {
        let gdn = matches!(
            layer.mixer,
            qwen_gdn_model::families::qwen4_exp::Qwen4Mixer::Gdn(_)
        );
        // A QSA mixer always runs its fused part (the selection on the device); the
        // fixture's GDN head dims (16) are outside the kernels' coverage (multiples of 32), so
        // its GDN mixers run composed here: the fused GDN arm, with each output gate, is
        // tested in `layers::gdn::decode`.
        assert_eq!(c.mixer, !gdn, "{name}: layer {i}: {c:?}");
        assert_eq!(
            c.feed_forward,
            layer.moe.stacked().is_some(),
            "{name}: layer {i}: {c:?}"
        );
    }
    if name.contains("4bit") {
        assert!(
            coverage.iter().all(|c| c.feed_forward),
            "{name}: {coverage:?}"
        );
    }
    let qsa_layers = decoder
        .layers
        .iter()
        .filter(|l| {
            matches!(
                l.mixer,
                qwen_gdn_model::families::qwen4_exp::Qwen4Mixer::Qsa(_)
            )
        })
        .count();
    assert!(qsa_layers > 0);
    let r = Reference::load(name);
    let tokens = r.ids("tf_ids");
    let prompt = r.ids("greedy_prompt_ids");
    // The prompts run past the QSA budget, so that the selection drops blocks.
    let budget = model
        .config()
        .qwen4_exp
        .as_ref()
        .unwrap()
        .qsa
        .unwrap()
        .budget;
    assert!(tokens.len() > 4 * budget && prompt.len() + 16 > budget + 8);
    // Host read-backs of the decode steps from an empty cache (`step_by_step`; the logits
    // are not read inside the step).
    let run = |model: &Model| {
        let before = gdn_ops::launches::read_backs();
        let steps = common::step_by_step(model, &tokens);
        let read_backs = gdn_ops::launches::read_backs() - before;
        (
            steps.to_device(&Device::Cpu).unwrap(),
            stepped(model, &tokens, 5),
            greedy(model, &prompt, 16),
            read_backs,
        )
    };
    let fused = run(&model);
    model.set_fused_decode(false);
    assert!(!model.fused_decode());
    assert!(!model.qwen4_exp().unwrap().fused_hyper_connections());
    let composed = run(&model);
    eprintln!(
        "{name}: read-backs over {} decode steps: {} fused, {} composed",
        tokens.len(),
        fused.3,
        composed.3
    );
    assert_eq!(fused.3, 0, "{name}: the fused step read back");
    assert_eq!(
        composed.3,
        qsa_layers * tokens.len(),
        "{name}: the composed step reads the indexer's projection back once a QSA layer"
    );
    for (what, f, c) in [
        ("from empty", &fused.0, &composed.0),
        ("after a prefill of 5", &fused.1, &composed.1),
    ] {
        let d = rel_max_diff(f, c);
        eprintln!("{name}: fused vs composed decode, {what}: {d:e}");
        assert!(
            d <= 1e-4,
            "{name}: {what}: fused differs from composed by {d:e}"
        );
        assert_eq!(argmax_rows(f), argmax_rows(c), "{name}: {what}");
    }
    assert_eq!(fused.2, composed.2, "{name}: greedy tokens");
}

/// Every hyper-connection of `decoder` (and the final mixer) on random streams, fused
/// (`normed`, `mix_normed`, `inject_normed`: the `hyper_connection` kernels' CPU twins between
/// the products) against composed (`forward`, `inject`), in the decoder's dtype (f32): the
/// block input, the injected streams and the next norm within 1e-5 of their max.
fn hyper_connections_fused_match_composed(
    name: &str,
    decoder: &qwen_gdn_model::families::qwen4_exp::Qwen4ExpDecoder,
) {
    use qwen_gdn_model::families::qwen4_exp::hyper_connection::HyperConnection;
    let hc0 = &decoder.layers[0].attn_hc;
    let (s, h) = (hc0.streams, hc0.hidden);
    let dev = hc0.norm.weight.device().clone();
    let hs = candle_core::Tensor::randn(0f32, 1.0, (1, s * h), &dev).unwrap();
    let y = candle_core::Tensor::randn(0f32, 2.0, (1, h), &dev).unwrap();
    let hcs = decoder
        .layers
        .iter()
        .flat_map(|l| [&l.attn_hc, &l.mlp_hc])
        .chain([&decoder.final_mixer]);
    let nexts = decoder
        .layers
        .iter()
        .flat_map(|l| [&l.attn_hc, &l.mlp_hc])
        .skip(1)
        .chain([&decoder.final_mixer]);
    for (k, (hc, next)) in hcs.zip(nexts.map(Some).chain([None])).enumerate() {
        let (want_x, want_w) = hc.forward(&hs).unwrap();
        let n = hc.normed(&hs).unwrap();
        let (x, g) = hc.mix_normed(&n).unwrap();
        let d = rel_max_diff(&x, &want_x);
        assert!(
            d <= 1e-5,
            "{name}: hyper-connection {k}: mixing off by {d:e}"
        );
        let (Some(w), Some(g)) = (want_w, g) else {
            assert!(!hc.has_inject(), "{name}: hyper-connection {k}: no gate");
            continue;
        };
        let want = HyperConnection::inject(&hs, &y, &w).unwrap();
        let (sum, normed) = HyperConnection::inject_normed(&hs, &y, &g, next).unwrap();
        let d = rel_max_diff(&sum, &want);
        assert!(
            d <= 1e-5,
            "{name}: hyper-connection {k}: injection off by {d:e}"
        );
        if let (Some(next), Some(normed)) = (next, normed) {
            let want = next.norm.forward(&want).unwrap();
            let d = rel_max_diff(&normed, &want);
            assert!(
                d <= 1e-5,
                "{name}: hyper-connection {k}: next norm off by {d:e}"
            );
        }
    }
}

/// The device plan in bf16 activations: within the KL gate the other families' fixtures
/// use when no bf16 reference is recorded, whole and step by step.
fn device_plan_bf16_within_kl_gate(name: &str) {
    let model = common::load_device_plan(name, candle_core::DType::BF16);
    let r = Reference::load(name);
    let tokens = r.ids("tf_ids");
    let whole = model.forward(&tokens, &mut model.new_cache()).unwrap();
    for (what, got) in [("whole", whole), ("steps", stepped(&model, &tokens, 5))] {
        let (kl, top1) = kl_and_top1(&got, r.get("tf_logits"));
        eprintln!("{name}: device plan bf16 {what}: KL {kl:.2e}, top-1 {top1:.3}");
        assert!(
            kl <= 0.05 && top1 >= 0.90,
            "{name}: {what}: KL {kl:e}, top-1 {top1}"
        );
    }
}

macro_rules! gates_per_fixture {
    ($($fixture:ident => $name:literal),* $(,)?) => {
        /// Every `qwen4_exp` fixture is gated here.
        #[test]
        fn every_fixture_is_gated() {
            assert_eq!([$($name),*], common::QWEN4_EXP);
        }
        $(gates_per_fixture!(@gates $fixture $name
            whole_forward_matches_transformers
            greedy_tokens_match_transformers
            decode_step_by_step_equals_the_whole_forward
            bf16_gdn_states_stay_close
            device_plan_f32_matches_transformers
            fused_decode_matches_composed
            device_plan_bf16_within_kl_gate
        );)*
    };
    (@gates $fixture:ident $name:literal $($gate:ident)*) => {
        mod $fixture {
            $(#[test]
            fn $gate() {
                super::$gate($name)
            })*
        }
    };
}

gates_per_fixture! {
    raw_hf => "qwen4-exp-tiny-hf",
    mlx_4bit => "qwen4-exp-tiny-4bit",
}

#[test]
fn config_errors_and_notices() {
    // config.json with `text_config.<key>` set to `value`, or removed for `None`.
    let with = |key: &str, value: Option<serde_json::Value>| {
        let mut j = config_json();
        let text_config = j["text_config"].as_object_mut().unwrap();
        match value {
            Some(v) => text_config.insert(key.to_string(), v),
            None => text_config.remove(key),
        };
        j
    };
    for (key, value, needle) in [
        // max_position_embeddings is 4096.
        (
            "indexer_budget",
            Some(8192.into()),
            "`indexer_budget` = 8192 is larger than the context",
        ),
        (
            "indexer_budget",
            Some(10.into()),
            "multiple of indexer_compress_ratio",
        ),
        (
            "indexer_head_dim",
            None,
            "missing required key `indexer_head_dim`",
        ),
        (
            "ple_layer_ids",
            Some(serde_json::json!([3])),
            "entry 3 is an attention layer",
        ),
        ("ple_embed_dim", Some(66.into()), "`ple_embed_dim` = 66"),
        (
            "ple_storage",
            Some(serde_json::json!({"manifest": "tables.json"})),
            "`ple_storage` (n-gram tables in external files",
        ),
        (
            "output_gate_type",
            Some("gelu".into()),
            "output gate activation `gelu`",
        ),
        (
            "layer_types",
            Some(serde_json::json!([
                "linear_attention",
                "mamba",
                "full_attention",
                "linear_attention"
            ])),
            "`layer_types[1]`",
        ),
        ("hc_count", Some(1.into()), "`hc_count` = 1"),
    ] {
        let e = parse_err(&with(key, value));
        assert!(e.contains(needle), "{key}: {e}");
    }

    let mut j = with("eos_token_id", None);
    j.as_object_mut().unwrap().remove("eos_token_id");
    assert!(parse_err(&j).contains("`eos_token_id` is required"));

    // Without output_gate_type the gate follows hidden_act (transformers).
    let mut j = config_json();
    j["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("output_gate_type");
    let q = parse(&j).unwrap().qwen4_exp.unwrap();
    assert_eq!(q.output_gate, OutputGate::Silu);

    // Future fields: ignored, named in one line.
    let mut j = config_json();
    j["text_config"]["qsa_sink_tokens"] = 4.into();
    j["text_config"]["hc_dynamic"] = true.into();
    let q = parse(&j).unwrap().qwen4_exp.unwrap();
    let note = q.unknown_fields_notice("config.json").unwrap();
    assert_eq!(
        note,
        "note: config.json: ignoring qwen4_exp config fields this version does not know: hc_dynamic, qsa_sink_tokens"
    );
}

common::qwen4_exp::layer_gates! { NAME;
    /// Every hyper-connection of the fixture, fed transformers' own inputs: the mixed inputs
    /// and gates of each layer, the residual updates that rebuild each layer's output from its
    /// mixer and MoE outputs, and the final mixer + lm_head against the logits.
    hyper_connections_match_transformers => hyper_connections_and_lm_head_match,
    /// Both PLE blocks of the fixture on transformers' input streams, over the whole prompt and
    /// in chunks (the carried n-gram context and conv window), against transformers' PLE term.
    per_layer_embeddings_match_transformers => per_layer_embeddings_match,
    /// The GDN mixers (Qwen3.5's, here with the sigmoid output gate) on transformers' inputs.
    gdn_mixers_with_the_sigmoid_gate_match_transformers => gdn_mixers_match,
    /// The MoE blocks (Qwen3.5-MoE's, loaded from per-expert tensors) on transformers' inputs.
    moe_blocks_from_per_expert_tensors_match_transformers => moe_blocks_match,
}

/// The QSA attention layer on transformers' input: the indexer's token selection for every
/// query (sparse from the 12th token on), the attention output over the whole prompt, and
/// the same output from a 5-token prefill followed by one token per call.
#[test]
fn qsa_attention_matches_transformers() {
    let visible = Fixture::open(NAME).qsa_attention_matches();
    let sparse = (visible.iter().enumerate())
        .filter(|(t, got)| got.iter().filter(|&&o| o).count() < t + 1)
        .count();
    assert!(sparse > 80, "only {sparse} sparse queries");
}

/// The fused decode step's QSA selection on the device: transformers' selection for every
/// query after a 5-token prefill, with no read-back (`Fixture::qsa_device_selection_matches`).
#[test]
fn qsa_device_selection_matches_transformers() {
    // Positions 5..90 on the device, sparse from position 11 on.
    let sparse = Fixture::open(NAME).qsa_device_selection_matches();
    assert!(sparse >= 79, "only {sparse} sparse queries");
}

/// The decode step replayed from a CUDA graph against the eager step (graphs off,
/// `RunOptions::cuda_graph`) on the 4-bit fixture's bf16 device plan: two sequences decoded
/// in turn, three steps each and then the first again past the QSA budget, so that there is
/// a capture, replays, a re-capture at each switch of cache, and eager steps past the
/// budget. Every step's greedy token must be the same and its logits within 1e-3 of
/// max|logit|; a replay reading a stale input (token, position, PLE rows, the indexer's
/// rows) or a cache tensor it was not captured with would not be. On CUDA, where the
/// kernels cover the fixture's GDN recurrence, the graph path must have run: 3 captures,
/// and a replay of every other step inside the budget. The fixture's key head dim (16) has
/// no CUDA gated-delta kernel (it runs on the host, a read-back a graph cannot hold): then
/// no capture may be attempted (none, no replay) and, as on other devices, both models run
/// the same eager step: the logits must be bit for bit the same.
#[test]
fn cuda_graph_decode_matches_eager() {
    use candle_core::{DType, Tensor};
    let name = "qwen4-exp-tiny-4bit";
    let device = common::device_under_test();
    let load = |cuda_graph: bool| {
        let opts = qwen_gdn_model::RunOptions {
            cuda_graph,
            ..common::device_plan(DType::BF16)
        };
        common::load_on(name, &opts, &device)
    };
    let (graphed, eager) = (load(true), load(false));
    assert!(graphed.fused_decode());
    let qsa = graphed.config().qwen4_exp.as_ref().unwrap().qsa.unwrap();
    let c = qsa.compress_ratio;
    // The last position whose step sees every key (no selection mask): replayed.
    let last_within = (qsa.budget / c + 1) * c - 2;
    assert!(last_within >= 6, "{qsa:?}");
    let prompt = Reference::load(name).ids("greedy_prompt_ids");
    // (sequence, steps): A from position 1, B from 2, A again, then A past the budget.
    let schedule = [(0, 3), (1, 3), (0, 3), (0, last_within - 6 + 5)];
    let run = |model: &Model| -> Vec<(u32, Tensor)> {
        let mut caches = [model.new_cache(), model.new_cache()];
        model.prefill(&prompt[..1], &mut caches[0], 16).unwrap();
        model.prefill(&prompt[..2], &mut caches[1], 16).unwrap();
        let mut next = [prompt[1], prompt[2]];
        let mut out = Vec::new();
        for &(s, steps) in &schedule {
            for _ in 0..steps {
                let logits = model.forward_last(&[next[s]], &mut caches[s]).unwrap();
                next[s] = argmax_rows(&logits)[0];
                out.push((next[s], logits));
            }
        }
        assert!(caches[0].offset > last_within + 1, "A ran past the budget");
        out
    };
    #[cfg(feature = "cuda")]
    let before = (
        qwen_gdn_model::cuda_graph::captures(),
        qwen_gdn_model::cuda_graph::replays(),
    );
    let got = run(&graphed);
    let cfg = graphed.config();
    let recurrence = gdn_ops::GdnDims {
        batch: 1,
        steps: 1,
        key_heads: cfg.linear_num_key_heads,
        value_heads: cfg.linear_num_value_heads,
        key_dim: cfg.linear_key_head_dim,
        value_dim: cfg.linear_value_head_dim,
    };
    let graphs =
        device.is_cuda() && gdn_ops::ops::gated_delta::runs_on_device(&device, &recurrence);
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        let captures = qwen_gdn_model::cuda_graph::captures() - before.0;
        let replays = qwen_gdn_model::cuda_graph::replays() - before.1;
        eprintln!("{name}: {captures} captures, {replays} replays (graphs expected: {graphs})");
        // A at 1 (capture), 2, 3; B at 2 (capture), 3, 4; A at 4 (capture) .. last_within.
        let expected = if graphs { (3, last_within) } else { (0, 0) };
        assert_eq!(
            (captures, replays),
            expected,
            "graph path (or fallback) not taken"
        );
        assert!(
            qwen_gdn_model::cuda_graph::enabled(),
            "a capture failed: graphs turned off"
        );
    }
    let want = run(&eager);
    for (i, ((gt, gl), (wt, wl))) in got.iter().zip(&want).enumerate() {
        let d = rel_max_diff(gl, wl);
        let tolerance = if graphs { 1e-3 } else { 0.0 };
        assert!(
            d <= tolerance,
            "step {i}: logits off by {d:e} of max|logit|"
        );
        assert_eq!(gt, wt, "step {i}: greedy token");
    }
}
