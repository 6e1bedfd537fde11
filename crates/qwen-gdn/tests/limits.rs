//! Limits on what a checkpoint or a user can make qwen-gdn do: runaway chat templates,
//! reserved template variables, unbounded inputs, overflowing bench sizes, and a model that
//! produces NaN. Each ends with one `error:` line, quickly, never a panic or a hang.

mod common;

use common::*;
use std::time::{Duration, Instant};

const MODEL: &str = "qwen3.5-tiny-4bit";

/// Runs `f`, failing the test if it takes longer than `limit` (the bug was a hang).
fn within<T>(limit: Duration, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    assert!(start.elapsed() < limit, "took {:?}", start.elapsed());
    out
}

#[test]
fn a_runaway_template_loop_runs_out_of_fuel() {
    let (_tmp, dir) = copy_fixture(MODEL);
    let template = dir.join("chat_template.jinja");
    std::fs::write(
        &template,
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x",
    )
    .unwrap();
    let out = within(Duration::from_secs(60), || generate(&dir, &[]));
    assert_error(
        &out,
        &[
            "chat template",
            &template.display().to_string(),
            "instructions",
        ],
    );
}

/// A copy of the fixture with `template` as its chat template.
fn with_template(template: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let (tmp, dir) = copy_fixture(MODEL);
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    (tmp, dir)
}

#[test]
fn template_output_is_bounded() {
    // 100 KB printed 100 000 times: 10 GB.
    let (_tmp, dir) =
        with_template("{% set s = 'x' * 100000 %}{% for i in range(100000) %}{{ s }}{% endfor %}");
    let out = within(Duration::from_secs(60), || generate(&dir, &[]));
    assert_error(&out, &["chat template", "bytes"]);
}

/// `generate` with `template` as the model's chat template, its address space limited to
/// 4 GiB: a template that allocated what it asks for would abort instead of failing with
/// the one-line error.
fn generate_with_template(template: &str) -> (std::process::Output, std::path::PathBuf) {
    use std::os::unix::process::CommandExt;
    let (tmp, dir) = with_template(template);
    let mut cmd = model_command("generate", &dir, &["--prompt", "Hi"]);
    // SAFETY: only an async-signal-safe call between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 4 << 30,
                rlim_max: 4 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = within(Duration::from_secs(60), || output(&mut cmd));
    drop(tmp);
    (out, dir.join("chat_template.jinja"))
}

#[test]
fn templates_that_build_gigabytes_stop_at_the_byte_budget() {
    let doubling = (0..40).fold("{% set s = 'x' %}".to_string(), |t, _| {
        t + "{% set s = s ~ s %}"
    });
    for template in [
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        &doubling,
        "{{ 'a\nb'|indent(6000000000) }}",
        "{{ '%6000000000d'|format(1) }}",
        "{{ '{:^6000000000}'.format(1) }}",
        "{{ ((range(100000)|list) * 100000)|join(',') }}",
        "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ d('x', 40) }}",
    ] {
        let (out, file) = generate_with_template(template);
        assert_error(
            &out,
            &[
                "chat template",
                &file.display().to_string(),
                "bytes",
                "QWEN_GDN_TEMPLATE_BYTES",
            ],
        );
    }
}

#[test]
fn deep_template_recursion_and_nesting_end_in_one_error() {
    for (template, needle) in [
        (
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            "recursion limit",
        ),
        (
            "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
            "nested more than",
        ),
        (
            "{% set ns = namespace(a=1) %}{% set ns.x = ns %}{{ ns }}",
            "holds itself",
        ),
    ] {
        let (out, file) = generate_with_template(template);
        assert_error(&out, &["chat template", &file.display().to_string(), needle]);
    }
}

/// QWEN_GDN_TEMPLATE_BYTES sets the budget: a template well within the default fails under a
/// smaller one.
#[test]
fn the_template_byte_budget_can_be_changed() {
    // Not a constant expression: minijinja folds those when it compiles the template.
    let (_tmp, dir) =
        with_template("{% set s = 'x' * (100000 * messages|length) %}{{ messages[0].content }}");
    let ok = generate(&dir, &["--max-tokens", "1"]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    let out = output(
        model_command("generate", &dir, &["--prompt", "Hi"])
            .env("QWEN_GDN_TEMPLATE_BYTES", "50000"),
    );
    assert_error(&out, &["chat template", "more than 50000 bytes"]);
    let out = output(
        model_command("generate", &dir, &["--prompt", "Hi"]).env("QWEN_GDN_TEMPLATE_BYTES", "lots"),
    );
    assert_error(&out, &["QWEN_GDN_TEMPLATE_BYTES", "positive integer"]);
}

#[test]
fn template_args_cannot_replace_the_messages() {
    let model = fixture(MODEL);
    for key in ["messages", "add_generation_prompt", "tools"] {
        let args = format!("{{\"{key}\": []}}");
        assert_error(
            &generate(&model, &["--chat-template-args", &args]),
            &["--chat-template-args", key],
        );
    }
    // Other variables are still passed.
    let out = generate(
        &model,
        &[
            "--chat-template-args",
            "{\"enable_thinking\": false}",
            "--max-tokens",
            "2",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn an_endless_prompt_file_stops_at_the_byte_limit() {
    let out = within(Duration::from_secs(60), || {
        generate(&fixture(MODEL), &["--prompt-file", "/dev/zero"])
    });
    assert_error(
        &out,
        &[
            "--prompt-file /dev/zero",
            "bytes",
            "max_position_embeddings",
        ],
    );
    let out = run_model("eval", &fixture(MODEL), &["--text-file", "/dev/zero"]);
    assert_error(&out, &["--text-file /dev/zero", "bytes"]);
}

#[test]
fn a_long_text_is_refused_after_tokenizing_about_one_context() {
    // Under the byte limit, over the 4096-token context: refused while counting pieces,
    // before the whole text is encoded.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("long.txt");
    std::fs::write(&file, "lorem ipsum dolor sit amet ".repeat(4_000)).unwrap();
    let out = run_model(
        "eval",
        &fixture(MODEL),
        &["--text-file", file.to_str().unwrap()],
    );
    assert_error(
        &out,
        &[
            "--text-file",
            "over 4096 tokens (counted so far)",
            "max_position_embeddings",
        ],
    );
}

#[test]
fn bench_sizes_cannot_overflow() {
    let model = fixture("qwen3.5-moe-tiny-4bit");
    let m = model.to_str().unwrap();
    let max = usize::MAX.to_string();
    for extra in [
        ["-p", max.as_str(), "-g", "1"],
        ["-p", "1", "-g", max.as_str()],
        ["-p", max.as_str(), "-g", max.as_str()],
        ["-p", "4000", "-g", "4000"],
    ] {
        let mut args = vec!["bench", "--model", m, "-r", "1"];
        args.extend(extra);
        let out = within(Duration::from_secs(60), || run(&args));
        assert_error(&out, &["-p", "-g", "max_position_embeddings"]);
    }
    // The sum shown is the true one, not a saturated or wrapped one.
    let out = run(&["bench", "--model", m, "-r", "1", "-p", &max, "-g", &max]);
    let sum = (usize::MAX as u128 * 2).to_string();
    assert_error(&out, &[&format!("{sum} tokens")]);
    let out = run(&["bench", "--model", m, "-r", "1", "-p", &max, "-g", "1"]);
    let sum = (usize::MAX as u128 + 1).to_string();
    assert_error(&out, &[&format!("{sum} tokens")]);
}

/// A copy of the fixture whose layer-2 post-attention norm is NaN: layer 2's feed-forward is
/// the first part to produce NaN.
fn nan_model() -> (tempfile::TempDir, std::path::PathBuf) {
    let (tmp, dir) = copy_fixture(MODEL);
    let file = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let entry = &header["language_model.model.layers.2.post_attention_layernorm.weight"];
    assert_eq!(entry["dtype"], "BF16");
    let (a, b) = (
        entry["data_offsets"][0].as_u64().unwrap() as usize,
        entry["data_offsets"][1].as_u64().unwrap() as usize,
    );
    for x in bytes[8 + n + a..8 + n + b].chunks_exact_mut(2) {
        x.copy_from_slice(&[0xc0, 0x7f]); // bf16 NaN, little-endian
    }
    std::fs::write(&file, bytes).unwrap();
    (tmp, dir)
}

#[test]
fn nan_logits_name_the_first_broken_layer() {
    let (_tmp, dir) = nan_model();
    let d = dir.to_str().unwrap();
    let needles = [
        "NaN or Inf logits",
        "layer 2's feed-forward",
        "model.layers.2.mlp",
    ];
    let out = generate(&dir, &["--max-tokens", "4"]);
    assert_error(&out, &needles);
    assert!(out.stdout.len() < 100, "printed tokens: {:?}", out.stdout);
    let out = run(&[
        "eval",
        "--model",
        d,
        "--text",
        "Hello there, world",
        "--json",
    ]);
    assert_error(&out, &needles);
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_error(
        &run(&["bench", "--model", d, "-p", "4", "-g", "2", "-r", "1"]),
        &needles,
    );
}

#[test]
fn side_files_that_are_fifos_are_refused_instead_of_blocking() {
    for name in ["tokenizer.json", "tokenizer_config.json", "config.json"] {
        let (_tmp, dir) = copy_fixture(MODEL);
        let path = dir.join(name);
        std::fs::remove_file(&path).unwrap();
        mkfifo(&path);
        let out = within(Duration::from_secs(60), || generate(&dir, &[]));
        // The folder check may refuse it first ("has no tokenizer.json"); either way the
        // error names the file instead of blocking on it.
        assert_error(&out, &[name]);
    }
}
