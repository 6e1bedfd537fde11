//! The prompt cache over ranks (issue 31): under `mpirun -np N` (scripts/test-mpi.sh runs 2 and
//! 3 ranks), every rank keeps its own [`PromptCache`] of its own shard of the state (a
//! pipeline stage its layers, a tensor rank its heads' GDN and KV state, an expert rank the
//! whole state beside its experts). On every hybrid fixture and plan:
//! - request A (a shared prefix, then its own suffix) runs cold and snapshots the prefix on
//!   every rank;
//! - request B (the same prefix, another suffix) hits at the prefix on every rank
//!   ([`lookup_on_every_rank`]), restores each rank's shard and gives, over 16 greedy steps,
//!   bit for bit the tokens and f32 logits of B run cold over the same ranks and of B run cold
//!   in one process (which the reporting rank also loads);
//! - when one rank has lost its snapshot (cleared, as an eviction would), every rank misses.
//!
//! One test function: MPI is initialized once per process.

#![cfg(any(feature = "mpi", feature = "nccl"))]

mod common;

use common::ranks::{argmax, assert_same_tokens_on_every_rank, bits, prompt, rank_world, say};

use candle_core::{Device, Tensor};
use qwen_gdn_collective::World;
use qwen_gdn_model::expert_parallel::ExpertParallel;
use qwen_gdn_model::pipeline::Pipeline;
use qwen_gdn_model::prompt_cache::lookup_on_every_rank;
use qwen_gdn_model::split_plan::SplitPlan;
use qwen_gdn_model::tensor_and_experts::TensorAndExperts;
use qwen_gdn_model::tensor_parallel::TensorParallel;
use qwen_gdn_model::{Cache, Config, Model, PromptCache, RunOptions};
use std::time::Duration;

/// How long a rank waits for another before it gives up.
const DEADLINE: Duration = Duration::from_secs(5);
const STEPS: usize = 16;
const CHUNK: usize = 5;
/// The prefix requests A and B share (where A's snapshot is taken), and their suffixes.
const PREFIX: usize = 16;
const SUFFIX_A: usize = 5;
const SUFFIX_B: usize = 7;

/// How this rank runs its forward calls.
enum Plan {
    /// The whole model in this process (the reference).
    Single,
    Pipeline(Pipeline),
    Split(Box<dyn SplitPlan>),
}

impl Plan {
    fn part(&self, layers: usize) -> qwen_gdn_model::ModelPart {
        match self {
            Self::Single => qwen_gdn_model::ModelPart::Whole,
            Self::Pipeline(p) => p.part(layers),
            Self::Split(s) => s.part(),
        }
    }

    fn ready(&self, model: &mut Model) -> anyhow::Result<()> {
        match self {
            Self::Single => Ok(()),
            Self::Pipeline(p) => p.ensure_agreement(model),
            Self::Split(s) => {
                s.apply(model)?;
                s.ensure_agreement(model)
            }
        }
    }

    /// Whether this rank reports (and checks against one process): the pipeline's last stage,
    /// a split plan's rank 0.
    fn reports(&self, rank: usize) -> bool {
        match self {
            Self::Pipeline(p) => p.is_last(),
            Self::Single | Self::Split(_) => rank == 0,
        }
    }

    fn prefill(&self, model: &Model, ids: &[u32], cache: &mut Cache) -> anyhow::Result<()> {
        match self {
            Self::Pipeline(p) => p.prefill(model, ids, cache, CHUNK),
            Self::Single | Self::Split(_) => model.prefill(ids, cache, CHUNK),
        }
    }

    /// One decode step: the token every rank continues with, this rank's logits if any.
    fn step(
        &self,
        model: &Model,
        token: u32,
        cache: &mut Cache,
    ) -> anyhow::Result<(u32, Option<Tensor>)> {
        match self {
            Self::Pipeline(p) => {
                let logits = p.forward_last(model, &[token], cache)?;
                Ok((p.share_token(logits.as_ref().map(argmax))?, logits))
            }
            Self::Single | Self::Split(_) => {
                let logits = model.forward_last(&[token], cache)?;
                Ok((argmax(&logits), Some(logits)))
            }
        }
    }
}

/// What one request gave on this rank.
struct Run {
    tokens: Vec<u32>,
    logits: Vec<Vec<u32>>,
}

/// One request `ids` from `cache` (which has processed `ids[..cache.offset]`): the rest of the
/// prompt prefilled (cut at [`PREFIX`] when the cache starts before it, the engine's cut at a
/// snapshot boundary, where `snapshot` keeps the prefix's state), then greedy steps.
fn request(
    plan: &Plan,
    model: &Model,
    ids: &[u32],
    mut cache: Cache,
    snapshot: Option<&mut PromptCache>,
) -> anyhow::Result<Run> {
    let (last, head) = ids.split_last().unwrap();
    if cache.offset < PREFIX {
        plan.prefill(model, &head[cache.offset..PREFIX], &mut cache)?;
        if let Some(pc) = snapshot {
            pc.insert(&ids[..PREFIX], &cache)?;
        }
    }
    plan.prefill(model, &head[cache.offset..], &mut cache)?;
    let mut run = Run {
        tokens: vec![],
        logits: vec![],
    };
    let mut next = *last;
    for _ in 0..STEPS {
        let (token, logits) = plan.step(model, next, &mut cache)?;
        run.tokens.push(token);
        run.logits.extend(logits.as_ref().map(bits));
        next = token;
    }
    Ok(run)
}

/// `result`'s value, or a panic naming `at` (fixture, plan, rank) and the error.
fn must<T>(result: anyhow::Result<T>, at: &str) -> T {
    result.unwrap_or_else(|e| panic!("{at}: {e:#}"))
}

fn assert_same(name: &str, what: &str, got: &Run, want: &Run) {
    assert_eq!(got.tokens, want.tokens, "{name}: {what}: tokens differ");
    assert_eq!(got.logits.len(), want.logits.len(), "{name}: {what}: steps");
    for (i, (g, w)) in got.logits.iter().zip(&want.logits).enumerate() {
        assert!(g == w, "{name}: {what}: step {i}: f32 logits differ");
    }
}

/// The plans to run on fixture `cfg`: the pipeline and the heads on every one, the experts
/// alone and with the heads on the MoE ones.
fn plans(world: &World, cfg: &Config) -> Vec<(&'static str, Plan)> {
    let mut plans = vec![
        (
            "pipeline",
            Plan::Pipeline(Pipeline::new(world.clone(), cfg.num_hidden_layers).unwrap()),
        ),
        (
            "tensor",
            Plan::Split(Box::new(TensorParallel::new(world.clone(), cfg).unwrap())),
        ),
    ];
    if cfg.num_experts > 0 {
        plans.push((
            "experts",
            Plan::Split(Box::new(
                ExpertParallel::new(world.clone(), cfg.num_experts).unwrap(),
            )),
        ));
        plans.push((
            "tensor-experts",
            Plan::Split(Box::new(TensorAndExperts::new(world.clone(), cfg).unwrap())),
        ));
    }
    plans
}

#[test]
fn prompt_cache_resumes_bit_for_bit_on_every_rank() {
    let world = rank_world(DEADLINE);
    let (rank, ranks) = (world.rank(), world.size());
    for name in common::CHECKPOINTS {
        let dir = common::models_dir().join(name);
        let cfg = Config::from_dir(&dir).unwrap();
        let ids = prompt(cfg.vocab_size, PREFIX + SUFFIX_A + SUFFIX_B);
        let a: Vec<u32> = ids[..PREFIX + SUFFIX_A].to_vec();
        let b: Vec<u32> = ids[..PREFIX]
            .iter()
            .chain(&ids[PREFIX + SUFFIX_A..])
            .copied()
            .collect();
        let mut one_process = None;
        for (kind, plan) in plans(&world, &cfg) {
            let opts = RunOptions {
                part: plan.part(cfg.num_hidden_layers),
                ..common::run_options()
            };
            let mut model = Model::load(&dir, &Device::Cpu, &opts)
                .unwrap_or_else(|e| panic!("{name}, rank {rank}: {e:#}"));
            plan.ready(&mut model).unwrap();
            let at = format!("{name}, {kind}, rank {rank}");
            let mut pc = PromptCache::new(1 << 40);
            must(
                request(&plan, &model, &a, model.new_cache(), Some(&mut pc)),
                &at,
            );
            assert_eq!(pc.snapshot_lengths(), [PREFIX], "{name}: {kind}");
            let shard_bytes = must(world.all_gather_u64(pc.bytes()), &at);

            let (cached, cache) = must(lookup_on_every_rank(&mut pc, world.as_ref(), &b), &at)
                .unwrap_or_else(|| panic!("{name}: {kind}: rank {rank} missed the prefix"));
            assert_eq!((cached, cache.offset), (PREFIX, PREFIX), "{name}: {kind}");
            let resumed = must(request(&plan, &model, &b, cache, None), &at);
            let cold = must(request(&plan, &model, &b, model.new_cache(), None), &at);
            assert_same(
                name,
                &format!("{kind}: resumed vs cold over ranks"),
                &resumed,
                &cold,
            );
            assert_same_tokens_on_every_rank(world.as_ref(), name, &resumed.tokens);
            if plan.reports(rank) {
                let (want, whole_bytes) = one_process.get_or_insert_with(|| {
                    let whole = Model::load(&dir, &Device::Cpu, &common::run_options()).unwrap();
                    let mut pc = PromptCache::new(1 << 40);
                    request(&Plan::Single, &whole, &a, whole.new_cache(), Some(&mut pc)).unwrap();
                    let b = request(&Plan::Single, &whole, &b, whole.new_cache(), None).unwrap();
                    (b, pc.bytes())
                });
                assert_same(
                    name,
                    &format!("{kind}: resumed vs one process"),
                    &resumed,
                    want,
                );
                // Each rank kept its own shard: the pipeline's stages' layers add up to the
                // whole state (each holding the prefix's tokens), a head split's are smaller.
                let token_bytes = (PREFIX * 4) as u64;
                match &plan {
                    Plan::Pipeline(_) => assert_eq!(
                        shard_bytes.iter().map(|b| b - token_bytes).sum::<u64>(),
                        *whole_bytes - token_bytes,
                        "{name}: {kind}: the stages' snapshots are not the whole state split"
                    ),
                    _ if kind.starts_with("tensor") => assert!(
                        shard_bytes.iter().all(|b| b < whole_bytes),
                        "{name}: {kind}: a rank's snapshot {shard_bytes:?} is not a shard of \
                         the whole state's {whole_bytes}"
                    ),
                    _ => {}
                }
                say(&format!(
                    "{name}: {kind} over {ranks} ranks: a request resumed from each rank's \
                     snapshot at {PREFIX} tokens = cold over ranks = cold in one process \
                     ({STEPS} greedy steps, tokens and f32 logits bit for bit)"
                ));
            }

            // One rank lost its snapshot: every rank misses, none waits for the others.
            if rank + 1 == ranks {
                pc.clear();
            }
            let found = must(lookup_on_every_rank(&mut pc, world.as_ref(), &b), &at);
            assert!(found.is_none(), "{name}: {kind}: rank {rank} hit alone");
        }
    }
}
