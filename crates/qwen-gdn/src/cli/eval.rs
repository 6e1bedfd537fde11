//! `qwen-gdn eval`: teacher-forced scoring of a text. No chat template; the tokenizer's own
//! special-token handling (Qwen tokenizers add no BOS, so the ids are those of
//! `encode(text, add_special_tokens=False)`, which the mlx-lm references use). The `--json`
//! object is the interface external reference checks use: keep its keys and meaning stable.

use crate::engine::logprobs::score;
use crate::engine::non_finite_logits;
use crate::load::ModelArgs;
use crate::ui::output::print_line;
use anyhow::{bail, Result};
use candle_core::DType;
use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(
    allow_negative_numbers = true,
    group(clap::ArgGroup::new("input").required(true).args(["text", "text_file"]))
)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Text to score; `-` reads it from stdin
    #[arg(long)]
    text: Option<String>,
    /// Read the text to score from this file
    #[arg(long, value_name = "FILE")]
    text_file: Option<PathBuf>,
    /// Print one JSON object {"tokens", "logprobs", "argmax", "ppl"}: for i >= 1,
    /// logprobs[i-1] = log p(token_i | tokens before it) and argmax[i-1] = the most likely
    /// token at that position
    #[arg(long)]
    json: bool,
    /// Also run the text in decode mode with the GDN state stored in this dtype and in f32,
    /// and report KL(p_f32 || p_other) and top-1 agreement with PASS/FAIL against the gate
    /// (mean KL <= 0.01, top-1 >= 95%); under "compare" with --json
    #[arg(long, value_enum, value_name = "DTYPE")]
    compare_state_dtype: Option<crate::load::GdnStateDtype>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let checkpoint = args.model.open()?;
    let limit = &checkpoint.input_limit;
    let (text, what) = limit.read(args.text.as_deref(), args.text_file.as_deref(), "--text")?;
    limit.check_tokens(&checkpoint.tokenizer, &text, &what)?;
    let encoding = checkpoint
        .tokenizer
        .encode(text, true)
        .map_err(|e| anyhow::anyhow!("tokenizing {what}: {e}"))?;
    let tokens = encoding.get_ids().to_vec();
    if tokens.len() < 2 {
        bail!(
            "{what} is {} token(s); scoring needs at least 2",
            tokens.len()
        );
    }
    limit.check_fits(tokens.len(), &what)?;
    let model = args.model.load_model(&checkpoint, tokens.len())?;
    model.warm_up()?;

    let mut cache = model.new_cache();
    let (mut logprobs, mut argmax) = (Vec::new(), Vec::new());
    for (i, chunk) in tokens.chunks(args.model.prefill_chunk_size).enumerate() {
        // [len, vocab]; row j predicts token start + j + 1, and the very last row nothing.
        let logits = model.forward(chunk, &mut cache)?.to_dtype(DType::F32)?;
        let start = i * args.model.prefill_chunk_size;
        let targets = &tokens[start + 1..(start + chunk.len() + 1).min(tokens.len())];
        if targets.is_empty() {
            continue; // the final token predicts nothing
        }
        let (lp, am) = score(&logits.narrow(0, 0, targets.len())?, targets)?;
        // A log-probability is finite exactly when its row of logits is.
        if let Some(j) = lp.iter().position(|x| !x.is_finite()) {
            let seen = &tokens[..start + j + 1];
            return Err(non_finite_logits(
                &model,
                seen,
                args.model.prefill_chunk_size,
            ));
        }
        logprobs.extend(lp);
        argmax.extend(am);
    }

    let compare = match args.compare_state_dtype {
        Some(d) => Some(crate::cli::compare_state::compare(
            &model,
            &tokens,
            d.into(),
        )?),
        None => None,
    };

    let nll = -logprobs.iter().map(|&l| l as f64).sum::<f64>() / logprobs.len() as f64;
    let ppl = nll.exp();
    let mut report = String::new();
    if args.json {
        report = serde_json::to_string(&Report {
            tokens: &tokens,
            logprobs: &logprobs,
            argmax: &argmax,
            ppl,
            compare: compare.as_ref(),
        })?;
    } else {
        writeln!(
            report,
            "Tokens: {} ({} scored)",
            tokens.len(),
            logprobs.len()
        )?;
        writeln!(report, "Mean NLL: {nll:.4} nats/token")?;
        write!(report, "Perplexity: {ppl:.3}")?;
        if let Some(c) = &compare {
            write!(report, "\n{}", c.summary())?;
        }
    }
    // A closed stdout (`| head`) is not an error, as in `generate`.
    print_line(&report)?;
    Ok(ExitCode::SUCCESS)
}

/// The `--json` object; a struct so that the f32 log-probs print with f32's shortest digits.
#[derive(serde::Serialize)]
struct Report<'a> {
    tokens: &'a [u32],
    logprobs: &'a [f32],
    argmax: &'a [u32],
    ppl: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    compare: Option<&'a crate::cli::compare_state::Comparison>,
}
