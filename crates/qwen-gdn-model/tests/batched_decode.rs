//! The batched decode step (issue 29): each sequence of a batch gives the logits and tokens it
//! gives alone, on every fixture, over 64 steps, with sequences of different lengths joining
//! and leaving mid-batch, one of them a prompt-cache hit joining at its cached position, and
//! each sampled with its own settings.
//!
//! - reference plan (f32, CPU): bit for bit, every step's logits (the batched products keep
//!   each row's one-row kernel, `weights::row_exact`);
//! - device plan in f32, against the same plan's composed single-sequence step: bit for bit
//!   with `BatchProducts::EachRowAlone`; with the default shared products (one GEMM over the
//!   rows, grouped experts) the same tokens and logits within 5e-5 of max|logit| (measured
//!   2.6e-6 to 1.75e-5 on the fixtures, printed);
//! - device plan in f32 with fused decode on (the batched step on the fused kernels), against
//!   the fused single-sequence step: bit for bit with `BatchProducts::EachRowAlone` (the
//!   state kernels run per sequence, the norms/adds per row); shared products within 5e-5
//!   (measured 2.0e-6 to 8.9e-6, printed). Breaking the batched attention (every sequence
//!   reading row 0's q/k/v) fails it on the tokens.

mod common;
use candle_core::{DType, Tensor};
use common::*;
use qwen_gdn_model::{Batch, BatchMoe, BatchProducts, Cache, Model, PromptCache};

/// How a sequence picks its next token: greedy, or sampled at `temp` from its own stream.
#[derive(Clone, Copy)]
struct Sampling {
    temp: f32,
    seed: u64,
}

impl Sampling {
    /// The next token from f32 logits `[1, vocab]` or `[vocab]`, advancing the seed.
    fn pick(&mut self, logits: &Tensor) -> u32 {
        let row = flat(logits);
        let argmax = |r: &[f32]| {
            r.iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &x)| if x > b.1 { (i, x) } else { b },
                )
                .0 as u32
        };
        if self.temp == 0.0 {
            return argmax(&row);
        }
        // xorshift64*: a uniform in [0, 1), then the inverse CDF of softmax(logits / temp).
        self.seed ^= self.seed >> 12;
        self.seed ^= self.seed << 25;
        self.seed ^= self.seed >> 27;
        let u = (self.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let weights: Vec<f64> = row
            .iter()
            .map(|&x| (((x - max) / self.temp) as f64).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        for (i, w) in weights.iter().enumerate() {
            acc += w / total;
            if u < acc {
                return i as u32;
            }
        }
        argmax(&row)
    }
}

/// One sequence of the schedule: its prompt, the step it joins at, how many tokens it
/// generates, how it samples, and whether it starts from a prompt-cache hit on `shared`.
struct Plan {
    prompt: Vec<u32>,
    joins_at: usize,
    tokens: usize,
    sampling: Sampling,
    cache_hit: bool,
}

const STEPS: usize = 64;

/// The schedule: different prompt lengths, joins at steps 0 to 6 and 10, leaves at 20 and at
/// the end, greedy and two temperatures, one prompt-cache hit.
fn plans(ids: &[u32], vocab: u32) -> (Vec<u32>, Vec<Plan>) {
    let shared: Vec<u32> = ids.iter().take(6).copied().collect();
    let mut hit = shared.clone();
    hit.extend([7 % vocab, 11 % vocab, 13 % vocab]);
    let greedy = Sampling { temp: 0.0, seed: 0 };
    let plans = vec![
        Plan {
            prompt: ids.iter().take(5).copied().collect(),
            joins_at: 0,
            tokens: STEPS,
            sampling: greedy,
            cache_hit: false,
        },
        Plan {
            prompt: vec![ids[1]],
            joins_at: 0,
            tokens: 20,
            sampling: Sampling {
                temp: 0.8,
                seed: 42,
            },
            cache_hit: false,
        },
        Plan {
            prompt: ids.iter().rev().take(9).copied().collect(),
            joins_at: 3,
            tokens: STEPS - 3,
            sampling: greedy,
            cache_hit: false,
        },
        Plan {
            prompt: hit,
            joins_at: 10,
            tokens: STEPS - 10,
            sampling: Sampling { temp: 1.3, seed: 7 },
            cache_hit: true,
        },
    ];
    // Six more greedy ones of lengths 2..7 joining at steps 1..6: up to ten rows a step, past
    // the row counts where the host products change kernel (5 and 8).
    let extra = (1..=6).map(|j| Plan {
        prompt: ids.iter().skip(j).take(j + 1).copied().collect(),
        joins_at: j,
        tokens: STEPS - j,
        sampling: greedy,
        cache_hit: false,
    });
    (shared, plans.into_iter().chain(extra).collect())
}

/// The cache a sequence starts from with all but its last prompt token in it: prefilled
/// from empty, or (a prompt-cache hit) restored from `cache`'s snapshot of `shared` and
/// continued from there.
fn start(model: &Model, plan: &Plan, cache: &mut PromptCache) -> Cache {
    let head = &plan.prompt[..plan.prompt.len() - 1];
    let (done, mut c) = match plan.cache_hit {
        true => cache
            .lookup(head)
            .unwrap()
            .expect("the shared prefix is cached"),
        false => (0, model.new_cache()),
    };
    assert_eq!(c.offset, done);
    if plan.cache_hit {
        assert!(done > 0, "a prompt-cache hit starts past position 0");
    }
    if head.len() > done {
        model.prefill(&head[done..], &mut c, 2048).unwrap();
    }
    c
}

/// Each sequence alone: its logits per step and its tokens.
fn alone(model: &Model, plan: &Plan, cache: &mut PromptCache) -> (Vec<Tensor>, Vec<u32>) {
    let mut c = start(model, plan, cache);
    let mut sampling = plan.sampling;
    let mut last = *plan.prompt.last().unwrap();
    let (mut logits, mut tokens) = (vec![], vec![]);
    for _ in 0..plan.tokens {
        let l = model.forward_last(&[last], &mut c).unwrap();
        last = sampling.pick(&l);
        logits.push(l);
        tokens.push(last);
    }
    (logits, tokens)
}

/// All of them in one batch on the schedule: per sequence, its logits per step and tokens.
fn batched(model: &Model, plans: &[Plan], cache: &mut PromptCache) -> Vec<(Vec<Tensor>, Vec<u32>)> {
    let mut batch = Batch::new();
    let mut slots = vec![None; plans.len()];
    let mut state: Vec<(Sampling, u32)> = plans
        .iter()
        .map(|p| (p.sampling, *p.prompt.last().unwrap()))
        .collect();
    let mut out: Vec<(Vec<Tensor>, Vec<u32>)> = plans.iter().map(|_| (vec![], vec![])).collect();
    for step in 0..STEPS {
        for (i, plan) in plans.iter().enumerate() {
            if plan.joins_at == step {
                slots[i] = Some(batch.join(start(model, plan, cache)));
            }
        }
        let live: Vec<usize> = (0..plans.len()).filter(|&i| slots[i].is_some()).collect();
        let next: Vec<_> = live
            .iter()
            .map(|&i| (slots[i].unwrap(), state[i].1))
            .collect();
        let logits = batch.step(model, &next).unwrap();
        assert_eq!(logits.dims(), &[live.len(), model.config().vocab_size]);
        for (row, &i) in live.iter().enumerate() {
            let l = logits.narrow(0, row, 1).unwrap();
            let token = state[i].0.pick(&l);
            state[i].1 = token;
            out[i].0.push(l);
            out[i].1.push(token);
            if out[i].1.len() == plans[i].tokens {
                let left = batch.leave(slots[i].take().unwrap()).unwrap();
                assert_eq!(left.offset, plans[i].prompt.len() - 1 + plans[i].tokens);
            }
        }
    }
    assert!(batch.is_empty(), "every sequence left");
    out
}

/// The batch against each sequence alone: the largest logit difference (relative to
/// max|logit|) over every step of every sequence; tokens must be equal.
fn compare(name: &str, model: &Model) -> f32 {
    let reference = Reference::load(name);
    let ids = reference.ids("tf_ids");
    let (shared, plans) = plans(&ids, model.config().vocab_size as u32);
    let mut cache = PromptCache::new(1 << 30);
    let mut prefix = model.new_cache();
    model.prefill(&shared, &mut prefix, 2048).unwrap();
    cache.insert(&shared, &prefix).unwrap();
    let together = batched(model, &plans, &mut cache);
    let mut worst = 0f32;
    for (i, plan) in plans.iter().enumerate() {
        let (logits, tokens) = alone(model, plan, &mut cache);
        assert_eq!(tokens, together[i].1, "{name}: sequence {i}: tokens");
        for (a, b) in together[i].0.iter().zip(&logits) {
            worst = worst.max(rel_max_diff(a, b));
        }
    }
    worst
}

fn reference_plan(name: &str) {
    let model = load(name);
    let d = compare(name, &model);
    eprintln!("{name}: reference plan, batch vs alone: {d:e}");
    assert_eq!(
        d, 0.0,
        "{name}: the batched reference step differs from each sequence alone"
    );
}

/// A forward pass runs under its caller's modes, whatever the pool worker that picks it up
/// was doing. Every worker here is left in the row-exact mode (as one is while it waits
/// inside a batched step, when rayon hands it another caller's pass): a prefill from this
/// thread must still give the bits it gives with the workers clean. Before the modes were
/// entered on the worker (`Model::on_host_workers`), this prefill ran the row-exact products
/// and `batched_decode` failed now and then by 1e-5 of max|logit|.
#[test]
fn a_pass_runs_under_its_callers_modes() {
    let name = "qwen3.5-tiny-4bit";
    let model = load(name);
    let prompt: Vec<u32> = Reference::load(name).ids("tf_ids");
    let prefill = || {
        let mut cache = model.new_cache();
        flat(&model.forward(&prompt, &mut cache).unwrap())
    };
    let clean = prefill();
    let row_exact = {
        let _rows = qwen_gdn_model::weights::row_exact::scope(true);
        prefill()
    };
    assert_ne!(
        clean, row_exact,
        "{name}: the row-exact products give the same prefill bits, so this test could not fail"
    );
    let leave_workers_in = |on: bool| {
        gdn_ops::threads::on_cpu_pool(|| {
            rayon::broadcast(|_| std::mem::forget(qwen_gdn_model::weights::row_exact::scope(on)))
        });
    };
    leave_workers_in(true);
    let under_busy_workers = prefill();
    leave_workers_in(false);
    assert_eq!(
        clean, under_busy_workers,
        "{name}: a prefill took the pool worker's row-exact mode instead of its caller's"
    );
}

fn device_plan_f32(name: &str) {
    let mut model = load_on(name, &device_plan(DType::F32), &device_under_test());
    // The batched step runs the composed ops: the same ops alone are its reference.
    model.set_fused_decode(false);
    assert_eq!(model.batch_products(), BatchProducts::Shared);
    shared_and_row_exact(name, &mut model, "composed");
}

/// The device plan with fused decode on: the batched step runs the fused kernels
/// (`families/hybrid/batch_decode.rs`) and its reference is the fused single-sequence step.
fn device_plan_fused_f32(name: &str) {
    let mut model = load_on(name, &device_plan(DType::F32), &device_under_test());
    assert!(
        model.fused_decode(),
        "{name}: the device plan decodes fused"
    );
    shared_and_row_exact(name, &mut model, "fused");
}

/// The batched device step against the same step alone (`what`: composed or fused), with
/// the default shared products, then each row's alone: bit-exact with rows alone; shared
/// products reorder sums (GEMMs, grouped experts), so within 5e-5 of max|logit| (the tokens
/// were checked equal).
fn shared_and_row_exact(name: &str, model: &mut Model, what: &str) {
    let shared = compare(name, model);
    model.set_batch_products(BatchProducts::EachRowAlone);
    let exact = compare(name, model);
    eprintln!(
        "{name}: device plan f32, batch vs {what} alone: shared products {shared:e}, each row alone {exact:e}"
    );
    assert_eq!(
        exact, 0.0,
        "{name}: the row-exact batched device step ({what}) is not bit-exact"
    );
    assert!(
        shared <= 5e-5,
        "{name}: batched device step ({what}) differs by {shared:e}"
    );
}

/// Issue 29's exactness gate for the quantized products past `MATVEC_MAX_ROWS` rows: with the
/// row products (`DenseRows::RowProducts`, what `auto` runs up to 8 rows) every product of the
/// fused batched step is a row's own (the MoE's gathered kernels are per pair already), so the
/// default shared products are bit for bit each sequence alone, over steps of up to ten rows.
fn device_fused_row_products(name: &str) {
    use gdn_ops::ops::affine::{dense_rows_scope, DenseRows};
    let model = load_on(name, &device_plan(DType::F32), &device_under_test());
    assert!(
        model.fused_decode(),
        "{name}: the device plan decodes fused"
    );
    assert_eq!(model.batch_products(), BatchProducts::Shared);
    let _rows = dense_rows_scope(DenseRows::RowProducts);
    let diff = compare(name, &model);
    eprintln!("{name}: fused batch, dense row products, vs alone: {diff:e}");
    assert_eq!(
        diff, 0.0,
        "{name}: the batched step with dense row products is not bit-exact"
    );
}

per_checkpoint!(reference => reference_plan, device => device_plan_f32, device_fused => device_plan_fused_f32);

/// The quantized fixtures (float checkpoints' dense weights run one GEMM over the rows).
mod device_fused_rows {
    #[test]
    fn qwen3_next_4bit() {
        super::device_fused_row_products("qwen3-next-tiny-4bit")
    }

    #[test]
    fn qwen35_dense_4bit_tied() {
        super::device_fused_row_products("qwen3.5-tiny-4bit")
    }

    #[test]
    fn qwen35_moe_4bit() {
        super::device_fused_row_products("qwen3.5-moe-tiny-4bit")
    }
}

/// Split-K forced on every dense product past 8 rows (`QWEN_GDN_DENSE_ROWS=split`): `auto`
/// keeps the fixtures' small matrices on the row products (`dense_rows.rs`'s short-matrix
/// rule), so this is where the fused batched step still runs the split kernel over its steps
/// of 9 and 10 rows: each sequence's tokens, and its logits within the shared products' gate.
fn device_fused_split_k(name: &str) {
    use gdn_ops::ops::affine::{dense_rows_scope, DenseRows};
    let model = load_on(name, &device_plan(DType::F32), &device_under_test());
    assert!(
        model.fused_decode(),
        "{name}: the device plan decodes fused"
    );
    let _split = dense_rows_scope(DenseRows::SplitK);
    let diff = compare(name, &model);
    eprintln!("{name}: fused batch, split-K dense products, vs alone: {diff:e}");
    assert!(
        diff <= 5e-5,
        "{name}: the batched step on split-K differs by {diff:e}"
    );
}

/// The 4-bit Qwen3.5 fixtures (the Qwen3-Next one has a known near-tie under shared products
/// on CUDA: `device_fused::qwen3_next_4bit`).
mod device_fused_split_k {
    #[test]
    fn qwen35_dense_4bit_tied() {
        super::device_fused_split_k("qwen3.5-tiny-4bit")
    }

    #[test]
    fn qwen35_moe_4bit() {
        super::device_fused_split_k("qwen3.5-moe-tiny-4bit")
    }
}

/// `BatchMoe::Grouped`: the fused batched step runs its MoE blocks on the prefill's
/// expert-grouped products (composed ops, routing read back) instead of the gathered kernels;
/// each sequence still gets its own tokens and logits within the shared products' gate
/// (5e-5 of max|logit|), and under `EachRowAlone` the rows are gathered again, bit for bit.
fn device_fused_grouped_moe(name: &str) {
    let mut model = load_on(name, &device_plan(DType::F32), &device_under_test());
    assert!(
        model.fused_decode(),
        "{name}: the device plan decodes fused"
    );
    let launches = |model: &Model| {
        let mut caches: Vec<Cache> = (0..3u32)
            .map(|i| {
                let mut c = model.new_cache();
                model.prefill(&[1, 2, 3 + i], &mut c, 16).unwrap();
                c
            })
            .collect();
        let mut refs: Vec<&mut Cache> = caches.iter_mut().collect();
        model
            .decode_batch_with_launches(&[5, 6, 7], &mut refs)
            .unwrap()
            .1
    };
    let gathered = launches(&model);
    model.set_batch_moe(BatchMoe::Grouped);
    let grouped = launches(&model);
    assert_ne!(
        gathered, grouped,
        "{name}: the grouped MoE ran the same launches as the gathered one"
    );
    shared_and_row_exact(name, &mut model, "fused, grouped MoE");
}

mod device_fused_grouped_moe {
    #[test]
    fn qwen3_next_4bit() {
        super::device_fused_grouped_moe("qwen3-next-tiny-4bit")
    }

    #[test]
    fn qwen35_moe_4bit() {
        super::device_fused_grouped_moe("qwen3.5-moe-tiny-4bit")
    }
}

mod qwen4_exp {
    #[test]
    fn reference_plan_hf() {
        super::reference_plan("qwen4-exp-tiny-hf")
    }

    #[test]
    fn reference_plan_4bit() {
        super::reference_plan("qwen4-exp-tiny-4bit")
    }
}

#[test]
fn bad_batches_are_refused() {
    let model = load("qwen3.5-tiny-4bit");
    let mut batch = Batch::new();
    let a = batch.join(model.new_cache());
    let e = batch.step(&model, &[(a, 1), (a, 2)]).unwrap_err();
    assert!(format!("{e}").contains("twice"), "{e}");
    let gone = batch.join(model.new_cache());
    batch.leave(gone).unwrap();
    let e = batch.step(&model, &[(gone, 1)]).unwrap_err();
    assert!(format!("{e}").contains("not in the batch"), "{e}");
    let vocab = model.config().vocab_size as u32;
    let e = batch.step(&model, &[(a, vocab)]).unwrap_err();
    assert!(format!("{e}").contains("outside the vocabulary"), "{e}");
    assert_eq!(
        batch.cache(a).unwrap().offset,
        0,
        "a refused step changes nothing"
    );
}

/// Qwen3-Next's 4-bit fixture on the device plan (fused decode) and `sequences` caches, each
/// after its own four-token prompt.
fn fused_next_with_sequences(sequences: usize) -> (Model, Vec<Cache>) {
    let model = load_on(
        "qwen3-next-tiny-4bit",
        &device_plan(DType::F32),
        &device_under_test(),
    );
    assert!(model.fused_decode(), "the device plan decodes fused");
    let caches = (0..sequences as u32)
        .map(|i| {
            let mut c = model.new_cache();
            model.prefill(&[1, 2, 3, 4 + i], &mut c, 16).unwrap();
            c
        })
        .collect();
    (model, caches)
}

/// The fused batched step in steady state uploads one thing a step, the sequences' positions:
/// the slot kernels' address tables are uploaded at the first step of a batch composition and
/// reused after it (`gdn_ops::slot_tables`); a sequence leaving changes every table once.
/// Counted on the device under test (the CPU twins look tables up as the CUDA launchers do).
#[test]
fn steady_batched_steps_upload_only_the_positions() {
    use gdn_ops::launches::uploads;
    gdn_ops::slot_tables::clear();
    let (model, mut caches) = fused_next_with_sequences(3);
    let step = |caches: &mut [Cache]| {
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let tokens = vec![5u32; refs.len()];
        let before = uploads();
        // The eager step (counted launches: never a CUDA graph's replay).
        model
            .decode_batch_with_launches(&tokens, &mut refs)
            .unwrap();
        uploads() - before
    };
    let layers = model.config().num_hidden_layers;
    let first = step(&mut caches);
    // The positions, and two tables a layer (conv front and recurrence; prep and decode).
    assert_eq!(first, 1 + 2 * layers, "the first step of a composition");
    for i in 0..4 {
        assert_eq!(step(&mut caches), 1, "steady step {i}");
    }
    caches.pop();
    assert_eq!(step(&mut caches), 1 + 2 * layers, "a sequence left");
    assert_eq!(step(&mut caches), 1, "steady after the leave");
}

/// Issue 29: past `MATVEC_MAX_ROWS` rows (six sequences here) the batched step's MoE stays on
/// the gathered kernels: no routing read back to the host (the composed path read the top-k
/// ids back once a MoE layer), and every steady step launches as many kernels.
#[test]
fn batched_moe_past_four_rows_reads_nothing_back() {
    use gdn_ops::launches::{count, read_backs};
    use gdn_ops::ops::affine::{GATHER_MAX_TOKENS, MATVEC_MAX_ROWS};
    let rows = MATVEC_MAX_ROWS + 2;
    assert!(rows <= GATHER_MAX_TOKENS);
    let (model, mut caches) = fused_next_with_sequences(rows);
    let mut step = || {
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let tokens = vec![5u32; refs.len()];
        let (reads, launches) = (read_backs(), count());
        // The eager step (counted launches: never a CUDA graph's replay).
        model
            .decode_batch_with_launches(&tokens, &mut refs)
            .unwrap();
        (read_backs() - reads, count() - launches)
    };
    // The first step of a composition creates the positions' buffer (one copy fewer).
    step();
    let (_, steady) = step();
    for i in 0..3 {
        let (reads, launches) = step();
        assert_eq!(
            reads, 0,
            "step {i}: {reads} read-backs in a batched step of {rows} rows"
        );
        assert_eq!(
            launches, steady,
            "step {i}: launches differ from a steady step's"
        );
    }
}

/// Issue 29 on CUDA: the batched step is a graph per batch size. Three sequences step from
/// one capture (the first step eager and captured, the rest replayed), a sequence leaving
/// makes the two left capture a graph of their own, and every step gives the logits of the
/// same step run eagerly (within 1e-5 of max|logit|; the same tokens).
#[cfg(feature = "cuda")]
#[test]
fn batched_steps_replay_a_graph_per_batch_size() {
    use qwen_gdn_model::cuda_graph::{captures, enabled, replays};
    if !device_under_test().is_cuda() {
        return;
    }
    let (model, mut graphed) = fused_next_with_sequences(3);
    let mut eager: Vec<Cache> = (0..3u32)
        .map(|i| {
            let mut c = model.new_cache();
            model.prefill(&[1, 2, 3, 4 + i], &mut c, 16).unwrap();
            c
        })
        .collect();
    let mut tokens = vec![5u32, 6, 7];
    let mut steps = |graphed: &mut [Cache], eager: &mut [Cache], n: usize| {
        let before = (captures(), replays());
        for step in 0..n {
            let rows = graphed.len();
            let mut g: Vec<&mut Cache> = graphed.iter_mut().collect();
            let got = model.decode_batch(&tokens[..rows], &mut g).unwrap();
            let mut e: Vec<&mut Cache> = eager.iter_mut().collect();
            let (want, _) = model
                .decode_batch_with_launches(&tokens[..rows], &mut e)
                .unwrap();
            let d = rel_max_diff(&got, &want);
            assert!(d <= 1e-5, "step {step} of {rows}: graph vs eager {d:e}");
            let picked = argmax_rows(&got);
            assert_eq!(picked, argmax_rows(&want), "step {step} of {rows}");
            tokens[..rows].copy_from_slice(&picked);
        }
        (captures() - before.0, replays() - before.1)
    };
    assert_eq!(
        steps(&mut graphed, &mut eager, 5),
        (1, 4),
        "three sequences"
    );
    graphed.pop();
    eager.pop();
    assert_eq!(steps(&mut graphed, &mut eager, 4), (1, 3), "two sequences");
    assert!(enabled(), "a capture failed: graphs turned off");
}
