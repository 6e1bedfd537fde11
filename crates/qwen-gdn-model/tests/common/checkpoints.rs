//! The tiny checkpoints under models/ (made by scripts/gen_fixtures.py and
//! scripts/gen_fixture_qwen4_exp.py), listed once for the tests of every crate: the model
//! crate's and the CLI's tests include this file (`#[path]`).

/// Every checkpoint under models/ with a recorded mlx-lm reference.
pub const CHECKPOINTS: [&str; 5] = [
    "qwen3-next-tiny-4bit",
    "qwen3.5-tiny-4bit",
    "qwen3.5-moe-tiny-4bit",
    "qwen3-next-tiny-bf16",
    "qwen3.5-moe-tiny-hf",
];

/// The `qwen4_exp` fixtures (references from transformers fp32, not mlx-lm): the raw HF layout
/// and the mlx-vlm 4-bit layout. Their end-to-end gates are in the model crate's
/// tests/qwen4_exp.rs.
#[allow(dead_code)] // not every includer runs them
pub const QWEN4_EXP: [&str; 2] = ["qwen4-exp-tiny-hf", "qwen4-exp-tiny-4bit"];
