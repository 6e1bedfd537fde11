//! The tensor-parallel plan's gate (issue 31): under `mpirun -np N` (scripts/test-mpi.sh runs
//! 2 and 3 ranks), every hybrid fixture with its GDN value heads and attention query heads
//! split over N ranks gives, over a chunked prefill and 64 greedy steps, bit for bit the f32
//! logits and the tokens of the whole model in one process (which rank 0 also loads, as the
//! reference), on every rank. (The issue asks 1e-5 of max|logit|; the gather is exact by
//! construction: layers/head_shard.rs.) The MoE fixtures also run with their experts split
//! too (`--parallel tensor-experts`, each rank reading only its experts). On 3 ranks the fixtures' 4 heads split 2 / 1 / 1, so
//! the second and third ranks both hold the key head their heads share. qwen4_exp is refused
//! in one line. (A rank that dies or stalls in a reduction: the same bounded sum as the
//! expert plan's, whose faults `experts_mpi` injects.)
//! One test function: MPI is initialized once per process.

#![cfg(any(feature = "mpi", feature = "nccl"))]

mod common;

use common::ranks::{
    assert_bit_for_bit, assert_same_tokens_on_every_rank, greedy, prompt, rank_world, say,
};

use candle_core::Device;
use qwen_gdn_model::split_plan::SplitPlan;
use qwen_gdn_model::tensor_and_experts::TensorAndExperts;
use qwen_gdn_model::tensor_parallel::TensorParallel;
use qwen_gdn_model::{Config, Model, RunOptions};
use std::time::Duration;

/// How long a rank waits in a reduction before it gives up.
const DEADLINE: Duration = Duration::from_secs(5);
const STEPS: usize = 64;
const CHUNK: usize = 5;

#[test]
fn tensor_parallel_equals_one_rank() {
    let world = rank_world(DEADLINE);
    let (rank, ranks) = (world.rank(), world.size());
    for name in common::CHECKPOINTS {
        let dir = common::models_dir().join(name);
        let cfg = Config::from_dir(&dir).unwrap();
        // The heads alone, and on an MoE fixture the heads and the experts together.
        let mut plans: Vec<(&str, Box<dyn SplitPlan>)> = vec![(
            "heads",
            Box::new(TensorParallel::new(world.clone(), &cfg).unwrap()),
        )];
        if cfg.num_experts > 0 {
            plans.push((
                "heads and experts",
                Box::new(TensorAndExperts::new(world.clone(), &cfg).unwrap()),
            ));
        }
        let ids = prompt(cfg.vocab_size, 12);
        let want = (rank == 0).then(|| {
            let whole = Model::load(&dir, &Device::Cpu, &common::run_options()).unwrap();
            greedy(&whole, &ids, STEPS, CHUNK, &mut |_| {}).unwrap()
        });
        for (what, plan) in plans {
            let opts = RunOptions {
                part: plan.part(),
                ..common::run_options()
            };
            let mut model = Model::load(&dir, &Device::Cpu, &opts)
                .unwrap_or_else(|e| panic!("{name}, rank {rank}: {e:#}"));
            plan.apply(&mut model).unwrap();
            plan.ensure_agreement(&model).unwrap();
            say(&format!("{name}: {}", plan.layout_line("localhost")));
            let (tokens, logits) = greedy(&model, &ids, STEPS, CHUNK, &mut |_| {})
                .unwrap_or_else(|e| panic!("{name}, rank {rank}: {e:#}"));
            assert_same_tokens_on_every_rank(world.as_ref(), name, &tokens);
            if let Some((want_tokens, want_logits)) = &want {
                assert_bit_for_bit(
                    name,
                    what,
                    ranks,
                    (&tokens, &logits),
                    (want_tokens, want_logits),
                );
            }
        }
    }
    // qwen4_exp's mixers are not split: refused in one line.
    let qwen4 = common::models_dir().join(common::QWEN4_EXP[0]);
    let err = TensorParallel::new(world.clone(), &Config::from_dir(&qwen4).unwrap())
        .err()
        .expect("qwen4_exp refused")
        .to_string();
    assert!(
        err.contains("tensor parallel") && !err.contains('\n'),
        "{err}"
    );
}
