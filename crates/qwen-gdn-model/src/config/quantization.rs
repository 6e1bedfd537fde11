//! config.json's `quantization` block (mlx-lm; `quantization_config` in some exports): the
//! global bits and group size, then per-module entries keyed by the checkpoint's module path
//! (an object overriding them, `true` for the global setting, `false` for unquantized).

use super::from_json::read;
use anyhow::{bail, Result};
use gdn_ops::ops::affine;
use serde::de::{Deserializer, Error};
use serde::Deserialize;
use serde_json::{Map, Value};

/// Per-module quantization declared in config.json's `quantization` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    pub bits: usize,
    pub group_size: usize,
}

/// The global settings, and an override entry's (mlx-lm's defaults: 4 bits, group 64).
#[derive(Deserialize)]
struct Settings {
    #[serde(default, deserialize_with = "positive_integer")]
    bits: Option<usize>,
    #[serde(default, deserialize_with = "positive_integer")]
    group_size: Option<usize>,
    /// MLX's quantization mode; only `affine` is implemented.
    mode: Option<String>,
    /// Set by quantizers other than MLX (GPTQ, AWQ, fp8, ...).
    quant_method: Option<String>,
}

/// `bits` or `group_size`: a string such as `"4"` is an error rather than silently the default.
fn positive_integer<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let v = Value::deserialize(d)?;
    match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
        Some(n) if n > 0 => Ok(Some(n)),
        _ => Err(D::Error::custom(format!(
            "must be a positive integer, got {v}"
        ))),
    }
}

pub type Quantization = (Option<QuantSpec>, Vec<(String, Option<QuantSpec>)>);

/// The spec `quantization` declares for `module_path`: its override where it has one that
/// quantizes, else the global spec (an override leaving the module unquantized declares
/// nothing of its own).
pub fn declared_spec(
    (global, overrides): (&Option<QuantSpec>, &[(String, Option<QuantSpec>)]),
    module_path: &str,
) -> Option<QuantSpec> {
    overrides
        .iter()
        .find(|(p, _)| p == module_path)
        .and_then(|(_, s)| *s)
        .or(*global)
}

/// The global spec (`None` for an unquantized checkpoint) and the per-module overrides.
pub fn read_quantization(root: &Map<String, Value>, origin: &str) -> Result<Quantization> {
    let (key, block) = match (root.get("quantization"), root.get("quantization_config")) {
        (Some(block), _) => ("quantization", block),
        (None, Some(block)) => ("quantization_config", block),
        (None, None) => return Ok((None, vec![])),
    };
    let entries = match block {
        Value::Null => return Ok((None, vec![])),
        Value::Object(m) => m,
        other => bail!("{origin}: `quantization` must be an object, got {other}"),
    };
    let settings: Settings = read(entries, origin, &[key])?;
    if let Some(mode) = settings.mode.as_deref().filter(|m| *m != "affine") {
        bail!("{origin}: quantization mode `{mode}` is not supported (only MLX affine)");
    }
    if let (Some(method), None) = (&settings.quant_method, settings.bits) {
        bail!("{origin}: quantization method `{method}` is not supported (only MLX affine)");
    }
    let global = QuantSpec {
        bits: settings.bits.unwrap_or(4),
        group_size: settings.group_size.unwrap_or(64),
    };
    global.validate(origin, "quantization")?;
    let mut overrides = vec![];
    for (module, entry) in entries {
        let spec = match entry {
            Value::Bool(false) => None,
            Value::Bool(true) => Some(global),
            Value::Object(entry) => {
                let s: Settings = read(entry, origin, &[key, module])?;
                if let Some(mode) = s.mode.as_deref().filter(|m| *m != "affine") {
                    bail!("{origin}: quantization mode `{mode}` of `{module}` is not supported (only MLX affine)");
                }
                let spec = QuantSpec {
                    bits: s.bits.unwrap_or(global.bits),
                    group_size: s.group_size.unwrap_or(global.group_size),
                };
                spec.validate(origin, module)?;
                Some(spec)
            }
            // The global settings, and strings such as `quant_method`.
            _ => continue,
        };
        overrides.push((module.clone(), spec));
    }
    Ok((Some(global), overrides))
}

impl QuantSpec {
    /// Only the formats MLX produces, which are the ones the kernels handle: a group must
    /// fill whole 32-bit words (a 4-bit group of 4 would not).
    fn validate(&self, origin: &str, key: &str) -> Result<()> {
        if !affine::SUPPORTED_BITS.contains(&self.bits) {
            bail!(
                "{origin}: `{key}` declares {} bits (supported: {:?})",
                self.bits,
                affine::SUPPORTED_BITS
            );
        }
        if !affine::SUPPORTED_GROUPS.contains(&self.group_size) {
            bail!(
                "{origin}: `{key}` declares group_size {} (supported: {:?})",
                self.group_size,
                affine::SUPPORTED_GROUPS
            );
        }
        Ok(())
    }
}
