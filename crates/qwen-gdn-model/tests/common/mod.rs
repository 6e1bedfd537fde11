//! Shared helpers: paths to the committed fixtures and numeric comparisons.
#![allow(dead_code)]

mod checkpoints;
pub mod qwen4_exp;
pub mod qwen4_exp_head;
#[allow(dead_code)] // only the tests run under mpirun use it
pub mod ranks;

#[allow(unused_imports)] // each test file uses a different subset
pub use checkpoints::{CHECKPOINTS, QWEN4_EXP};

use candle_core::{Device, Tensor};
use qwen_gdn_model::{Model, RunOptions};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Test modules with one test per checkpoint of [`CHECKPOINTS`] each: `module => check` makes
/// `mod module { #[test] fn qwen3_next_4bit() { super::check("qwen3-next-tiny-4bit") } ... }`.
#[allow(unused_macros)] // for the tests that gate every checkpoint
macro_rules! per_checkpoint {
    ($($module:ident => $check:ident),* $(,)?) => {
        $(crate::common::per_checkpoint!(@tests $module $check
            qwen3_next_4bit "qwen3-next-tiny-4bit",
            qwen35_dense_4bit_tied "qwen3.5-tiny-4bit",
            qwen35_moe_4bit "qwen3.5-moe-tiny-4bit",
            qwen3_next_bf16 "qwen3-next-tiny-bf16",
            qwen35_moe_raw_hf "qwen3.5-moe-tiny-hf",
        );)*
    };
    (@tests $module:ident $check:ident $($test:ident $name:literal,)*) => {
        mod $module {
            $(#[test]
            fn $test() {
                super::$check($name)
            })*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use per_checkpoint;

/// The checkpoints whose references carry per-layer activations.
pub const LAYERED: [&str; 3] = [
    "qwen3-next-tiny-4bit",
    "qwen3.5-tiny-4bit",
    "qwen3.5-moe-tiny-4bit",
];

/// models/ of this checkout, or `$QWEN_GDN_MODELS_DIR` (test binaries built here and run on
/// the GPU machine, scripts/gpu/test-cuda.sh, find the fixtures through it).
pub fn models_dir() -> PathBuf {
    match std::env::var_os("QWEN_GDN_MODELS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"),
    }
}

/// A scratch copy of the checkpoint folder `src` that a test may break: `(the temp dir that
/// holds it, the copy)`.
pub fn scratch_copy(src: &Path) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(src.file_name().unwrap());
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    (tmp, dir)
}

/// The device the device-plan tests run on: the CPU, or the first CUDA GPU with
/// `QWEN_GDN_TEST_DEVICE=cuda` (a `cuda` build on the GPU machine). Asking for CUDA where
/// there is none fails the test rather than falling back.
pub fn device_under_test() -> Device {
    match std::env::var("QWEN_GDN_TEST_DEVICE").as_deref() {
        Err(_) | Ok("cpu") => Device::Cpu,
        Ok("cuda") => Device::new_cuda(0)
            .unwrap_or_else(|e| panic!("QWEN_GDN_TEST_DEVICE=cuda: no CUDA device ({e})")),
        Ok(other) => panic!("QWEN_GDN_TEST_DEVICE={other}: expected cpu or cuda"),
    }
}

/// The default options with the engine switches of the environment: scripts/test-all.sh runs
/// the model's gates again with some of them set (every GDN call chunked, every MoE prefill on
/// the grouped GEMM, a tiny attention score budget), so every test that builds a model starts
/// from these.
pub fn run_options() -> RunOptions {
    RunOptions::from_env().unwrap_or_else(|e| panic!("{e:#}"))
}

/// The device plan at `dtype`, with the environment's engine switches ([`run_options`]).
pub fn device_plan(dtype: candle_core::DType) -> RunOptions {
    RunOptions {
        dtype,
        plan: Some(qwen_gdn_model::Plan::Device),
        ..run_options()
    }
}

/// The fixture `name` on the device plan at `dtype`, on [`device_under_test`].
pub fn load_device_plan(name: &str, dtype: candle_core::DType) -> Model {
    load_on(name, &device_plan(dtype), &device_under_test())
}

/// Logits `[T, vocab]` of decoding `ids` one token at a time from an empty cache.
pub fn step_by_step(model: &Model, ids: &[u32]) -> Tensor {
    let mut cache = model.new_cache();
    let rows: Vec<Tensor> = ids
        .iter()
        .map(|&id| model.forward_last(&[id], &mut cache).unwrap())
        .collect();
    Tensor::cat(&rows, 0).unwrap()
}

pub fn load(name: &str) -> Model {
    load_with(name, &run_options())
}

pub fn load_with(name: &str, opts: &RunOptions) -> Model {
    load_on(name, opts, &Device::Cpu)
}

pub fn load_on(name: &str, opts: &RunOptions, device: &Device) -> Model {
    Model::load(&models_dir().join(name), device, opts)
        .unwrap_or_else(|e| panic!("loading {name}: {e:#}"))
}

pub struct Reference(pub HashMap<String, Tensor>);

impl Reference {
    pub fn load(name: &str) -> Self {
        let path = models_dir()
            .join("reference")
            .join(format!("{name}.safetensors"));
        Self(
            candle_core::safetensors::load(&path, &Device::Cpu)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        )
    }

    pub fn get(&self, key: &str) -> &Tensor {
        self.0
            .get(key)
            .unwrap_or_else(|| panic!("reference tensor `{key}` missing"))
    }

    pub fn ids(&self, key: &str) -> Vec<u32> {
        self.get(key)
            .to_dtype(candle_core::DType::I64)
            .unwrap()
            .to_vec1::<i64>()
            .unwrap()
            .iter()
            .map(|&x| x as u32)
            .collect()
    }
}

pub fn flat(t: &Tensor) -> Vec<f32> {
    t.to_dtype(candle_core::DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

/// Every GDN conv window and recurrent state, key and value of `cache` (the cached positions
/// only), as f32 values: what the rollback tests compare bit for bit.
#[allow(dead_code)] // not every test binary rewinds
pub fn gdn_and_kv(cache: &qwen_gdn_model::Cache) -> Vec<Vec<f32>> {
    use qwen_gdn_model::cache::LayerCache;
    let mut out = vec![];
    for layer in &cache.layers {
        match layer {
            LayerCache::Gdn(c) => {
                out.extend(c.conv.iter().map(flat));
                out.extend(c.state.iter().map(flat));
            }
            LayerCache::Attention(c) => {
                out.extend(c.keys().iter().map(flat));
                out.extend(c.values().iter().map(flat));
            }
        }
    }
    out
}

/// [`gdn_and_kv`], then every layer's family state as its prompt-cache file fields
/// (`qwen4_exp`: the per-layer embedding's conv window, the QSA indexer's keys), flattened.
#[allow(dead_code)] // not every includer compares family state
pub fn layer_states(cache: &qwen_gdn_model::Cache) -> Vec<Vec<f32>> {
    use qwen_gdn_model::cache::LayerCache;
    let mut out = gdn_and_kv(cache);
    for layer in &cache.layers {
        let family = match layer {
            LayerCache::Gdn(c) => &c.family,
            LayerCache::Attention(c) => &c.family,
        };
        if let Some(f) = family {
            out.extend(f.snapshot_fields().unwrap().iter().map(|(_, t)| flat(t)));
        }
    }
    out
}

/// Largest |a − b| relative to the largest |b|: the tolerance measure used throughout.
pub fn rel_max_diff(got: &Tensor, want: &Tensor) -> f32 {
    assert_eq!(got.dims(), want.dims(), "shape mismatch");
    let (a, b) = (flat(got), flat(want));
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    a.iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

pub fn argmax_rows(logits: &Tensor) -> Vec<u32> {
    logits
        .argmax(candle_core::D::Minus1)
        .unwrap()
        .to_vec1::<u32>()
        .unwrap()
}

/// mlx-lm's generate loop: prefill all but the last prompt token, run the last one alone,
/// then decode greedily one token at a time.
pub fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut cache = model.new_cache();
    if prompt.len() > 1 {
        model
            .prefill(&prompt[..prompt.len() - 1], &mut cache, 2048)
            .unwrap();
    }
    let mut last = *prompt.last().unwrap();
    let mut out = vec![];
    for _ in 0..n {
        let logits = model.forward_last(&[last], &mut cache).unwrap();
        last = argmax_rows(&logits)[0];
        out.push(last);
    }
    out
}

/// Mean KL(p_want ‖ p_got) over rows of logits, and the fraction of equal argmaxes.
pub fn kl_and_top1(got: &Tensor, want: &Tensor) -> (f32, f32) {
    use candle_core::D;
    let lp = |t: &Tensor| {
        let t = t.to_device(&Device::Cpu).unwrap();
        candle_nn::ops::log_softmax(&t.to_dtype(candle_core::DType::F32).unwrap(), D::Minus1)
            .unwrap()
    };
    let (lg, lw) = (lp(got), lp(want));
    let kl = (lw.exp().unwrap() * (&lw - &lg).unwrap())
        .unwrap()
        .sum(D::Minus1)
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let (a, b) = (argmax_rows(got), argmax_rows(want));
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    (kl, same as f32 / a.len() as f32)
}

/// Rewrites a tensor's declared shape in the safetensors header, keeping its bytes.
pub fn reshape_in_header(file: &Path, tensor: &str, shape: &[usize]) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header[tensor]["shape"] = serde_json::json!(shape);
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(file, out).unwrap();
}

/// Speculative steps from `out` (the tokens decided so far, at least the first) until `n`
/// tokens are decided, drafts bounded so that none runs past `n`; `after` sees the
/// speculation and the tokens so far after each step. Returns the first `n` tokens.
#[allow(dead_code)] // not every test binary speculates
pub fn speculate_to(
    model: &Model,
    spec: &mut qwen_gdn_model::speculative::Speculation,
    cache: &mut qwen_gdn_model::Cache,
    mut out: Vec<u32>,
    n: usize,
    judge: &mut (dyn qwen_gdn_model::speculative::Judge + Send),
    mut after: impl FnMut(&qwen_gdn_model::speculative::Speculation, &[u32]),
) -> Vec<u32> {
    while out.len() < n {
        let token = *out.last().unwrap();
        let max_draft = n - out.len() - 1;
        out.extend(spec.step(model, cache, token, max_draft, judge).unwrap());
        after(spec, &out);
    }
    out.truncate(n);
    out
}

/// The prompt as the engine runs it for speculation: all but the last `HEAD_HISTORY` tokens
/// prefilled, those through `start_from_prompt`. Returns the cache and the first token
/// (greedy).
pub fn speculation_start(
    model: &Model,
    spec: &mut qwen_gdn_model::speculative::Speculation,
    prompt: &[u32],
) -> (qwen_gdn_model::Cache, u32) {
    let mut cache = model.new_cache();
    let split = prompt
        .len()
        .saturating_sub(qwen_gdn_model::speculative::HEAD_HISTORY);
    if split > 0 {
        model.prefill(&prompt[..split], &mut cache, 2048).unwrap();
    }
    let logits = spec
        .start_from_prompt(model, &mut cache, prompt, split)
        .unwrap();
    (cache, argmax_rows(&logits)[0])
}

/// Greedy decoding with speculation from the model's MTP head, `n` tokens.
pub fn speculative_greedy(
    model: &Model,
    prompt: &[u32],
    n: usize,
    length: impl Into<qwen_gdn_model::speculative::DraftLength>,
) -> (Vec<u32>, qwen_gdn_model::speculative::Speculation) {
    use qwen_gdn_model::speculative::{Greedy, Speculation};
    let mut spec = Speculation::new(model, length).unwrap();
    let (mut cache, first) = speculation_start(model, &mut spec, prompt);
    // The argmax plain greedy decoding takes ([`greedy`]), ties included.
    let mut judge = Greedy(|row: &mut [f32], _: &[u32]| {
        argmax_rows(
            &Tensor::new(&*row, &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap(),
        )[0]
    });
    let out = speculate_to(
        model,
        &mut spec,
        &mut cache,
        vec![first],
        n,
        &mut judge,
        |_, _| {},
    );
    (out, spec)
}

/// Greedy drafts and decisions that keep the logits of each step's first draft (what the
/// head gives from its cache as the previous step left it).
#[derive(Default)]
pub struct FirstDrafts(pub Vec<Vec<f32>>);

impl qwen_gdn_model::speculative::Judge for FirstDrafts {
    fn draft(&mut self, logits: &mut [f32], before: &[u32]) -> u32 {
        if before.is_empty() {
            self.0.push(logits.to_vec());
        }
        qwen_gdn_model::speculative::argmax(logits)
    }

    fn decide(&mut self, logits: &mut [f32], _before: &[u32], _draft: Option<u32>) -> u32 {
        qwen_gdn_model::speculative::argmax(logits)
    }
}
