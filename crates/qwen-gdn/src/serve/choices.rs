//! A request's `n` choices (OpenAI's and vLLM's `n`): n replies to one prompt, each its own
//! sequence in the batch, the prompt prefilled once (engine/replies/choices.rs).
//!
//! Seeds: with a request `seed`, choice `i` samples with `seed + i` (wrapping), vLLM's rule
//! (`ParentRequest._get_child_sampling_params` in vllm/v1/engine/parallel_sampling.py), so
//! that choice 0 is the reply the same request gives with n = 1 and choice `i` the one it
//! gives with n = 1 and `seed + i`. Without a seed each choice draws its own.
//!
//! Usage: the prompt is counted once (it was prefilled once), the completion tokens of all
//! choices summed, as OpenAI reports them.

use super::job::Usage;

/// The seed of choice `index` of a request seeded with `seed`.
pub fn choice_seed(seed: Option<u64>, index: usize) -> Option<u64> {
    seed.map(|s| s.wrapping_add(index as u64))
}

/// The usage of a request from its choices' (the first choice's prompt counts).
pub fn total_usage(choices: &[Usage]) -> Usage {
    // Choices never speculate (engine/replies.rs): the first choice's drafts are the
    // request's only when it has one choice.
    let mut total = choices.first().copied().unwrap_or_default();
    total.completion_tokens = choices.iter().map(|u| u.completion_tokens).sum();
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_seeds_follow_vllm_and_usage_counts_the_prompt_once() {
        assert_eq!(choice_seed(Some(7), 0), Some(7));
        assert_eq!(choice_seed(Some(7), 2), Some(9));
        assert_eq!(choice_seed(Some(u64::MAX), 1), Some(0));
        assert_eq!(choice_seed(None, 3), None);
        let u = |p, c| Usage {
            prompt_tokens: p,
            cached_tokens: 1,
            completion_tokens: c,
            drafts: None,
        };
        let total = total_usage(&[u(5, 3), u(5, 4), u(5, 1)]);
        assert_eq!(total, u(5, 8));
    }
}
