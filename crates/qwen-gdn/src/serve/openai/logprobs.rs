//! Log-probabilities in OpenAI's two shapes: chat's `{"content": [{token, logprob, bytes,
//! top_logprobs}]}` and the legacy completions' `{tokens, token_logprobs, top_logprobs,
//! text_offset}`. A token's `bytes` are those of its text as decoded alone (a token that
//! holds part of a character shows U+FFFD there).

use crate::serve::job::{Logprobs, TokenScore};
use serde_json::{json, Map, Value as Json};

fn entry(text: &str, logprob: f32) -> Json {
    json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()})
}

/// Chat's `choices[0].logprobs`: the generated tokens.
pub fn chat(logprobs: &Logprobs) -> Json {
    let content: Vec<Json> = logprobs
        .generated
        .iter()
        .map(|t| {
            let mut e = entry(&t.text, t.logprob.unwrap_or(f32::NEG_INFINITY));
            e["top_logprobs"] = t.top.iter().map(|(text, lp)| entry(text, *lp)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions' `choices[0].logprobs`: the prompt's tokens first when echoed (the first with
/// `null`), then the generated ones. `top_logprobs` maps each listed token's text to its
/// log-probability, the chosen token included (as OpenAI's legacy API does); `text_offset` is
/// each token's start in the choice's text, in characters.
pub fn completion(logprobs: &Logprobs) -> Json {
    let tokens: Vec<&TokenScore> = logprobs
        .prompt
        .iter()
        .flatten()
        .chain(&logprobs.generated)
        .collect();
    let mut offset = 0;
    let mut text_offset = Vec::with_capacity(tokens.len());
    for t in &tokens {
        text_offset.push(offset);
        offset += t.text.chars().count();
    }
    let top: Vec<Json> = tokens
        .iter()
        .map(|t| match t.logprob {
            None => Json::Null,
            Some(lp) => {
                let mut map: Map<String, Json> = t
                    .top
                    .iter()
                    .map(|(text, lp)| (text.clone(), json!(lp)))
                    .collect();
                map.entry(t.text.clone()).or_insert(json!(lp));
                Json::Object(map)
            }
        })
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| t.text.as_str()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(text: &str, logprob: Option<f32>, top: &[(&str, f32)]) -> TokenScore {
        TokenScore {
            text: text.into(),
            logprob,
            top: top.iter().map(|(t, lp)| (t.to_string(), *lp)).collect(),
        }
    }

    #[test]
    fn completion_logprobs_follow_the_prompt_then_the_reply() {
        let l = Logprobs {
            prompt: Some(vec![score("Hé", None, &[]), score("llo", Some(-1.5), &[])]),
            generated: vec![score(" w", Some(-0.25), &[(" x", -0.125), (" w", -0.25)])],
        };
        let j = completion(&l);
        assert_eq!(j["tokens"], json!(["Hé", "llo", " w"]));
        assert_eq!(j["token_logprobs"], json!([null, -1.5, -0.25]));
        assert_eq!(j["text_offset"], json!([0, 2, 5]));
        assert_eq!(j["top_logprobs"][0], Json::Null);
        assert_eq!(j["top_logprobs"][1], json!({"llo": -1.5}));
        assert_eq!(j["top_logprobs"][2], json!({" x": -0.125, " w": -0.25}));
        let c = chat(&l);
        assert_eq!(c["content"].as_array().unwrap().len(), 1);
        assert_eq!(c["content"][0]["token"], " w");
        assert_eq!(c["content"][0]["bytes"], json!([32, 119]));
        assert_eq!(c["content"][0]["top_logprobs"][0]["logprob"], -0.125);
    }
}
