//! What the tests run between processes (under `mpirun`, or as NCCL ranks) share (`pipeline_mpi`, `experts_mpi`): the f32 logits'
//! bits, the greedy pick, one-write lines on the merged stderr, the prompt, and the injected
//! fault of the dead-or-stalled-rank runs.

use candle_core::{DType, Tensor};

pub fn argmax(logits: &Tensor) -> u32 {
    let v = logits.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

pub fn bits(t: &Tensor) -> Vec<u32> {
    assert_eq!(t.dtype(), DType::F32);
    let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

/// Writes `line` to stderr in one write: mpirun merges the ranks' stderr, and a line written in
/// pieces would interleave with another rank's.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// A fault to inject, from the variable `var` (`die|stall:<rank>:<step>`): (kind, rank,
/// decode step).
pub fn fault(var: &str) -> Option<(String, usize, usize)> {
    let spec = std::env::var(var).ok()?;
    let parts: Vec<&str> = spec.split(':').collect();
    match parts[..] {
        [kind, rank, step] if kind == "die" || kind == "stall" => Some((
            kind.to_string(),
            rank.parse().expect("fault rank"),
            step.parse().expect("fault step"),
        )),
        _ => panic!("{var}={spec}: expected die|stall:<rank>:<step>"),
    }
}

/// The prompt: `len` ids spread over the vocabulary.
pub fn prompt(vocab: usize, len: usize) -> Vec<u32> {
    (0..len).map(|i| ((i * 7919 + 11) % vocab) as u32).collect()
}

/// This process's rank of the job, its collectives bounded by `deadline`, shared as the plans
/// hold it: an `mpirun` job's (the `mpi` feature, scripts/test-mpi.sh), or one of the NCCL ranks
/// this test binary starts of itself, one a GPU (the `nccl` feature on the GPU machine:
/// `QWEN_GDN_TEST_RANKS` ranks, 2 unless set; the first process launches and ends with the
/// job's exit code). A failed check on one rank then ends the process at once: the launcher
/// stops the job, instead of the other ranks waiting forever in the next collective.
#[cfg(any(feature = "mpi", feature = "nccl"))]
pub fn rank_world(deadline: std::time::Duration) -> qwen_gdn_collective::World {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::exit(101);
    }));
    #[cfg(feature = "nccl")]
    {
        match qwen_gdn_collective::NcclRankEnv::from_env().unwrap() {
            Some(env) => qwen_gdn_collective::NcclWorld::launched(&env, deadline).unwrap(),
            None => {
                let ranks = std::env::var("QWEN_GDN_TEST_RANKS").map_or(2, |n| n.parse().unwrap());
                let exe = std::env::current_exe().unwrap();
                let args: Vec<String> = std::env::args().skip(1).collect();
                let code = qwen_gdn_collective::run_nccl_job(ranks, &exe, &args).unwrap();
                std::process::exit(code);
            }
        }
    }
    #[cfg(not(feature = "nccl"))]
    {
        qwen_gdn_collective::MpiWorld::launched(deadline).unwrap()
    }
}

/// Greedy generation on `model`: all but the last prompt token prefilled in chunks, then
/// `steps` decode steps; every step's logits. `before_step(i)` runs before step `i`.
pub fn greedy(
    model: &qwen_gdn_model::Model,
    prompt: &[u32],
    steps: usize,
    chunk: usize,
    before_step: &mut dyn FnMut(usize),
) -> anyhow::Result<(Vec<u32>, Vec<Tensor>)> {
    let mut cache = model.new_cache();
    let (last, head) = prompt.split_last().unwrap();
    model.prefill(head, &mut cache, chunk)?;
    let (mut tokens, mut logits) = (vec![], vec![]);
    let mut next = *last;
    for i in 0..steps {
        before_step(i);
        let l = model.forward_last(&[next], &mut cache)?;
        next = argmax(&l);
        tokens.push(next);
        logits.push(l);
    }
    Ok((tokens, logits))
}

/// Asserts that every rank of `world` followed `tokens` (one hash each, gathered).
pub fn assert_same_tokens_on_every_rank(
    world: &dyn qwen_gdn_collective::Collective,
    name: &str,
    tokens: &[u32],
) {
    let hash = tokens.iter().fold(0xcbf29ce484222325u64, |h, &t| {
        (h ^ t as u64).wrapping_mul(0x100000001b3)
    });
    let all = world.all_gather_u64(hash).unwrap();
    assert!(
        all.iter().all(|&h| h == hash),
        "{name}: ranks followed different tokens"
    );
}

/// Asserts that the tokens and every step's f32 logits of a run over `ranks` ranks are bit
/// for bit one process's (`want`), then says so in one line naming `what` was split.
pub fn assert_bit_for_bit(
    name: &str,
    what: &str,
    ranks: usize,
    (tokens, logits): (&[u32], &[Tensor]),
    (want_tokens, want_logits): (&[u32], &[Tensor]),
) {
    assert_eq!(
        tokens, want_tokens,
        "{name}: {ranks} ranks chose other tokens"
    );
    assert_eq!(logits.len(), want_logits.len(), "{name}: steps");
    for (i, (got, want)) in logits.iter().zip(want_logits).enumerate() {
        assert!(
            bits(got) == bits(want),
            "{name}: step {i}: {ranks} ranks' logits differ from one rank's"
        );
    }
    say(&format!(
        "{name}: {what} over {ranks} ranks = 1 rank over {} greedy steps (tokens and f32 logits, bit for bit)",
        tokens.len()
    ));
}
