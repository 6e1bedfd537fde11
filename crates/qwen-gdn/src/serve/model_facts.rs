//! What the server tells about its model outside a generation: the Ollama API's /api/tags and
//! /api/show (size, family, quantization, context, template, capabilities). Read once at
//! start from the checkpoint's directory and config.json.

use serde_json::{json, Value as Json};
use std::path::Path;
use std::time::SystemTime;

#[derive(Debug, Clone)]
pub struct ModelFacts {
    /// config.json's model_type (`qwen3_5`, `qwen3_next`, ...).
    pub family: String,
    /// Bytes of the weight files.
    pub size: u64,
    /// When config.json was last written.
    pub modified: SystemTime,
    /// `4-bit`, `8-bit`, or the weights' dtype (`bfloat16`).
    pub quantization: String,
    /// Tokens the context holds.
    pub context_length: u64,
    /// The chat template's source, when the checkpoint has one.
    pub template: Option<String>,
    /// Ollama's capability names: completion, tools, thinking.
    pub capabilities: Vec<&'static str>,
}

impl ModelFacts {
    pub fn read(
        dir: &Path,
        config: &Json,
        template: Option<String>,
        tools: bool,
        thinking: bool,
    ) -> Self {
        let text = config.get("text_config").unwrap_or(config);
        let size = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        let modified = std::fs::metadata(dir.join("config.json"))
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let quantization = match config["quantization"]["bits"].as_u64() {
            Some(bits) => format!("{bits}-bit"),
            None => text["dtype"]
                .as_str()
                .or(text["torch_dtype"].as_str())
                .or(config["torch_dtype"].as_str())
                .unwrap_or("unknown")
                .to_string(),
        };
        let mut capabilities = vec!["completion"];
        if tools {
            capabilities.push("tools");
        }
        if thinking {
            capabilities.push("thinking");
        }
        Self {
            family: config["model_type"].as_str().unwrap_or("unknown").into(),
            size,
            modified,
            quantization,
            context_length: text["max_position_embeddings"].as_u64().unwrap_or(0),
            template,
            capabilities,
        }
    }

    /// Ollama's `details` object.
    pub fn details(&self) -> Json {
        json!({
            "parent_model": "",
            "format": "safetensors",
            "family": self.family,
            "families": [self.family],
            "parameter_size": "",
            "quantization_level": self.quantization,
        })
    }

    /// A stable identifier of the weights as they are on disk (Ollama's `digest`): FNV-1a
    /// over the size and modification time, not a hash of the bytes (reading gigabytes at
    /// start would cost more than the field is worth).
    pub fn digest(&self) -> String {
        let since = self
            .modified
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self
            .size
            .to_le_bytes()
            .iter()
            .chain(since.to_le_bytes().iter())
            .chain(self.family.as_bytes())
        {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
        format!("{hash:016x}")
    }
}
