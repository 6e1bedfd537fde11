//! Prompt-cache files: a saved and reloaded state continues exactly as the original (on every
//! fixture, qwen4_exp's PLE windows and QSA indexer keys included), and a file made for
//! another model, a damaged file (a single flipped bit included), one with a wrong tensor or
//! of another format version is refused with a one-line error naming the file.

mod common;
use candle_core::{Device, Tensor};
use common::*;
use qwen_gdn_model::prompt_cache::{
    load_cache, read_snapshot_header, save_snapshot, ModelIdentity,
};
use qwen_gdn_model::{Cache, Model};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn prompt(model: &Model, n: usize) -> Vec<u32> {
    let vocab = model.config().vocab_size as u32;
    (0..n as u32).map(|i| (i * 7919 + 13) % vocab).collect()
}

/// The cache after `ids` as the engine leaves it: all but the last in chunks, the last alone.
fn prompt_state(model: &Model, ids: &[u32]) -> Cache {
    let mut cache = model.new_cache();
    model
        .prefill(&ids[..ids.len() - 1], &mut cache, 16)
        .unwrap();
    model
        .forward_last(&ids[ids.len() - 1..], &mut cache)
        .unwrap();
    cache
}

/// Greedy tokens and every logit of `n` decode steps after `first`.
fn decode(model: &Model, cache: &mut Cache, first: u32, n: usize) -> (Vec<u32>, Vec<f32>) {
    let (mut token, mut tokens, mut logits) = (first, vec![], vec![]);
    for _ in 0..n {
        let l = model.forward_last(&[token], cache).unwrap();
        logits.extend(flat(&l));
        token = argmax_rows(&l)[0];
        tokens.push(token);
    }
    (tokens, logits)
}

fn identity(name: &str, model: &Model) -> ModelIdentity {
    ModelIdentity::of(&models_dir().join(name), model).unwrap()
}

/// Every fixture; qwen4_exp's with a prompt that ends on a block boundary of the QSA indexer
/// (40 tokens, ratio 4: no tail keys) and one that does not (43), both far past its budget.
#[test]
fn save_then_load_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let runs = CHECKPOINTS
        .iter()
        .map(|&name| (name, 40))
        .chain(QWEN4_EXP.iter().flat_map(|&name| [(name, 40), (name, 43)]));
    for (name, n) in runs {
        let model = load(name);
        let id = identity(name, &model);
        let ids = prompt(&model, n);
        let cache = prompt_state(&model, &ids);
        let path = dir.path().join(format!("{name}-{n}.safetensors"));
        save_snapshot(&path, &ids, &cache, &id, true).unwrap();
        // Saving again replaces our own file.
        save_snapshot(&path, &ids, &cache, &id, true).unwrap();
        let (tokens, mut loaded) = load_cache(&path, &model, &id).unwrap();
        assert_eq!(tokens, ids, "{name}");
        assert_eq!(loaded.offset, ids.len(), "{name}");
        assert_same_qwen4_exp_state(name, &loaded, &cache);
        let mut original = cache.deep_clone().unwrap();
        let want = decode(&model, &mut original, 5, 6);
        let got = decode(&model, &mut loaded, 5, 6);
        assert_eq!(got.0, want.0, "{name}: tokens");
        assert!(got.1 == want.1, "{name}: logits differ after a reload");
    }
}

/// qwen4_exp's parts of two caches are equal: the n-gram contexts (rebuilt from the file's
/// tokens), the PLE conv windows bit for bit, and the indexer's block and tail keys.
fn assert_same_qwen4_exp_state(name: &str, got: &Cache, want: &Cache) {
    use qwen_gdn_model::cache::LayerCache;
    use qwen_gdn_model::families::qwen4_exp::state::{indexer, ple};
    let mut parts = 0;
    for (i, (g, w)) in got.layers.iter().zip(&want.layers).enumerate() {
        match (g, w) {
            (LayerCache::Gdn(g), LayerCache::Gdn(w)) => {
                assert_eq!(ple(g).is_some(), ple(w).is_some(), "{name}: layer {i}");
                if let (Some(g), Some(w)) = (ple(g), ple(w)) {
                    assert_eq!(g.context, w.context, "{name}: layer {i} n-gram context");
                    assert!(
                        flat(&g.window) == flat(&w.window),
                        "{name}: layer {i} window"
                    );
                    parts += 1;
                }
            }
            (LayerCache::Attention(g), LayerCache::Attention(w)) => {
                let (g, w) = (indexer(g), indexer(w));
                assert_eq!(
                    g.map(|x| (&x.blocks, &x.tail, x.len)),
                    w.map(|x| (&x.blocks, &x.tail, x.len)),
                    "{name}: layer {i} indexer"
                );
                parts += usize::from(g.is_some());
            }
            _ => panic!("{name}: layer {i} changed kind"),
        }
    }
    let qwen4 = QWEN4_EXP.contains(&name);
    assert_eq!(parts > 0, qwen4, "{name}: {parts} qwen4_exp parts");
}

/// The error of loading `path`, which must be one line naming the file.
fn load_error(path: &Path, model: &Model, id: &ModelIdentity) -> String {
    let err = format!(
        "{:#}",
        load_cache(path, model, id).expect_err("load must fail")
    );
    assert!(!err.contains('\n'), "not one line: {err}");
    assert!(
        err.contains(&path.display().to_string()),
        "does not name the file: {err}"
    );
    err
}

#[test]
fn a_file_for_another_model_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = load("qwen3.5-tiny-4bit");
    let b = load("qwen3.5-moe-tiny-4bit");
    let ids = prompt(&a, 20);
    let path = dir.path().join("a.safetensors");
    save_snapshot(
        &path,
        &ids,
        &prompt_state(&a, &ids),
        &identity("qwen3.5-tiny-4bit", &a),
        false,
    )
    .unwrap();
    let err = load_error(&path, &b, &identity("qwen3.5-moe-tiny-4bit", &b));
    assert!(
        err.contains("made for another model: config_sha256"),
        "{err}"
    );

    let mut other = identity("qwen3.5-tiny-4bit", &a);
    for field in ["checkpoint_sha256", "state_dtype", "compute_dtype"] {
        let mut id = other.clone();
        match field {
            "checkpoint_sha256" => id.checkpoint_sha256 = "0".repeat(64),
            "state_dtype" => id.state_dtype = "bf16".into(),
            _ => id.compute_dtype = "bf16".into(),
        }
        let err = load_error(&path, &a, &id);
        assert!(err.contains(&format!("another model: {field}")), "{err}");
    }
    other.compute_dtype = "f32".into();
    assert!(load_cache(&path, &a, &other).is_ok());
}

/// A prompt-cache file of `n` prompt tokens on the fixture `name`, saved in `dir` as
/// good.safetensors (`chat_template`: of a templated prompt): the model, its identity, the
/// prompt and the file.
fn good_file(
    dir: &Path,
    name: &str,
    n: usize,
    chat_template: bool,
) -> (Model, ModelIdentity, Vec<u32>, PathBuf) {
    let model = load(name);
    let id = identity(name, &model);
    let ids = prompt(&model, n);
    let good = dir.join("good.safetensors");
    save_snapshot(&good, &ids, &prompt_state(&model, &ids), &id, chat_template).unwrap();
    (model, id, ids, good)
}

#[test]
fn damaged_files_are_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let (model, id, ids, good) = good_file(dir.path(), "qwen3-next-tiny-4bit", 20, false);
    let bytes = std::fs::read(&good).unwrap();
    let write = |file: &str, data: &[u8]| {
        let p = dir.path().join(file);
        std::fs::write(&p, data).unwrap();
        p
    };

    let err = load_error(
        &write("truncated", &bytes[..bytes.len() - 100]),
        &model,
        &id,
    );
    assert!(err.contains("not a valid safetensors file"), "{err}");
    let err = load_error(
        &write("garbage", b"\xff\xff\xff\xff\xff\xff\xff\x7fjunk"),
        &model,
        &id,
    );
    assert!(err.contains("not a valid safetensors file"), "{err}");
    let err = load_error(&write("empty", b""), &model, &id);
    assert!(err.contains("not a valid safetensors file"), "{err}");
    let missing = dir.path().join("missing.safetensors");
    load_error(&missing, &model, &id);

    // Valid safetensors with our metadata, one tensor changed at a time.
    let tensors = candle_core::safetensors::load(&good, &Device::Cpu).unwrap();
    let metadata = file_metadata(&id, "3");
    // The error of loading the file these tensors make after `change`.
    let forged_error = |file: &str, change: &dyn Fn(&mut HashMap<String, Tensor>)| {
        let mut t = tensors.clone();
        change(&mut t);
        let p = dir.path().join(file);
        safetensors::serialize_to_file(&t, Some(sealed(&t, metadata.clone())), &p).unwrap();
        load_error(&p, &model, &id)
    };
    let state = tensors["layers.0.state"].clone();
    let err = forged_error("shape", &|t| {
        t.insert("layers.0.state".into(), state.narrow(1, 0, 1).unwrap());
    });
    assert!(err.contains("tensor `layers.0.state`"), "{err}");
    let err = forged_error("dtype", &|t| {
        t.insert(
            "layers.0.state".into(),
            state.to_dtype(candle_core::DType::F16).unwrap(),
        );
    });
    assert!(err.contains("tensor `layers.0.state`"), "{err}");
    let err = forged_error("missing", &|t| {
        t.remove("layers.0.conv");
    });
    assert!(err.contains("`layers.0.conv` is missing"), "{err}");
    let err = forged_error("extra", &|t| {
        t.insert("surprise".into(), state.clone());
    });
    assert!(err.contains("unexpected tensor `surprise`"), "{err}");
    let vocab = model.config().vocab_size as u32;
    let err = forged_error("token", &|t| {
        let bad: Vec<u32> = ids.iter().map(|_| vocab).collect();
        t.insert(
            "tokens".into(),
            Tensor::new(bad.as_slice(), &Device::Cpu).unwrap(),
        );
    });
    assert!(err.contains("outside the vocabulary"), "{err}");
    // Tokens that do not match the stored KV length.
    let err = forged_error("length", &|t| {
        t.insert(
            "tokens".into(),
            Tensor::new(&ids[..10], &Device::Cpu).unwrap(),
        );
    });
    assert!(err.contains("tensor `layers."), "{err}");
}

#[test]
fn saving_never_overwrites_a_file_that_is_not_a_prompt_cache() {
    let dir = tempfile::tempdir().unwrap();
    let name = "qwen3.5-tiny-4bit";
    let model = load(name);
    let ids = prompt(&model, 10);
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, "mine").unwrap();
    let err = save_snapshot(
        &path,
        &ids,
        &prompt_state(&model, &ids),
        &identity(name, &model),
        false,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("not overwriting"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "mine");
}

/// A file's metadata as save_snapshot writes it, but for the checksums ([`sealed`]).
fn file_metadata(id: &ModelIdentity, version: &str) -> HashMap<String, String> {
    id.fields()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain([
            ("format".into(), "qwen-gdn-prompt-cache".into()),
            ("format_version".into(), version.into()),
            ("chat_template".into(), "false".into()),
        ])
        .collect()
}

/// `metadata` with the checksum of every tensor of `tensors`, as save_snapshot stores them.
fn sealed(
    tensors: &HashMap<String, Tensor>,
    mut metadata: HashMap<String, String>,
) -> HashMap<String, String> {
    use sha2::{Digest, Sha256};
    for (name, t) in tensors {
        let digest = Sha256::digest(safetensors::View::data(t));
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        metadata.insert(format!("sha256.{name}"), hex);
    }
    metadata
}

/// The layout's version: files of versions 1 and 2 (no checksums) are refused with a line
/// that says to re-create them, as is a version from the future. qwen4_exp's own tensors are
/// checked like the others.
#[test]
fn versions_and_qwen4_exp_tensors_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let resave =
        |name: &str, from: &Path, version: &str, change: &dyn Fn(&mut HashMap<String, Tensor>)| {
            let model = load(name);
            let metadata = file_metadata(&identity(name, &model), version);
            let mut tensors = candle_core::safetensors::load(from, &Device::Cpu).unwrap();
            change(&mut tensors);
            let p = dir
                .path()
                .join(format!("{name}-{version}-{}.safetensors", tensors.len()));
            let metadata = if version == "3" {
                sealed(&tensors, metadata)
            } else {
                metadata
            };
            safetensors::serialize_to_file(&tensors, Some(metadata), &p).unwrap();
            p
        };
    for name in ["qwen3.5-tiny-4bit", "qwen4-exp-tiny-4bit"] {
        let model = load(name);
        let id = identity(name, &model);
        let ids = prompt(&model, 21);
        let cache = prompt_state(&model, &ids);
        let good = dir.path().join(format!("{name}.safetensors"));
        save_snapshot(&good, &ids, &cache, &id, false).unwrap();
        for old in ["1", "2"] {
            let err = load_error(&resave(name, &good, old, &|_| {}), &model, &id);
            assert!(
                err.contains(&format!(
                    "format version {old} has no checksums and cannot be verified; re-create it"
                )),
                "{err}"
            );
        }
        let err = load_error(&resave(name, &good, "4", &|_| {}), &model, &id);
        assert!(
            err.contains("format version 4, this qwen-gdn reads version 3"),
            "{err}"
        );
        // A forged version-3 file with the right checksums loads as the original.
        let (tokens, mut loaded) =
            load_cache(&resave(name, &good, "3", &|_| {}), &model, &id).unwrap();
        assert_eq!(tokens, ids);
        let want = decode(&model, &mut cache.deep_clone().unwrap(), 5, 3);
        assert!(decode(&model, &mut loaded, 5, 3) == want, "{name}");
        if name == "qwen3.5-tiny-4bit" {
            continue;
        }
        // qwen4_exp: layers 1 and 3 have per-layer embeddings, layer 2 is the QSA layer
        // (21 tokens: 5 block keys and 1 tail key of 16 floats).
        let tensors = candle_core::safetensors::load(&good, &Device::Cpu).unwrap();
        assert_eq!(tensors["layers.2.index_keys"].dims(), [6, 16]);
        assert_eq!(
            tensors["layers.1.ple_window"].dtype(),
            candle_core::DType::F32
        );
        assert!(!tensors.contains_key("layers.0.ple_window"));
        let keys = tensors["layers.2.index_keys"].clone();
        for (what, change, needle) in [
            (
                "missing window",
                Box::new(|t: &mut HashMap<String, Tensor>| {
                    t.remove("layers.3.ple_window");
                }) as Box<dyn Fn(&mut HashMap<String, Tensor>)>,
                "`layers.3.ple_window` is missing",
            ),
            (
                "short index keys",
                Box::new(move |t: &mut HashMap<String, Tensor>| {
                    t.insert("layers.2.index_keys".into(), keys.narrow(0, 0, 5).unwrap());
                }),
                "tensor `layers.2.index_keys` is",
            ),
            (
                "window on a layer without PLE",
                Box::new(|t: &mut HashMap<String, Tensor>| {
                    let w = t["layers.1.ple_window"].clone();
                    t.insert("layers.0.ple_window".into(), w);
                }),
                "unexpected tensor `layers.0.ple_window`",
            ),
        ] {
            let err = load_error(&resave(name, &good, "3", &change), &model, &id);
            assert!(err.contains(needle), "{what}: {err}");
        }
    }
}

/// One flipped bit anywhere in the stored state or the token ids is refused, naming the
/// tensor (qwen4_exp has every kind: conv and recurrent states, keys and values, PLE windows,
/// indexer keys).
#[test]
fn a_flipped_bit_in_any_tensor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (model, id, _, good) = good_file(dir.path(), "qwen4-exp-tiny-4bit", 21, true);
    assert!(read_snapshot_header(&good).unwrap().chat_template);
    let bytes = std::fs::read(&good).unwrap();
    let (header_len, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let data_start = 8 + header_len;
    let names = header.offset_keys();
    let kinds = [
        "conv",
        "state",
        "keys",
        "values",
        "ple_window",
        "index_keys",
    ];
    for kind in kinds {
        assert!(
            names.iter().any(|n| n.ends_with(&format!(".{kind}"))),
            "no {kind} in {names:?}"
        );
    }
    for name in &names {
        let (start, end) = header.info(name).unwrap().data_offsets;
        // The lowest bit of the first token id keeps it in the vocabulary: only the checksum
        // can tell.
        let at = if name == "tokens" {
            data_start + start
        } else {
            data_start + (start + end) / 2
        };
        let mut damaged = bytes.clone();
        damaged[at] ^= 1;
        let file = dir.path().join(format!("flipped-{name}.safetensors"));
        std::fs::write(&file, &damaged).unwrap();
        let err = load_error(&file, &model, &id);
        let what = if name == "tokens" {
            "the token ids".to_string()
        } else {
            format!("tensor `{name}`")
        };
        assert!(
            err.contains(&format!("checksum mismatch in {what}")),
            "{name}: {err}"
        );
    }
    // The untouched file still loads.
    load_cache(&good, &model, &id).unwrap();
}
