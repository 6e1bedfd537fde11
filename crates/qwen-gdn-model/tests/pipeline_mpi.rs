//! The pipeline plan's gate (issue 31): under `mpirun -np N` (scripts/test-mpi.sh runs 2 and
//! 3 ranks), every hybrid fixture split into N stages gives, over a chunked prefill and 64
//! greedy steps, bit for bit the f32 logits and the tokens of the whole model in one process
//! (which the last rank also loads, as the reference).
//!
//! `PIPELINE_TEST_FAULT=die:<rank>:<step>` or `stall:<rank>:<step>` makes that rank exit or
//! hang at that decode step of the first fixture: every other rank must then end with one
//! line (`rank R: ...`) and exit code 3 within the deadline ([`DEADLINE`]); the script checks.
//! On the GPU machine the same test runs as two NCCL ranks, one a GPU, with
//! `QWEN_GDN_TEST_DEVICE=cuda` (every stage and the reference on CUDA).
//! One test function: MPI is initialized once per process.

#![cfg(any(feature = "mpi", feature = "nccl"))]

mod common;

use common::ranks::{
    argmax, assert_bit_for_bit, assert_same_tokens_on_every_rank, fault, prompt, rank_world, say,
};

use candle_core::{Device, Tensor};
use qwen_gdn_model::pipeline::Pipeline;
use qwen_gdn_model::{Cache, Config, Model, ModelPart, RunOptions};
use std::time::Duration;

/// How long a rank waits for its neighbour before it gives up (the fault runs' bound).
const DEADLINE: Duration = Duration::from_secs(5);
const STEPS: usize = 64;
const CHUNK: usize = 5;

/// One forward call `(step index, tokens)` → the token every rank continues with, and this
/// rank's logits if it has them.
type Step<'a> = dyn FnMut(usize, &[u32]) -> anyhow::Result<(u32, Option<Tensor>)> + 'a;

/// Greedy generation through `step`: prefill all but the last prompt token in chunks, then
/// `STEPS` forward calls of one token; every call's logits (where this rank has them).
fn generate(
    prompt: &[u32],
    prefill: &mut dyn FnMut(&[u32]) -> anyhow::Result<()>,
    step: &mut Step,
) -> anyhow::Result<(Vec<u32>, Vec<Tensor>)> {
    let (last, head) = prompt.split_last().unwrap();
    prefill(head)?;
    let (mut tokens, mut logits) = (vec![], vec![]);
    let mut next = *last;
    for i in 0..STEPS {
        let (token, l) = step(i, &[next])?;
        tokens.push(token);
        logits.extend(l);
        next = token;
    }
    Ok((tokens, logits))
}

/// The options of a stage (`part`), and of the one-process reference (`ModelPart::Whole`): a
/// stage's decode step runs the composed layers (not the device plan's fused step, which spans
/// the whole model), so on a GPU the reference composes too; on the CPU in f32 (the reference
/// plan) the switch changes nothing.
fn stage_options(part: ModelPart) -> RunOptions {
    RunOptions {
        part,
        fused_decode: false,
        ..common::run_options()
    }
}

fn one_rank(dir: &std::path::Path, prompt: &[u32]) -> (Vec<u32>, Vec<Tensor>) {
    let model = Model::load(
        dir,
        &common::device_under_test(),
        &stage_options(ModelPart::Whole),
    )
    .unwrap();
    let mut cache = model.new_cache();
    let cache = std::cell::RefCell::new(&mut cache);
    generate(
        prompt,
        &mut |ids| model.prefill(ids, &mut cache.borrow_mut(), CHUNK),
        &mut |_, ids| {
            let logits = model.forward_last(ids, &mut cache.borrow_mut())?;
            Ok((argmax(&logits), Some(logits)))
        },
    )
    .unwrap()
}

/// One pipeline run; `Err` carries the one line a surviving rank ends with.
fn pipelined(
    pipeline: &Pipeline,
    model: &Model,
    cache: &mut Cache,
    prompt: &[u32],
    fault: Option<&(String, usize, usize)>,
) -> anyhow::Result<(Vec<u32>, Vec<Tensor>)> {
    let cache = std::cell::RefCell::new(cache);
    generate(
        prompt,
        &mut |ids| pipeline.prefill(model, ids, &mut cache.borrow_mut(), CHUNK),
        &mut |i, ids| {
            if let Some((kind, rank, at)) = fault {
                if *rank == pipeline.rank() && *at == i {
                    say(&format!(
                        "rank {rank}: test fault: {kind} at decode step {i}"
                    ));
                    if kind == "die" {
                        std::process::exit(0);
                    }
                    std::thread::sleep(DEADLINE * 20);
                }
            }
            let logits = pipeline.forward_last(model, ids, &mut cache.borrow_mut())?;
            let token = pipeline.share_token(logits.as_ref().map(argmax))?;
            Ok((token, logits))
        },
    )
}

#[test]
fn pipeline_equals_one_rank() {
    let world = rank_world(DEADLINE);
    let (rank, ranks) = (world.rank(), world.size());
    let fault = fault("PIPELINE_TEST_FAULT");
    for name in common::CHECKPOINTS {
        let dir = common::models_dir().join(name);
        let cfg = Config::from_dir(&dir).unwrap();
        let layers = cfg.num_hidden_layers;
        let pipeline = Pipeline::new(world.clone(), layers).unwrap();
        let part = pipeline.part(layers);
        let opts = stage_options(part.clone());
        let model = Model::load(&dir, &common::device_under_test(), &opts)
            .unwrap_or_else(|e| panic!("{name}, rank {rank}: {e:#}"));
        assert_eq!(model.layers().len(), part.layers(layers).len(), "{name}");
        pipeline.ensure_agreement(&model).unwrap();
        let ids = prompt(cfg.vocab_size, 12);
        let mut cache = model.new_cache();
        let (tokens, logits) = match pipelined(&pipeline, &model, &mut cache, &ids, fault.as_ref())
        {
            Ok(run) => run,
            Err(e) => {
                // The one line a surviving rank ends with.
                qwen_gdn_collective::ending_with_own_line();
                say(&format!("error: {e:#}"));
                std::process::exit(3);
            }
        };
        assert_same_tokens_on_every_rank(world.as_ref(), name, &tokens);
        if pipeline.is_last() {
            let (want_tokens, want_logits) = one_rank(&dir, &ids);
            assert_bit_for_bit(
                name,
                "layers",
                ranks,
                (&tokens, &logits),
                (&want_tokens, &want_logits),
            );
        } else {
            assert!(logits.is_empty());
        }
    }
    // A family the pipeline does not split yet is refused in one line.
    let dir = common::models_dir().join(common::QWEN4_EXP[0]);
    let opts = RunOptions {
        part: ModelPart::Stage {
            layers: 0..1,
            first: true,
            last: false,
        },
        ..common::run_options()
    };
    let err = Model::load(&dir, &Device::Cpu, &opts)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("hybrid family only"), "{err}");
}
