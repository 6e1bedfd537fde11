//! What one decoded token costs on the device plan, counted on the CPU: kernel launches (the
//! ops record what they would dispatch, `gdn_ops::launches`) and bytes (`DecodeFootprint`).

mod common;
use candle_core::DType;
use common::*;
use qwen_gdn_model::config::LayerKind;
use qwen_gdn_model::footprint::DecodeFootprint;
use qwen_gdn_model::{Config, Model, StateDtype};
use std::path::Path;

/// Sum of the payloads of a checkpoint's tensors whose names `select` accepts.
fn payload_bytes(name: &str, select: impl Fn(&str) -> bool) -> usize {
    let dir = models_dir().join(name);
    let mut total = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&path).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            total += st
                .tensors()
                .iter()
                .filter(|(n, _)| select(n))
                .map(|(_, t)| t.data().len())
                .sum::<usize>();
        }
    }
    total
}

/// The byte model counts every tensor of an mlx-community checkpoint exactly.
#[test]
fn footprint_accounts_for_every_checkpoint_byte() {
    for name in [
        "qwen3-next-tiny-4bit",
        "qwen3.5-tiny-4bit",
        "qwen3.5-moe-tiny-4bit",
    ] {
        let cfg = Config::from_dir(&models_dir().join(name)).unwrap();
        let f = DecodeFootprint::of(&cfg, 0, StateDtype::F32);
        assert_eq!(f.all_weights, payload_bytes(name, |_| true), "{name}");
        assert_eq!(f.ngram_tables, 0, "{name}");
        assert!(
            f.active_weights < f.all_weights || cfg.num_experts == 0,
            "{name}"
        );
    }
}

/// qwen4_exp in mlx-vlm's layout: the hyper-connections, the indexer, the PLE projections,
/// norms and convs are counted exactly, and the n-gram tables (with their hash buffers) apart
/// from the weights held in memory; only the vision tower, which a text model skips, is left.
#[test]
fn footprint_counts_every_qwen4_exp_byte() {
    let name = "qwen4-exp-tiny-4bit";
    let cfg = Config::from_dir(&models_dir().join(name)).unwrap();
    let f = DecodeFootprint::of(&cfg, 0, StateDtype::F32);
    let table = |n: &str| n.contains(".ple.ple_embedding.");
    assert_eq!(f.ngram_tables, payload_bytes(name, table), "tables");
    assert_eq!(
        f.all_weights,
        payload_bytes(name, |n| !table(n) && !n.starts_with("vision_tower.")),
        "weights"
    );
    // A token reads one row per hashed head of each PLE layer (4 heads of 16 4-bit values
    // with one bf16 scale and bias: 12 bytes), not the table.
    let ple = cfg.qwen4_exp.as_ref().unwrap().ple.as_ref().unwrap();
    let rows_read = ple.layers.len() * ple.heads() * (16 / 2 + 4);
    let without_rows = f.active_weights - rows_read;
    assert!(without_rows < f.all_weights, "{f:?}");
    // State read and written: the GDN recurrent and conv states of the 3 GDN layers, and the
    // PLE conv windows ([(K−1)·N, S·H] f32) of the 2 PLE layers.
    let (hv, dv, dk) = (
        cfg.linear_num_value_heads,
        cfg.linear_value_head_dim,
        cfg.linear_key_head_dim,
    );
    let gdn = 2 * hv * dv * dk * 4 + 2 * (cfg.linear_conv_kernel_dim - 1) * cfg.conv_dim() * 2;
    let window = 2 * (ple.conv_kernel - 1) * ple.ngram_size * (4 * cfg.hidden_size) * 4;
    assert_eq!(f.gdn_state, 3 * gdn + 2 * window);
    // The QSA layer's keys, values and block keys grow with the context.
    let (a, b) = (
        DecodeFootprint::of(&cfg, 99, StateDtype::F32),
        DecodeFootprint::of(&cfg, 199, StateDtype::F32),
    );
    let qsa = cfg.qwen4_exp.as_ref().unwrap().qsa.unwrap();
    let per_100 = 100 * 2 * cfg.num_key_value_heads * cfg.head_dim * 2
        + 4 * qsa.head_dim * (100 / qsa.compress_ratio);
    assert_eq!(b.kv_cache - a.kv_cache, per_100);
}

/// The launches of each of three decode steps after a 5-token prefill.
fn launches_per_decode_step(model: &Model) -> Vec<usize> {
    let mut cache = model.new_cache();
    model.prefill(&[1, 2, 3, 4, 5], &mut cache, 16).unwrap();
    (0..3u32)
        .map(|t| {
            gdn_ops::launches::take();
            model.forward_last(&[7 + t], &mut cache).unwrap();
            gdn_ops::launches::take()
        })
        .collect()
}

/// Launches per decoded token are the same at every step: nothing grows with the context
/// between KV steps, and decode never falls into a prefill-only path.
#[test]
fn launches_per_token_are_constant() {
    let opts = device_plan(DType::BF16);
    let model = load_with("qwen3-next-tiny-4bit", &opts);
    let per_step = launches_per_decode_step(&model);
    assert!(per_step.iter().all(|&n| n == per_step[0]), "{per_step:?}");
    // At least the projections, norms and recurrence of every layer.
    assert!(per_step[0] > 10 * model.layers().len(), "{per_step:?}");
}

/// Launches of one fused decode step of Qwen3-Next-80B-A3B (bf16, device plan): each layer
/// kind's count from the tiny checkpoint with the same layer structure, scaled to the real
/// config's 36 GDN and 12 attention layers (the count does not depend on widths). The fused
/// kernels bring it from thousands to at most 500; composed ops cost several times that.
#[test]
fn qwen3_next_80b_decodes_in_at_most_500_launches() {
    use qwen_gdn_model::model::LaunchBudget;
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/configs/qwen3-next-80b-a3b-instruct-4bit.json");
    let cfg = Config::from_json_str(&std::fs::read_to_string(&path).unwrap(), "80b").unwrap();
    let count = |fused: bool| {
        let mut model = load_with("qwen3-next-tiny-4bit", &device_plan(DType::BF16));
        model.set_fused_decode(fused);
        LaunchBudget::measure(&model).unwrap().total_for(&cfg)
    };
    let (fused, composed) = (count(true), count(false));
    eprintln!("Qwen3-Next-80B-A3B decode: {fused} launches fused, {composed} composed");
    assert!(fused <= 500, "{fused} launches per token");
    assert!(composed > 3 * fused, "composed {composed} vs fused {fused}");
}

/// qwen4_exp's composed decode step, counted per layer kind (GDN, QSA, and the PLE block a
/// layer adds) on the 4-bit fixture: the kinds add up to the launches of a whole step, which
/// are the same at every step.
#[test]
fn qwen4_exp_launches_per_layer_kind_add_up() {
    use qwen_gdn_model::model::LaunchBudget;
    let opts = device_plan(DType::BF16);
    let model = load_with("qwen4-exp-tiny-4bit", &opts);
    let budget = LaunchBudget::measure(&model).unwrap();
    assert!(budget.ple > 0 && budget.gdn_layer > 0 && budget.attention_layer > 0);
    let per_step = launches_per_decode_step(&model);
    assert!(per_step.iter().all(|&n| n == per_step[0]), "{per_step:?}");
    // The fixture's layers: GDN, GDN + PLE, QSA, GDN + PLE.
    assert_eq!(budget.total_for(model.config()), per_step[0], "{budget:?}");
}

/// qwen4_exp's decode step, fused against composed, on the 4-bit fixture (bf16). There every
/// MoE block and every hyper-connection runs fused, no GDN mixer does (its head dims of 16
/// are outside the kernels' coverage) and the QSA mixer selects on the device (and attends on
/// the fused kernels inside the budget), so each GDN layer saves the same launches (its MoE
/// block's and its two hyper-connections', composed minus fused), the final mixer its own,
/// and the step the sum; the kinds still add up. The step's budget at the release config:
/// at most 1,847 launches fused (4,019 before the hyper-connection kernels, 2,232 before
/// the merged down+inject product, the norms carried across layers, `hc_up_mix` and the MoE
/// weighted sum inside the injection; the
/// composed step 4,835, 4,931 before the merged product), as the fixture measures it (GDN
/// mixers composed; fused, as the release's widths run them, 911:
/// `qwen4_exp_launches_per_component`).
#[test]
fn qwen4_exp_fused_decode_saves_each_moe_blocks_and_hyper_connections_launches() {
    use qwen_gdn_model::model::LaunchBudget;
    let count = |fused: bool| {
        let mut model = load_with("qwen4-exp-tiny-4bit", &device_plan(DType::BF16));
        model.set_fused_decode(fused);
        assert_eq!(model.fused_decode(), fused);
        let budget = LaunchBudget::measure(&model).unwrap();
        let mut cache = model.new_cache();
        model.prefill(&[1, 2, 3, 4, 5], &mut cache, 16).unwrap();
        gdn_ops::launches::take();
        let (_, per_layer) = model.decode_step_with_launches(6, &mut cache).unwrap();
        let total = gdn_ops::launches::take();
        assert_eq!(budget.total_for(model.config()), total, "{budget:?}");
        let attention: Vec<bool> = (0..per_layer.len())
            .map(|i| model.config().layer_kind(i) == LayerKind::FullAttention)
            .collect();
        if fused {
            let coverage = model.fused_coverage_per_layer();
            assert!(
                coverage
                    .iter()
                    .zip(&attention)
                    .all(|(c, &a)| c.feed_forward && c.mixer == a),
                "{coverage:?}"
            );
        }
        (budget, per_layer, total, attention)
    };
    let (fused, composed) = (count(true), count(false));
    let saved: Vec<isize> = composed
        .1
        .iter()
        .zip(&fused.1)
        .map(|(&c, &f)| c as isize - f as isize)
        .collect();
    let gdn_saved: Vec<isize> = (saved.iter().zip(&fused.3))
        .filter(|(_, &a)| !a)
        .map(|(&s, _)| s)
        .collect();
    assert!(
        gdn_saved[0] > 0 && gdn_saved.iter().all(|&s| s == gdn_saved[0]),
        "{saved:?}"
    );
    // The final mixer: 16 composed launches, 2 fused (the down product, `hc_up_mix`; its
    // norm computed by the last layer's injection).
    assert_eq!(composed.0.outside - fused.0.outside, 14);
    assert_eq!(
        fused.2 as isize,
        composed.2 as isize - saved.iter().sum::<isize>() - 14
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/configs/qwen3.8-flash-next-release-4bit.json");
    let cfg = Config::from_json_str(&std::fs::read_to_string(&path).unwrap(), "release").unwrap();
    eprintln!(
        "qwen4_exp decode, fixture: {} launches fused, {} composed ({} saved per GDN layer, \
         per layer {saved:?}); release config: {} fused, {} composed (MoE blocks, \
         hyper-connections, QSA selection and attention fused; the fixture's GDN widths are \
         outside the kernels; measured at position 5, inside the QSA budget)",
        fused.2,
        composed.2,
        gdn_saved[0],
        fused.0.total_for(&cfg),
        composed.0.total_for(&cfg)
    );
    assert!(fused.0.total_for(&cfg) <= 1_847, "{:?}", fused.0);
    assert_eq!(composed.0.total_for(&cfg), 4_835, "{:?}", composed.0);
}

/// The QSA layer's decode launches past the indexer's budget (the fixture's is 8 tokens, 2
/// blocks: sparse from position 11 on), fused (selection on the device) against composed
/// (selection on the host, one read-back), over 8 steps: every step of a block (4 tokens),
/// the completing one included. Printed for the perf notes; the fused step reads nothing
/// back.
#[test]
fn qwen4_exp_qsa_layer_launches_past_the_budget() {
    let count = |fused: bool| {
        let mut model = load_with("qwen4-exp-tiny-4bit", &device_plan(DType::BF16));
        model.set_fused_decode(fused);
        let qsa = (0..model.config().num_hidden_layers)
            .find(|&i| model.config().layer_kind(i) == LayerKind::FullAttention)
            .unwrap();
        let mut cache = model.new_cache();
        let prompt: Vec<u32> = (1..=40).collect();
        model.prefill(&prompt, &mut cache, 16).unwrap();
        let read_backs = gdn_ops::launches::read_backs();
        let per_step: Vec<usize> = (0..8u32)
            .map(|t| {
                gdn_ops::launches::take();
                let (_, per_layer) = model.decode_step_with_launches(50 + t, &mut cache).unwrap();
                gdn_ops::launches::take();
                per_layer[qsa]
            })
            .collect();
        (per_step, gdn_ops::launches::read_backs() - read_backs)
    };
    let ((fused, fused_reads), (composed, composed_reads)) = (count(true), count(false));
    eprintln!(
        "qwen4_exp QSA layer past the budget, launches per step: fused {fused:?}, composed \
         {composed:?}; read-backs over 8 steps: fused {fused_reads}, composed {composed_reads}"
    );
    assert_eq!(fused_reads, 0);
    assert_eq!(composed_reads, 8);
    // Every step of a block launches the same kernels (a step replayed as recorded).
    assert!(fused.iter().all(|&n| n == fused[0]), "{fused:?}");
}

/// The decode profile (`gdn_ops::profile`, `bench --profile-decode`) sees every launch of a
/// fused step where it happens: per layer, its kernel rows' launches plus the candle launches
/// it counted equal the launches `decode_step_with_launches` counts for that layer, and over
/// the step the total; each row is placed in its layer with its layer's kind. Fails when an
/// op is not wrapped (its launches go missing from the rows), when a row is charged to the
/// wrong layer, or when an op counts a launch it does not profile.
#[test]
fn the_decode_profile_accounts_for_every_launch_of_the_step() {
    use gdn_ops::profile::{LayerKind, Session};
    use qwen_gdn_model::config::LayerKind as ConfigKind;
    let opts = device_plan(DType::BF16);
    for name in [
        "qwen3-next-tiny-4bit",
        "qwen3.5-moe-tiny-4bit",
        "qwen3.5-tiny-4bit",
    ] {
        let model = load_with(name, &opts);
        let mut cache = model.new_cache();
        model.prefill(&[1, 2, 3, 4, 5], &mut cache, 16).unwrap();
        gdn_ops::launches::take();
        let session = Session::start();
        let (_, per_layer) = model.decode_step_with_launches(6, &mut cache).unwrap();
        let rec = session.finish();
        let total = gdn_ops::launches::take();
        assert_eq!(
            rec.kernel_launches() + rec.candle_launches(),
            total,
            "{name}: {} kernel rows, candle {:?}",
            rec.kernels.len(),
            rec.candle
        );
        for (i, &launches) in per_layer.iter().enumerate() {
            let want = match model.config().layer_kind(i) {
                ConfigKind::LinearAttention => LayerKind::Gdn,
                ConfigKind::FullAttention => LayerKind::Attention,
            };
            let rows: Vec<_> = rec
                .kernels
                .iter()
                .filter(|k| k.place.index == Some(i))
                .collect();
            assert!(
                rows.iter().all(|k| k.place.kind == want),
                "{name} layer {i}"
            );
            let candle: usize = rec
                .candle
                .iter()
                .filter(|(p, _)| p.index == Some(i))
                .map(|(_, n)| n)
                .sum();
            let in_rows: usize = rows.iter().map(|k| k.launches).sum();
            let ops: Vec<&str> = rows.iter().map(|k| k.op).collect();
            assert_eq!(in_rows + candle, launches, "{name} layer {i}: {ops:?}");
            // On the CPU every op is one twin: one launch, no grid.
            assert!(rows.iter().all(|k| k.launches == 1 && k.grids.is_empty()));
        }
        let outside: Vec<&str> = rec
            .kernels
            .iter()
            .filter(|k| k.place.kind == LayerKind::Outside)
            .map(|k| k.op)
            .collect();
        // The embedding lookup, the first norm, the head.
        assert_eq!(
            outside,
            ["affine_dequantize", "add_rms_norm", "affine_products"],
            "{name}"
        );
    }
}

/// Qwen3.8-Flash-Next's public release config (tests/data/configs): its shapes, among them a
/// GQA ratio of 3 in the GDN (16 key heads, 48 value heads) and 12 in attention (24 query
/// heads, 2 KV heads), and its 512 experts of which 10 are routed, are all inside the fused
/// kernels' coverage, in the activation dtypes of the device plan and both state dtypes. (The
/// kernels' own tests run these shapes: tests/common/{gated_delta_norm,gdn_conv_prep,
/// attn_prep,attn_decode,moe_route}.rs in gdn-ops.)
#[test]
fn qwen3_8_release_shapes_are_inside_the_fused_kernels() {
    use gdn_ops::ops::{attn_decode, attn_prep, gated_delta_norm, gdn_conv_prep, moe_route};
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/configs/qwen3.8-flash-next-release-4bit.json");
    let cfg = Config::from_json_str(&std::fs::read_to_string(&path).unwrap(), "release").unwrap();
    let q4 = cfg.qwen4_exp.as_ref().unwrap();
    let qsa = q4.qsa.unwrap();
    // The release's fields, as published (peers-2026-11.md §4b).
    assert_eq!(
        (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim
        ),
        (24, 2, 256)
    );
    assert_eq!(
        (cfg.linear_num_key_heads, cfg.linear_num_value_heads),
        (16, 48)
    );
    assert_eq!((cfg.num_experts, cfg.num_experts_per_tok), (512, 10));
    assert_eq!(
        (
            cfg.moe_intermediate_size,
            cfg.shared_expert_intermediate_size
        ),
        (640, 640)
    );
    assert_eq!(
        (qsa.budget, qsa.compress_ratio, qsa.block_topk()),
        (2048, 4, 512)
    );
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        let recurrence = gdn_ops::GdnDims {
            batch: 1,
            steps: 1,
            key_heads: cfg.linear_num_key_heads,
            value_heads: cfg.linear_num_value_heads,
            key_dim: cfg.linear_key_head_dim,
            value_dim: cfg.linear_value_head_dim,
        };
        for state in [DType::F32, DType::BF16] {
            assert!(gated_delta_norm::supports(&recurrence, dtype, state));
        }
        let conv = gdn_conv_prep::ConvPrepDims {
            key_heads: cfg.linear_num_key_heads,
            key_dim: cfg.linear_key_head_dim,
            value_heads: cfg.linear_num_value_heads,
            value_dim: cfg.linear_value_head_dim,
            kernel_size: cfg.linear_conv_kernel_dim,
        };
        assert!(gdn_conv_prep::supports(&conv, dtype));
        assert!(attn_prep::supports(cfg.head_dim, cfg.rope_dims(), dtype));
        assert!(attn_decode::supports(
            cfg.head_dim,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            dtype
        ));
        assert!(moe_route::supports(
            cfg.num_experts,
            cfg.num_experts_per_tok,
            dtype
        ));
    }
}

/// Where qwen4_exp's decode launches go, per component, on the device plan (bf16): the
/// hyper-connections composed (norm, products, gates, mixing, injection: the reference) and
/// fused (`hc_inject_norm`, `hc_mix` between the products), the PLE block, the mixers and the
/// MoE block, each counted around its own call on one token of the 4-bit fixture. The
/// fixture's GDN widths are outside the fused GDN kernels, so the fused GDN mixer is counted
/// on Qwen3-Next's fixture (the same `decode_fused`). The parts add up to the fixture's
/// measured layers, and the table scaled to the release config's layers is printed
/// (docs/perf-notes-gpu.md keeps it). Fails when a part's count changes unnoticed.
#[test]
fn qwen4_exp_launches_per_component() {
    use candle_core::Tensor;
    use qwen_gdn_model::cache::LayerCache;
    use qwen_gdn_model::families::hybrid::Mixer;
    use qwen_gdn_model::families::qwen4_exp::hyper_connection::HyperConnection;
    use qwen_gdn_model::families::qwen4_exp::step_inputs::StepInputs;
    use qwen_gdn_model::families::qwen4_exp::{fused, Qwen4Mixer};
    use qwen_gdn_model::model::LaunchBudget;
    let count = |f: &mut dyn FnMut()| {
        gdn_ops::launches::take();
        f();
        gdn_ops::launches::take()
    };
    let model = load_with("qwen4-exp-tiny-4bit", &device_plan(DType::BF16));
    let decoder = model.qwen4_exp().unwrap();
    assert!(decoder.fused_hyper_connections());
    let budget = LaunchBudget::measure(&model).unwrap();
    let mut cache = model.new_cache();
    model.prefill(&[1, 2, 3, 4, 5], &mut cache, 16).unwrap();
    let h = model.config().hidden_size;
    let random = |cols: usize| {
        Tensor::randn(0f32, 1.0, (1, cols), &candle_core::Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap()
    };
    let (hs, y) = (random(decoder.streams * h), random(h));
    let hc = &decoder.layers[0].attn_hc;
    // Composed: the mixing (its grouped norm counted apart) and the injection.
    let hc_norm = count(&mut || drop(hc.norm.forward(&hs).unwrap()));
    let hc_mix = count(&mut || drop(hc.forward(&hs).unwrap()));
    let (_, w) = hc.forward(&hs).unwrap();
    let hc_inject = count(&mut || drop(HyperConnection::inject(&hs, &y, w.as_ref().unwrap())));
    // Fused: the norm alone, the mixing from the normed streams, the injection with (or
    // without) the next norm.
    let f_norm = count(&mut || drop(hc.normed(&hs).unwrap()));
    let n = hc.normed(&hs).unwrap();
    let f_mix = count(&mut || drop(hc.mix_normed(&n).unwrap()));
    let (_, g) = hc.mix_normed(&n).unwrap();
    let g = g.unwrap();
    let f_inject = count(&mut || {
        HyperConnection::inject_normed(&hs, &y, &g, Some(hc)).unwrap();
    });
    let f_inject_alone = count(&mut || {
        HyperConnection::inject_normed(&hs, &y, &g, None).unwrap();
    });
    assert_eq!((f_norm, f_inject, f_inject_alone), (1, 1, 1));
    let hc_fused = f_norm + 2 * f_mix + f_inject + f_inject_alone;
    let hc_composed = 2 * (hc_mix + hc_inject);
    // The mixers and the MoE block of the fixture, as a decode step runs them.
    let (mut gdn, mut qsa, mut moe) = (None, None, None);
    for (i, layer) in decoder.layers.iter().enumerate() {
        let c = &mut cache.layers[i];
        match (&layer.mixer, c) {
            (Qwen4Mixer::Gdn(m), LayerCache::Gdn(c)) if gdn.is_none() && layer.ple.is_none() => {
                gdn = Some(count(&mut || {
                    m.forward(&y.unsqueeze(0).unwrap(), c).unwrap();
                }))
            }
            (Qwen4Mixer::Qsa(q), LayerCache::Attention(c)) if qsa.is_none() => {
                // The step's inputs are uploaded before the step (no kernel).
                let step = StepInputs {
                    token: Tensor::new(&[0u32], y.device()).unwrap(),
                    pos: Tensor::new(&[5u32], y.device()).unwrap(),
                    indexer: Some(q.indexer.step_values(5).upload(y.device()).unwrap()),
                    ple_rows: Vec::new(),
                    in_place: false,
                };
                qsa = Some(count(&mut || {
                    drop(fused::qsa_mixer(q, &y, c, 5, &step).unwrap())
                }))
            }
            _ => {}
        }
        // Its weighted sum is the injection's (`inject_slots_normed`), counted there.
        moe.get_or_insert_with(|| count(&mut || drop(fused::moe_slots(&layer.moe, &y).unwrap())));
    }
    let (gdn_composed, qsa, moe) = (gdn.unwrap(), qsa.unwrap(), moe.unwrap());
    // The fixture's layers are these parts.
    assert_eq!(
        budget.gdn_layer,
        hc_fused + gdn_composed + moe,
        "{budget:?}"
    );
    assert_eq!(budget.attention_layer, hc_fused + qsa + moe, "{budget:?}");
    // The fused GDN mixer, on Qwen3-Next's fixture (inside the GDN kernels).
    let next = load_with("qwen3-next-tiny-4bit", &device_plan(DType::BF16));
    let mut next_cache = next.new_cache();
    next.prefill(&[1, 2, 3, 4, 5], &mut next_cache, 16).unwrap();
    let (i, m) = (next.layers().iter().enumerate())
        .find_map(|(i, l)| match &l.mixer {
            Mixer::Gdn(m) => Some((i, m)),
            _ => None,
        })
        .unwrap();
    let LayerCache::Gdn(c) = &mut next_cache.layers[i] else {
        panic!("layer {i} has no GDN cache")
    };
    let x = random(next.config().hidden_size);
    let gdn_fused = count(&mut || drop(fused::gdn_mixer(m, &x, c).unwrap()));
    let final_mix = count(&mut || drop(decoder.final_mix(&hs).unwrap()));
    let final_composed = count(&mut || drop(decoder.final_mixer.forward(&hs).unwrap()));
    let release = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/configs/qwen3.8-flash-next-release-4bit.json");
    let cfg =
        Config::from_json_str(&std::fs::read_to_string(&release).unwrap(), "release").unwrap();
    let layers = cfg.num_hidden_layers;
    let (gdn_layers, qsa_layers) = LaunchBudget::layers_of(&cfg);
    let ple_layers = qwen_gdn_model::model::ple_layers(&cfg).len();
    // In the step the final mixer's norm comes with the last injection, as every layer's
    // but the first's and the PLE layers' does (the launch each saves).
    let carried = qwen_gdn_model::model::carried_norm_layers(&cfg).len();
    assert_eq!((budget.carried_norm, carried), (1, layers - 1 - ple_layers));
    let outside = budget.outside - (final_mix - budget.carried_norm);
    let step = |hc: usize, gdn: usize, final_mix: usize, carried_norm: usize| {
        outside
            + final_mix
            + layers * (hc + moe)
            + gdn_layers * gdn
            + qsa_layers * qsa
            + ple_layers * budget.ple
            - (carried + 1) * carried_norm
    };
    eprintln!(
        "qwen4_exp decode launches per component (bf16; per call, then x the release's \
         {layers} layers: {gdn_layers} GDN, {qsa_layers} QSA, {ple_layers} PLE):\n\
         HC per layer composed {hc_composed} (2 x (mixing {hc_mix}, of it norm {hc_norm}, + \
         injection {hc_inject})) -> release {}\n\
         HC per layer fused {hc_fused} (norm {f_norm}, 2 x mixing {f_mix}, injection+norm \
         {f_inject}, injection {f_inject_alone}) -> release {}\n\
         final mix composed {final_composed}, fused {final_mix}; outside the layers \
         otherwise {outside}\n\
         PLE block {} -> release {}\n\
         GDN mixer fused {gdn_fused} (composed at the fixture's widths {gdn_composed}) -> \
         release {}\nQSA mixer (inside the budget) {qsa} -> release {}\nMoE block (its weighted sum in the \
         injection) {moe} -> \
         release {}\n\
         step at the release config, GDN fused: HC composed {}, HC fused {}; as the fixture \
         measures it (GDN composed): {}",
        layers * hc_composed,
        layers * hc_fused,
        budget.ple,
        ple_layers * budget.ple,
        gdn_layers * gdn_fused,
        qsa_layers * qsa,
        layers * moe,
        step(hc_composed, gdn_fused, final_composed, 0),
        step(hc_fused, gdn_fused, final_mix, 1),
        budget.total_for(&cfg),
    );
    assert_eq!(
        step(hc_fused, gdn_composed, final_mix, 1),
        budget.total_for(&cfg)
    );
    assert!(hc_fused * 3 < hc_composed, "{hc_fused} vs {hc_composed}");
}
