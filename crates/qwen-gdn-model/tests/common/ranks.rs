//! What the tests run under `mpirun` share (`pipeline_mpi`, `experts_mpi`): the f32 logits'
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
