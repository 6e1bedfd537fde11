//! Every failure exits non-zero with one `error:` line naming the flag or file, never a panic.

mod common;

use common::*;
use serde_json::Value as Json;
use std::path::Path;

const MODEL: &str = "qwen3.5-tiny-4bit";

fn edit_json(path: &Path, edit: impl FnOnce(&mut Json)) {
    let mut json: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(path, json.to_string()).unwrap();
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn missing_model_folder() {
    assert_error(
        &run(&["generate", "--model", "./no/such/model", "--prompt", "hi"]),
        &["model folder ./no/such/model does not exist"],
    );
    assert_error(
        &run(&["eval", "--model", "/no/such/model", "--text", "hi there"]),
        &["/no/such/model"],
    );
    // `org/name` could be a Hub repo: with HF_HUB_OFFLINE=1 the error says it is neither.
    let tmp = tempfile::tempdir().unwrap();
    let out = command(&[
        "generate",
        "--model",
        "models/no-such-model",
        "--prompt",
        "hi",
    ])
    .env("HF_HUB_CACHE", tmp.path())
    .output()
    .unwrap();
    assert_error(
        &out,
        &[
            "--model models/no-such-model",
            "not a local folder",
            "config.json",
            "HF_HUB_OFFLINE",
        ],
    );
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    assert_error(&generate(&file, &[]), &[&display(&file), "is a file"]);
}

#[test]
fn folder_without_config_json() {
    let (_tmp, dir) = copy_fixture(MODEL);
    std::fs::remove_file(dir.join("config.json")).unwrap();
    assert_error(&generate(&dir, &[]), &[&display(&dir), "config.json"]);
}

#[test]
fn invalid_json_in_config_json() {
    let (_tmp, dir) = copy_fixture(MODEL);
    std::fs::write(dir.join("config.json"), "{\"model_type\": ").unwrap();
    assert_error(
        &generate(&dir, &[]),
        &[&display(&dir.join("config.json")), "JSON"],
    );
}

#[test]
fn unknown_model_type() {
    let (_tmp, dir) = copy_fixture(MODEL);
    edit_json(&dir.join("config.json"), |c| {
        c["model_type"] = "llama".into()
    });
    assert_error(
        &generate(&dir, &[]),
        &[&display(&dir.join("config.json")), "model_type", "llama"],
    );
}

#[test]
fn truncated_shard() {
    let (_tmp, dir) = copy_fixture(MODEL);
    let shard = dir.join("model.safetensors");
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    assert_error(&generate(&dir, &[]), &[&display(&shard)]);
}

#[test]
fn missing_or_broken_tokenizer() {
    let (_tmp, dir) = copy_fixture(MODEL);
    let tokenizer = dir.join("tokenizer.json");
    std::fs::write(&tokenizer, "{ not json").unwrap();
    assert_error(&generate(&dir, &[]), &[&display(&tokenizer)]);
    std::fs::remove_file(&tokenizer).unwrap();
    assert_error(&generate(&dir, &[]), &[&display(&dir), "tokenizer.json"]);
}

#[test]
fn broken_side_files() {
    let (_tmp, dir) = copy_fixture(MODEL);
    std::fs::write(dir.join("chat_template.jinja"), "{% if %}").unwrap();
    assert_error(
        &generate(&dir, &[]),
        &["chat template", "chat_template.jinja"],
    );
    std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
    let gen_config = dir.join("generation_config.json");
    std::fs::write(&gen_config, "[").unwrap();
    assert_error(&generate(&dir, &[]), &[&display(&gen_config)]);
}

#[test]
fn prompt_longer_than_the_context() {
    let (_tmp, dir) = copy_fixture(MODEL);
    edit_json(&dir.join("config.json"), |c| {
        let text = if c.get("text_config").is_some() {
            &mut c["text_config"]
        } else {
            c
        };
        text["max_position_embeddings"] = 8.into();
    });
    let long = "one two three four five six seven eight nine ten";
    assert_error(
        &generate(&dir, &["--prompt", long]),
        &["--prompt", "max_position_embeddings", "config.json"],
    );
    let out = run(&["eval", "--model", dir.to_str().unwrap(), "--text", long]);
    assert_error(&out, &["--text", "max_position_embeddings"]);
}

#[test]
fn max_tokens_zero() {
    assert_error(
        &generate(&fixture(MODEL), &["--max-tokens", "0"]),
        &["--max-tokens"],
    );
}

#[test]
fn empty_prompt() {
    let model = fixture(MODEL);
    assert_error(&generate(&model, &["--prompt", ""]), &["--prompt is empty"]);
    assert_error(
        &generate(&model, &["--prompt", "  \n "]),
        &["--prompt is empty"],
    );
    assert_error(
        &generate(&model, &["--prompt", "-"]),
        &["--prompt from stdin is empty"],
    );
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("empty.txt");
    std::fs::write(&file, "\n").unwrap();
    assert_error(
        &generate(&model, &["--prompt-file", file.to_str().unwrap()]),
        &["--prompt-file", &display(&file), "empty"],
    );
    let missing = tmp.path().join("missing.txt");
    assert_error(
        &generate(&model, &["--prompt-file", missing.to_str().unwrap()]),
        &["--prompt-file", &display(&missing)],
    );
    assert_error(
        &run(&["eval", "--model", model.to_str().unwrap(), "--text", ""]),
        &["--text is empty"],
    );
    assert_error(
        &run(&["eval", "--model", model.to_str().unwrap(), "--text", "a"]),
        &["--text", "at least 2"],
    );
}

#[test]
fn invalid_flag_values() {
    let model = fixture(MODEL);
    let cases: &[(&[&str], &str)] = &[
        (&["--temp", "-1"], "--temp"),
        (&["--temp", "nan"], "--temp"),
        (&["--top-p", "2"], "--top-p"),
        (&["--top-p", "0"], "--top-p"),
        (&["--min-p", "1.5"], "--min-p"),
        (&["--top-k", "-1"], "--top-k"),
        (&["--repetition-penalty", "0"], "--repetition-penalty"),
        (
            &["--repetition-context-size", "0"],
            "--repetition-context-size",
        ),
        (&["--prefill-chunk-size", "0"], "--prefill-chunk-size"),
        (&["--gdn-state-dtype", "fp8"], "--gdn-state-dtype"),
        (&["--enable-thinking", "maybe"], "--enable-thinking"),
        (&["--chat-template-args", "[1]"], "--chat-template-args"),
        (&["--chat-template-args", "{oops"], "--chat-template-args"),
        (&["--seed", "x"], "--seed"),
        (&["--no-such-flag"], "--no-such-flag"),
        (
            &["--prompt", "x", "--prompt-file", "a.txt"],
            "--prompt-file",
        ),
    ];
    for (extra, flag) in cases {
        assert_error(&generate(&model, extra), &[flag]);
    }
    assert_error(&run(&["generate", "--prompt", "hi"]), &["--model"]);
    assert_error(
        &run(&["eval", "--model", model.to_str().unwrap()]),
        &["--text"],
    );
    assert_error(
        &generate(&model, &["--revision", "main"]),
        &["--revision", "local folder"],
    );
}

#[test]
fn devices_this_build_lacks() {
    let model = fixture(MODEL);
    if !cfg!(any(feature = "metal", target_os = "macos")) {
        assert_error(
            &generate(&model, &["--device", "metal"]),
            &["--device metal", "built without Metal"],
        );
    }
    assert_error(&generate(&model, &["--device", "cuda"]), &["--device cuda"]);
    assert_error(
        &generate(&model, &["--device", "tpu"]),
        &["--device", "tpu"],
    );
    assert_error(&generate(&model, &["--dtype", "f64"]), &["--dtype", "f64"]);
}

/// Special token ids must be tokens of the vocabulary (2048 in the tiny models): an id past it,
/// or past 2^32 (which would wrap to a small one), is refused naming the file and the field.
#[test]
fn token_ids_past_the_vocabulary() {
    for (file, key, bad) in [
        ("config.json", "eos_token_id", Json::from(2048)),
        ("config.json", "eos_token_id", Json::from(1u64 << 32)),
        (
            "config.json",
            "bos_token_id",
            Json::from(vec![1u64, (1 << 32) + 1]),
        ),
        (
            "generation_config.json",
            "eos_token_id",
            Json::from((1u64 << 32) + 1986),
        ),
        ("generation_config.json", "pad_token_id", Json::from(-1)),
        ("generation_config.json", "eos_token_id", Json::from("1986")),
    ] {
        let (_tmp, dir) = copy_fixture(MODEL);
        let path = dir.join(file);
        edit_json(&path, |j| {
            let map = if j.get("text_config").is_some() {
                &mut j["text_config"]
            } else {
                j
            };
            map[key] = bad.clone();
        });
        assert_error(&generate(&dir, &[]), &[&display(&path), key]);
    }
}

/// A chat_template.jinja that is not a file is refused, not skipped (the prompt would then run
/// without the template, silently).
#[test]
fn a_template_that_is_not_a_file() {
    let (_tmp, dir) = copy_fixture(MODEL);
    let template = dir.join("chat_template.jinja");
    std::fs::remove_file(&template).unwrap();
    std::fs::create_dir(&template).unwrap();
    assert_error(
        &generate(&dir, &[]),
        &[&display(&template), "not a regular file"],
    );
    std::fs::remove_dir(&template).unwrap();
    mkfifo(&template);
    assert_error(
        &generate(&dir, &[]),
        &[&display(&template), "not a regular file"],
    );
}

/// An index whose weight_map is empty names the index and says what is wrong, in a whole
/// sentence.
#[test]
fn an_index_with_an_empty_weight_map() {
    let (_tmp, dir) = copy_fixture(MODEL);
    let index = dir.join("model.safetensors.index.json");
    std::fs::write(&index, r#"{"metadata": {}, "weight_map": {}}"#).unwrap();
    let out = generate(&dir, &[]);
    assert_error(&out, &[&display(&index), "`weight_map` is empty"]);
    assert!(
        stderr(&out).trim_end().ends_with("shard files"),
        "{}",
        stderr(&out)
    );
}

/// Pipeline launch without MPI (the default build): `--ranks` and a start by mpirun of several
/// ranks are one line each, naming the feature to build with.
#[test]
fn ranks_without_mpi() {
    let dir = fixture("qwen3.5-tiny-4bit");
    let model = dir.to_str().unwrap();
    assert_error(
        &run(&[
            "generate", "--model", model, "--prompt", "hi", "--ranks", "2",
        ]),
        &["--ranks needs a qwen-gdn built with MPI", "--features mpi"],
    );
    let out = output(
        command(&["generate", "--model", model, "--prompt", "hi"]).env("OMPI_COMM_WORLD_SIZE", "2"),
    );
    assert_error(&out, &["started by mpirun with 2 ranks", "--features mpi"]);
    assert_error(
        &run(&[
            "generate", "--model", model, "--prompt", "hi", "--ranks", "0",
        ]),
        &["--ranks"],
    );
}
