"""The same greedy text through OpenAI's, Anthropic's and Ollama's API, with each API's
official Python client, plain and streamed, for one conversation (system prompt, an earlier
exchange, a question), thinking off (run by scripts/test-serve-clients.sh).

    python scripts/test_serve_same_text.py BASE_URL API_KEY MODEL
"""

import sys

import anthropic
import ollama
import openai

base, key, model = sys.argv[1:4]
n = 16
system = "You are a terse assistant."
turns = [
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "Hi. What do you need?"},
    {"role": "user", "content": "Tell me about the sea"},
]
texts = {}

o = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=300)
args = dict(model=model, messages=[{"role": "system", "content": system}] + turns, max_tokens=n, temperature=0,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
texts["openai"] = o.chat.completions.create(**args).choices[0].message.content
texts["openai stream"] = "".join(
    c.choices[0].delta.content or "" for c in o.chat.completions.create(stream=True, **args) if c.choices
)

a = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=300)
args = dict(model=model, system=system, messages=turns, max_tokens=n, extra_body={"temperature": 0})
texts["anthropic"] = "".join(b.text for b in a.messages.create(**args).content if b.type == "text")
with a.messages.stream(**args) as s:
    texts["anthropic stream"] = "".join(s.text_stream)

c = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"}, timeout=300)
args = dict(model=model, messages=[{"role": "system", "content": system}] + turns, think=False,
            options={"temperature": 0, "num_predict": n})
texts["ollama"] = c.chat(**args).message.content
texts["ollama stream"] = "".join(p.message.content for p in c.chat(stream=True, **args))

want = texts["openai"]
if not want or any(t != want for t in texts.values()):
    raise AssertionError(f"the APIs disagree: {texts}")
print(f"same greedy text through {len(texts)} replies: {want!r}")
