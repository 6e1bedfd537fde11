//! Speculative decoding's verify pass on the fused kernels (`Model::verify`,
//! `families/hybrid/verify.rs`) on the device plan in f32 on the CPU (the kernels' CPU twins),
//! on every fixture:
//!
//! - the logits of its T = 1..5 rows are those of T fused decode steps: bit for bit (on the
//!   CPU; within 1e-5 on a GPU, `QWEN_GDN_TEST_DEVICE=cuda`) with the products row by row (`BatchProducts::EachRowAlone`), within 1e-5 of max|logit| with one
//!   product over the rows (`Shared`, the GPU's default), and within the fused-vs-composed
//!   gate (1e-4) of the composed verify (the prefill path, the reference);
//! - a window closed on any prefix leaves the cache bit for bit (CPU) where the kept tokens'
//!   decode steps leave it (GDN conv and recurrent state, KV);
//! - no host read-back inside the pass (`gdn_ops::launches::read_backs`), and its launches
//!   well under T decode steps' (the budget below);
//! - greedy output with speculation (MTP head, k = 1..4) equals greedy output without, on the
//!   device plan, with the fused verify.

mod common;
use candle_core::{DType, Device, Tensor};
use common::*;
use gdn_ops::launches;
use gdn_ops::ops::affine::dense_rows;
use gdn_ops::ops::attn_decode;
use qwen_gdn_model::cache::{Cache, LayerCache};
use qwen_gdn_model::config::LayerKind;
use qwen_gdn_model::layers::gdn::{GdnSteps, VerifyWindow};
use qwen_gdn_model::speculative::{DraftLength, Greedy, Speculation, Window};
use qwen_gdn_model::{BatchProducts, Model, RunOptions};

/// Tokens of the prompt before the verify windows.
const PROMPT: usize = 9;
/// The longest verify pass checked: k = 4 drafts.
const MAX_ROWS: usize = 5;

/// Every state tensor the same bits (`exact`), or within 1e-5 of its largest |value|.
fn states_match(a: &[Vec<f32>], b: &[Vec<f32>], exact: bool) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            let scale = y.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
            x.len() == y.len()
                && x.iter().zip(y).all(|(p, q)| match exact {
                    true => p.to_bits() == q.to_bits(),
                    false => (p - q).abs() <= 1e-5 * scale,
                })
        })
}

/// The verify pass of `tokens` inside a window after `base`: logits `[T, vocab]`, its
/// launches and host read-backs, and the window (still open) with the cache.
fn verify_in_window(
    model: &Model,
    base: &Cache,
    tokens: &[u32],
) -> (Tensor, usize, usize, Window, Cache) {
    let mut cache = base.deep_clone().unwrap();
    let window = Window::open(&mut cache).unwrap();
    let read_backs = launches::read_backs();
    launches::take();
    let (logits, normed) = model.verify(tokens, &mut cache).unwrap();
    let spent = launches::take();
    let read_backs = launches::read_backs() - read_backs;
    assert_eq!(normed.dims(), [1, tokens.len(), model.config().hidden_size]);
    (logits, spent, read_backs, window, cache)
}

/// T fused decode steps after `base`: their logits `[T, vocab]`, the launches of each, and
/// the cache after each step.
fn decode_steps(model: &Model, base: &Cache, tokens: &[u32]) -> (Tensor, Vec<usize>, Vec<Cache>) {
    let mut cache = base.deep_clone().unwrap();
    let (mut rows, mut spent, mut after) = (vec![], vec![], vec![]);
    for &t in tokens {
        launches::take();
        rows.push(model.forward_last(&[t], &mut cache).unwrap());
        spent.push(launches::take());
        after.push(cache.deep_clone().unwrap());
    }
    (Tensor::cat(&rows, 0).unwrap(), spent, after)
}

/// The largest capacity of the cache's KV buffers, in positions.
fn capacity_of(cache: &Cache) -> usize {
    cache
        .layers
        .iter()
        .filter_map(|l| match l {
            LayerCache::Attention(c) => Some(c.capacity()),
            LayerCache::Gdn(_) => None,
        })
        .max()
        .unwrap_or(0)
}

/// The fixture `name` on the device plan in f32 on the device under test, its CUDA graphs
/// on (`graphs`) or off.
fn load_with_graphs(name: &str, graphs: bool) -> Model {
    let opts = RunOptions {
        cuda_graph: graphs,
        ..device_plan(DType::F32)
    };
    load_on(name, &opts, &device_under_test())
}

fn check(name: &str) {
    // The eager fused pass, its launches counted one by one (on CUDA a graph's capture would
    // count its kernels twice): `verify_graph_replays_match_the_eager_pass` holds the
    // replayed graph to it.
    let mut model = load_with_graphs(name, false);
    assert!(model.fused_decode(), "{name}: fused decode is off");
    assert!(model.fused_verify(), "{name}: fused verify is off");
    let cfg = model.config().clone();
    // Bit for bit on the CPU twins; on a GPU (QWEN_GDN_TEST_DEVICE=cuda) one-row products
    // may take other kernels: the f32 gate.
    let exact = matches!(model.device(), Device::Cpu);
    let ids = Reference::load(name).ids("tf_ids");
    assert!(ids.len() >= PROMPT + MAX_ROWS, "{name}: {} ids", ids.len());
    let mut base = model.new_cache();
    model.prefill(&ids[..PROMPT], &mut base, 2048).unwrap();
    let attention_layers = (0..cfg.num_hidden_layers)
        .filter(|&i| cfg.layer_kind(i) == LayerKind::FullAttention)
        .count();
    let gdn_layers = cfg.num_hidden_layers - attention_layers;
    // Where the kernels cover every layer, the pass has no host read-back and keeps to the
    // launch budget below. (An MoE outside them, unquantized experts, composes its rows, and
    // its grouping reads the routing back, as the composed verify does.)
    let covered = model
        .fused_coverage_per_layer()
        .iter()
        .all(|c| c.mixer && c.feed_forward);
    // Launches of the fused verify of T = 1.. rows (one product over the rows).
    let mut launches_at = vec![];
    // The KV buffers' largest capacity in the passes: past SPLIT_KEYS positions a GPU's
    // `attn_decode` is two launches (split and combine).
    let mut kv_capacity = 0;
    for rows in 1..=MAX_ROWS {
        let tokens = &ids[PROMPT..PROMPT + rows];
        let (want, step_launches, after) = decode_steps(&model, &base, tokens);
        let scale = flat(&want).iter().fold(0f32, |m, x| m.max(x.abs()));

        // Row by row: the decode steps' bits, the logits and every state the window keeps.
        model.set_batch_products(BatchProducts::EachRowAlone);
        let (got, _, read_backs, window, mut cache) = verify_in_window(&model, &base, tokens);
        assert!(
            read_backs == 0 || !covered,
            "{name}, T={rows}: {read_backs} host read-backs"
        );
        match exact {
            true => {
                let (got, want) = (flat(&got), flat(&want));
                let differ = got
                    .iter()
                    .zip(&want)
                    .filter(|(a, b)| a.to_bits() != b.to_bits());
                let differ = differ.count();
                assert_eq!(
                    differ, 0,
                    "{name}, T={rows}: {differ} logits are not the decode steps' bits"
                );
            }
            false => {
                let d = rel_max_diff(&got, &want);
                assert!(
                    d <= 1e-5,
                    "{name}, T={rows}: rows alone {d:e} of max|logit|"
                );
            }
        }
        window.close(&mut cache, rows).unwrap();
        assert!(
            states_match(&gdn_and_kv(&cache), &gdn_and_kv(&after[rows - 1]), exact),
            "{name}, T={rows}: the state after the pass is not the decode steps'"
        );
        for kept in 1..rows {
            let (_, _, _, window, mut cache) = verify_in_window(&model, &base, tokens);
            window.close(&mut cache, kept).unwrap();
            assert_eq!(cache.offset, PROMPT + kept);
            assert!(
                states_match(&gdn_and_kv(&cache), &gdn_and_kv(&after[kept - 1]), exact),
                "{name}, T={rows}: kept {kept}: the rewound state is not the decode steps'"
            );
        }

        // One product over the rows (the GPU's default): the f32 gate, and the launches.
        model.set_batch_products(BatchProducts::Shared);
        let (shared, spent, read_backs, _, after_pass) = verify_in_window(&model, &base, tokens);
        kv_capacity = kv_capacity.max(capacity_of(&after_pass));
        assert!(
            read_backs == 0 || !covered,
            "{name}, T={rows}: {read_backs} host read-backs"
        );
        let d = rel_max_diff(&shared, &want);
        assert!(
            d <= 1e-5,
            "{name}, T={rows}: shared products {d:e} of max|logit| {scale}"
        );
        launches_at.push(spent);

        // The composed verify, the reference: the fused-vs-composed gate.
        model.set_fused_verify(false);
        let (composed, composed_launches, composed_read_backs, ..) =
            verify_in_window(&model, &base, tokens);
        model.set_fused_verify(true);
        let d_composed = rel_max_diff(&shared, &composed);
        assert!(
            d_composed <= 1e-4,
            "{name}, T={rows}: fused vs composed verify {d_composed:e}"
        );

        let step = step_launches.iter().sum::<usize>() / rows;
        eprintln!(
            "{name}, T={rows}: fused verify {spent} launches, {read_backs} read-backs; \
             {rows} decode steps {} launches; composed verify {composed_launches} launches, \
             {composed_read_backs} read-backs; shared products {d:e} of max|logit|, \
             vs composed {d_composed:e}",
            step * rows
        );
        // On CUDA the decode steps replay a captured graph, counted as one launch a step:
        // the comparison with their kernels holds where they launch one by one (the CPU).
        if rows >= 2 && exact {
            assert!(
                spent < rows * step,
                "{name}, T={rows}: {spent} ≥ {rows} steps of {step}"
            );
        }
    }
    // The budget where the kernels cover every layer, to the launch: a one-row pass costs
    // the decode step and a copy of each GDN layer's conv rows before the window (the conv
    // front advances them in place); a pass of T ≥ 2 rows the decode step (its conv rows are
    // left as they were), plus per further row: per GDN layer nothing with the window's
    // recurrence in one launch (`QWEN_GDN_VERIFY_WINDOW=one-launch`, the default: the
    // window's states are written by that launch into one buffer, allocated once), else its
    // recurrence, the copy of the state before it (the last token's state is the live one)
    // and its output row (3); per attention layer its `attn_decode` (one launch, or two past
    // SPLIT_KEYS positions on a GPU) and output row, nothing per product; and once per layer
    // joining the rows, or allocating the GDN window's states (1 per layer). Up to the rows
    // the quantized products run row by row (`DenseRows::row_products_max`: 8 under `auto`)
    // one pass; past them a second pass, which copies the first pass's last state (1 per GDN
    // layer), and the logits and normed rows of the two are joined (2 + 2). A pass that drops
    // to the composed MoE or to dequantized products is far over.
    if covered {
        let one_row = launches_at[0];
        let step = one_row - gdn_layers;
        let attn_decode = attn_decode::launches(kv_capacity, model.device());
        let gdn_per_row = match run_options().verify_window {
            VerifyWindow::OneLaunch => 0,
            VerifyWindow::PerToken => 3 * gdn_layers,
        };
        let per_row = gdn_per_row + (attn_decode + 1) * attention_layers;
        let join = gdn_layers + attention_layers;
        let per_pass = dense_rows().row_products_max();
        for (i, &spent) in launches_at.iter().enumerate().take(per_pass).skip(1) {
            let budget = step + i * per_row + join;
            assert!(
                spent <= budget,
                "{name}, T={}: {spent} launches, budget {budget}",
                i + 1
            );
        }
        if let Some(&spent) = launches_at.get(per_pass) {
            let two_passes = launches_at[per_pass - 1] + step + gdn_layers + 4;
            assert!(spent <= two_passes, "{name}: {launches_at:?}");
        }
    }
}

common::per_checkpoint! {
    verify_rows_are_decode_steps => check,
}

/// Every GDN layer's just-opened window made one that copies into persistent buffers for
/// a pass of `rows` rows, as `families/hybrid/verify_graph.rs` does before a capture.
fn into_buffers(cache: &mut Cache, rows: usize) {
    for l in &mut cache.layers {
        if let LayerCache::Gdn(c) = l {
            let (conv, state) = (c.conv.as_ref().unwrap(), c.state.as_ref().unwrap());
            let (b, before, channels) = conv.dims3().unwrap();
            let buffer = Tensor::zeros((b, before + rows, channels), conv.dtype(), conv.device());
            let after = (rows > 1).then(|| {
                let mut shape = vec![rows - 1];
                shape.extend_from_slice(state.dims());
                Tensor::zeros(shape, state.dtype(), state.device()).unwrap()
            });
            c.steps = Some(GdnSteps::in_buffers(buffer.unwrap(), after));
        }
    }
}

/// Speculative steps of T = 1..5 rows, each window closed on a varying prefix (rejections),
/// on two copies of one fixture: the verify pass replayed from a CUDA graph per T
/// (`families/hybrid/verify_graph.rs`; a capture is replayed after the rollbacks of earlier
/// steps) and the eager pass (graphs off). Every step's logits and the state the closed
/// window leaves (GDN conv and recurrent state, KV) agree within the f32 gate, and on CUDA
/// the graph was replayed. Short on purpose (one fixture, 12 steps). On the CPU, where there
/// is no graph, the first copy's windows copy into persistent buffers as a capture's do
/// (bit for bit the same then, but held to the same gate).
#[test]
fn verify_graph_replays_match_the_eager_pass() {
    let name = "qwen3-next-tiny-4bit";
    let graphed = load_with_graphs(name, true);
    let eager = load_with_graphs(name, false);
    assert!(graphed.fused_verify() && eager.fused_verify(), "{name}");
    assert!(
        (graphed.fused_coverage_per_layer().iter()).all(|c| c.mixer && c.feed_forward),
        "{name}: a layer outside the fused kernels runs no graph"
    );
    let ids = Reference::load(name).ids("tf_ids");
    let (mut a, mut b) = (graphed.new_cache(), eager.new_cache());
    graphed.prefill(&ids[..PROMPT], &mut a, 2048).unwrap();
    eager.prefill(&ids[..PROMPT], &mut b, 2048).unwrap();
    let replays = qwen_gdn_model::families::hybrid::verify::graph_replays();
    let mut at = PROMPT;
    for (step, rows) in [3, 3, 5, 2, 1, 4, 3, 5, 2, 3, 1, 4].into_iter().enumerate() {
        let tokens: Vec<u32> = (0..rows).map(|t| ids[(at + t) % ids.len()]).collect();
        let kept = 1 + (step * 7) % rows;
        let pass = |model: &Model, cache: &mut Cache| {
            let window = Window::open(cache).unwrap();
            // Off CUDA, what a capture sets up by hand: the window's persistent buffers,
            // so that the in-place path (conv window, rows, states, the close) is checked.
            if !graphed.device().is_cuda() && std::ptr::eq(model, &graphed) {
                into_buffers(cache, rows);
            }
            let (logits, _) = model.verify(&tokens, cache).unwrap();
            window.close(cache, kept).unwrap();
            logits
        };
        let (got, want) = (pass(&graphed, &mut a), pass(&eager, &mut b));
        let d = rel_max_diff(&got, &want);
        assert!(d <= 1e-5, "step {step}, T={rows}: graph vs eager {d:e}");
        assert_eq!(a.offset, b.offset);
        assert!(
            states_match(&gdn_and_kv(&a), &gdn_and_kv(&b), false),
            "step {step}, T={rows}, kept {kept}: the graph's state is not the eager pass's"
        );
        at += kept;
    }
    let replays = qwen_gdn_model::families::hybrid::verify::graph_replays() - replays;
    eprintln!("{name}: {replays} verify passes replayed from a CUDA graph of 12");
    if graphed.device().is_cuda() {
        // 12 passes of 5 distinct T: 7 could replay; a KV buffer growing recaptures.
        assert!(replays >= 4, "{replays} verify graph replays");
    }
}

/// Greedy decoding with speculation on the device plan (the fused verify, both product
/// modes) gives plain greedy decoding's tokens, k = 1..4: on the fixture whose head was
/// trained on the model's own greedy continuations (so most drafts are accepted and the
/// verify's later rows decide), and on a 4-bit one.
#[test]
fn greedy_with_fused_verify_equals_greedy_without() {
    let path = models_dir().join("mtp/reference/qwen3.5-mtp-tiny-hf.safetensors");
    let trained_prompt = Reference(candle_core::safetensors::load(&path, &Device::Cpu).unwrap())
        .ids("ids")[..12]
        .to_vec();
    for (name, min_acceptance) in [("qwen3.5-mtp-tiny-hf", 0.5), ("qwen3.5-mtp-tiny-4bit", 0.0)] {
        let dir = models_dir().join("mtp").join(name);
        let mut model = Model::load(&dir, &Device::Cpu, &device_plan(DType::F32)).unwrap();
        assert!(model.load_mtp(&dir).unwrap(), "{name}: no MTP head");
        assert!(model.fused_verify(), "{name}");
        let prompt = &trained_prompt;
        let want = greedy(&model, prompt, 40);
        for products in [BatchProducts::EachRowAlone, BatchProducts::Shared] {
            model.set_batch_products(products);
            for k in 1..=4 {
                let mut spec = Speculation::new(&model, DraftLength::Fixed(k)).unwrap();
                let got = speculative_greedy(&model, &mut spec, prompt, 0, 40);
                assert_eq!(got, want, "{name}, {products:?}, k={k}");
                let s = &spec.stats;
                eprintln!(
                    "{name}, {products:?}, k={k}: acceptance {:.3}, {:.2} tokens per step",
                    s.acceptance(),
                    s.tokens_per_step()
                );
                assert!(s.acceptance() >= min_acceptance, "{name}, k={k}: {s:?}");
            }
        }
    }
}

/// A draft model on the device plan drafts one fused step at a time inside its own verify
/// window (its steps run as one-row verify passes, which record the GDN states; a plain fused
/// step records nothing and the window could not close): greedy output with its drafts, the
/// main model on the device plan too, equals greedy output without, k = 1..3, with a draft
/// model that agrees (itself) and one that does not (the other architecture).
#[test]
fn a_draft_model_on_the_device_plan_keeps_greedy_output() {
    let main = load_device_plan("qwen3.5-tiny-4bit", DType::F32);
    let prompt = Reference::load("qwen3.5-tiny-4bit").ids("tf_ids")[..12].to_vec();
    let want = greedy(&main, &prompt, 24);
    for draft_name in ["qwen3.5-tiny-4bit", "qwen3-next-tiny-bf16"] {
        let draft = std::sync::Arc::new(load_device_plan(draft_name, DType::F32));
        assert!(draft.fused_decode() && draft.fused_verify(), "{draft_name}");
        for k in 1..=3 {
            let mut spec =
                Speculation::with_draft_model(&main, draft.clone(), 2048, DraftLength::Fixed(k))
                    .unwrap();
            let got = speculative_greedy(&main, &mut spec, &prompt, prompt.len() - 1, 24);
            assert_eq!(got, want, "draft {draft_name}, k={k}");
            eprintln!(
                "draft {draft_name}, k={k}: acceptance {:.3}",
                spec.stats.acceptance()
            );
        }
    }
}

/// `n` greedy tokens after `prompt` with `spec`'s drafts: `prompt[..tail_from]` prefilled,
/// the rest through `Speculation::start_from_prompt`, then speculative steps.
fn speculative_greedy(
    model: &Model,
    spec: &mut Speculation,
    prompt: &[u32],
    tail_from: usize,
    n: usize,
) -> Vec<u32> {
    let mut cache = model.new_cache();
    if tail_from > 0 {
        model
            .prefill(&prompt[..tail_from], &mut cache, 2048)
            .unwrap();
    }
    let logits = spec
        .start_from_prompt(model, &mut cache, prompt, tail_from)
        .unwrap();
    let first = argmax_rows(&logits)[0];
    let mut judge = Greedy(|row: &mut [f32], _: &[u32]| qwen_gdn_model::speculative::argmax(row));
    speculate_to(
        model,
        spec,
        &mut cache,
        vec![first],
        n,
        &mut judge,
        |_, _| {},
    )
}
