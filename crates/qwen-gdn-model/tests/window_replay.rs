//! Rollback exactness where a window rewinds by replay (issue 28): a cache with a family's own
//! layer state (`qwen4_exp`: the per-layer embedding's n-gram context and conv window, the QSA
//! indexer's pooled and tail keys) puts back every layer's state from the window's opening and
//! runs the kept tokens again. After a verify pass of T tokens closed on `kept` of them, every
//! state of the cache (GDN state and conv rows, the keys and values up to their length, the
//! family's fields) must be bit for bit that of a cache that never saw the rejected tokens:
//! the same opening state given only the kept tokens; and the next step's logits too (the PLE's
//! n-gram context is not a file field, so the next step shows it).

mod common;
use common::*;
use qwen_gdn_model::speculative::Window;
use qwen_gdn_model::Model;

const PROMPT: usize = 9;
const MAX_ROWS: usize = 4;

fn flat_bits(states: &[Vec<f32>]) -> Vec<Vec<u32>> {
    states
        .iter()
        .map(|t| t.iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn check(name: &str) {
    let model: Model = load(name);
    let ids = Reference::load(name).ids("tf_ids");
    assert!(
        ids.len() > PROMPT + MAX_ROWS + 1,
        "{name}: {} ids",
        ids.len()
    );
    let mut base = model.new_cache();
    model.prefill(&ids[..PROMPT], &mut base, 2048).unwrap();
    let next = ids[PROMPT + MAX_ROWS];
    let mut replays = 0;
    for rows in 1..=MAX_ROWS {
        let tokens = &ids[PROMPT..PROMPT + rows];
        for kept in 1..=rows {
            let mut cache = base.deep_clone().unwrap();
            let window = Window::open(&mut cache).unwrap();
            assert!(
                window.replays(),
                "{name}: a qwen4_exp cache rewinds by replay"
            );
            model.verify(tokens, &mut cache).unwrap();
            let mut ran = None;
            window
                .close_replaying(&mut cache, kept, |cache, k| {
                    ran = Some(k);
                    model.verify(&tokens[..k], cache).map(drop)
                })
                .unwrap();
            assert_eq!(
                ran,
                (kept < rows).then_some(kept),
                "{name}: T={rows}, kept {kept}"
            );
            replays += usize::from(kept < rows);
            assert_eq!(cache.offset, PROMPT + kept);

            let mut want = base.deep_clone().unwrap();
            model.verify(&tokens[..kept], &mut want).unwrap();
            let (got, wanted) = (
                flat_bits(&layer_states(&cache)),
                flat_bits(&layer_states(&want)),
            );
            assert_eq!(got.len(), wanted.len(), "{name}: T={rows}, kept {kept}");
            let differ: Vec<usize> = (0..got.len()).filter(|&i| got[i] != wanted[i]).collect();
            assert!(
                differ.is_empty(),
                "{name}: T={rows}, kept {kept}: state tensors {differ:?} are not those of a cache that saw only the kept tokens"
            );
            let (a, b) = (
                model.forward_last(&[next], &mut cache).unwrap(),
                model.forward_last(&[next], &mut want).unwrap(),
            );
            let same = flat(&a)
                .iter()
                .zip(flat(&b))
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "{name}: T={rows}, kept {kept}: the step after the rewind differs"
            );
        }
    }
    assert_eq!(replays, MAX_ROWS * (MAX_ROWS - 1) / 2);
}

#[test]
fn a_replayed_window_equals_a_cache_that_saw_only_the_kept_tokens() {
    for name in QWEN4_EXP {
        check(name);
    }
}

/// A cache without family state keeps the per-token record (no replay): closing on fewer
/// tokens never calls `replay`.
#[test]
fn hybrid_caches_rewind_without_replay() {
    let name = CHECKPOINTS[0];
    let model = load(name);
    let ids = Reference::load(name).ids("tf_ids");
    let mut cache = model.new_cache();
    model.prefill(&ids[..PROMPT], &mut cache, 2048).unwrap();
    let window = Window::open(&mut cache).unwrap();
    assert!(!window.replays(), "{name}");
    model.verify(&ids[PROMPT..PROMPT + 3], &mut cache).unwrap();
    window
        .close_replaying(&mut cache, 1, |_, _| panic!("{name}: replayed"))
        .unwrap();
    assert_eq!(cache.offset, PROMPT + 1);
}
