"""Log-probabilities from `qwen-gdn serve` through the official `openai` Python client, checked
against `qwen-gdn eval --json` on the same text (run by scripts/test-serve-clients.sh).

    python scripts/test_serve_logprobs.py BASE_URL API_KEY QWEN_GDN MODEL_DIR

- completions with `echo` and `logprobs`: the prompt's log-probabilities and the generated
  tokens' equal eval's for the prompt plus the reply, within 1e-5;
- the same with max_tokens 0 (how evaluation harnesses score a text);
- chat with `logprobs` and `top_logprobs`, greedy: each chosen token is the first of its list,
  the lists are sorted, and streamed chunks carry the same values.
Every check raises on failure.
"""

import json
import subprocess
import sys

from openai import OpenAI
from serve_client_checks import Checks

base, key, binary, model_dir = sys.argv[1:5]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
check = Checks()
model = client.models.list().data[0].id
TOLERANCE = 1e-5


def eval_json(text):
    out = subprocess.run(
        [binary, "eval", "--model", model_dir, "--text", text, "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def close(got, want, what):
    check(len(got) == len(want), f"{what}: {len(got)} values, eval has {len(want)}")
    worst = max((abs(g - w) for g, w in zip(got, want)), default=0.0)
    check(worst <= TOLERANCE, f"{what}: differs from eval --json by {worst}:\n{got}\n{want}")
    return worst


# The tiny model's greedy reply may hold a token that is part of a character, or that
# re-tokenizes differently as text; eval scores text, so the first prompt whose prompt + reply
# tokenizes back into the same tokens is compared (greedy: the same one every run).
prompts = ["Hello there, how are you", "The capital of France is", "Once upon a time"]
compared = 0
for prompt in prompts:
    r = client.completions.create(
        model=model, prompt=prompt, max_tokens=6, temperature=0, echo=True, logprobs=3
    )
    lp = r.choices[0].logprobs
    text = r.choices[0].text
    check(text.startswith(prompt), f"echo: {text!r}")
    check(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, lp)
    check("".join(lp.tokens) == text, f"tokens {lp.tokens} do not join to {text!r}")
    check(lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset), lp.text_offset)
    for i, (token, top) in enumerate(zip(lp.tokens[1:], lp.top_logprobs[1:])):
        # The chosen token is listed with its own value, beside at most 3 others.
        check(top[token] == lp.token_logprobs[i + 1] and len(top) <= 4, (token, top))
    reference = eval_json(text)
    if len(reference["tokens"]) != len(lp.tokens) or "\ufffd" in text:
        continue
    worst = close(lp.token_logprobs[1:], reference["logprobs"], f"{text!r}: log-probs")
    compared += 1
    break
check(compared == 1, f"no prompt of {prompts} gave a reply that tokenizes back")

# max_tokens 0: only the prompt is scored, as lm-evaluation-harness asks.
r = client.completions.create(
    model=model, prompt=prompt, max_tokens=0, echo=True, logprobs=0
)
check(r.choices[0].text == prompt, r.choices[0].text)
close(r.choices[0].logprobs.token_logprobs[1:], eval_json(prompt)["logprobs"], "prompt log-probs")

# Chat, greedy: each chosen token is the most likely one.
messages = [{"role": "user", "content": "Hello there"}]
extra = {"chat_template_kwargs": {"enable_thinking": False}}
r = client.chat.completions.create(
    model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True,
    top_logprobs=4, extra_body=extra,
)
content = r.choices[0].logprobs.content
check(len(content) >= 1, r)
for t in content:
    values = [x.logprob for x in t.top_logprobs]
    check(len(values) == 4 and values == sorted(values, reverse=True), t)
    check(t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob, t)
    check(t.logprob <= 0 and bytes(t.bytes).decode("utf-8", "replace") == t.token, t)
check("".join(t.token for t in content) == r.choices[0].message.content, r)

stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True,
    top_logprobs=4, extra_body=extra, stream=True,
)
streamed = []
for chunk in stream:
    if chunk.choices and chunk.choices[0].logprobs:
        streamed += chunk.choices[0].logprobs.content or []
check([(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content],
      "streamed log-probs differ")

print(f"logprobs: {check.count} checks passed (largest difference from eval --json: {worst:.2e})")
