"""Drives `qwen-gdn serve`'s Ollama API with the official `ollama` Python client (run by
scripts/test-serve-clients.sh, which starts the servers).

    python scripts/test_serve_ollama.py BASE_URL API_KEY FORCED_BASE_URL MODEL

BASE_URL serves a tiny checkpoint with --api-key API_KEY (sent as a bearer token, as the client
does with OLLAMA_API_KEY); FORCED_BASE_URL serves it with the debug-build switch
QWEN_GDN_TEST_FORCE_OUTPUT set to some thinking and a Qwen XML tool call. MODEL is the served
model name. Every check raises on failure.
"""

import json
import sys
import urllib.request
from importlib.metadata import version

import jsonschema
import ollama
from serve_client_checks import Checks

base, key, forced_base, model = sys.argv[1:5]
auth = {"Authorization": f"Bearer {key}"}
client = ollama.Client(host=base, headers=auth, timeout=300)
check = Checks()


# Tags, show, version.
tags = client.list()
check([m.model for m in tags.models] == [model], tags)
check(tags.models[0].details.quantization_level == "4-bit" and tags.models[0].size > 0, tags)
show = client.show(model)
check({"completion", "tools", "thinking"} <= set(show.capabilities), show)
check(show.template and show.modelinfo, show)
with urllib.request.urlopen(urllib.request.Request(f"{base}/api/version", headers=auth)) as r:
    check(json.load(r)["version"], "version")

# Chat, greedy, then streamed (the client's default is not to stream; the server's is to).
greedy_options = {"temperature": 0, "num_predict": 10}
messages = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Tell me about the sea"},
]
r = client.chat(model=model, messages=messages, options=greedy_options, think=False, keep_alive="5m")
check(r.done and r.done_reason in ("stop", "length") and r.message.role == "assistant", r)
check(r.eval_count >= 1 and r.prompt_eval_count >= 1 and r.total_duration > 0, r)
greedy = r.message.content
check(greedy, r)
chunks = list(client.chat(model=model, messages=messages, options=greedy_options, think=False, stream=True))
check("".join(c.message.content for c in chunks) == greedy, chunks)
check(chunks[-1].done and not any(c.done for c in chunks[:-1]), chunks)
check(chunks[-1].eval_count == r.eval_count, chunks[-1])

# Thinking on (this vocabulary's default): the reply starts in message.thinking.
r = client.chat(model=model, messages=[{"role": "user", "content": "hi"}], options=greedy_options)
check(r.message.thinking, r)

# Generate: through the chat template (the same text as chat for the same message), and raw.
r = client.generate(model=model, prompt="Tell me about the sea", system="You are a terse assistant.",
                    options=greedy_options, think=False)
check(r.response == greedy, (r.response, greedy))
pieces = list(client.generate(model=model, prompt="Once upon a time", raw=True, options=greedy_options, stream=True))
raw = client.generate(model=model, prompt="Once upon a time", raw=True, options=greedy_options)
check("".join(p.response for p in pieces) == raw.response and pieces[-1].done, pieces)

# Stop strings from options.
stop = next(greedy[i : i + 2] for i in range(len(greedy) // 2, len(greedy) - 1) if " " not in greedy[i : i + 2] and not greedy[i : i + 2].isspace())
r = client.chat(model=model, messages=messages, options={**greedy_options, "stop": [stop]}, think=False)
check(r.message.content == greedy[: greedy.index(stop)], (r.message.content, greedy, stop))

# Errors.
def expect(status, **kwargs):
    try:
        client.chat(**kwargs)
    except ollama.ResponseError as e:
        check(e.status_code == status and e.error, (e.status_code, e.error))
        return
    raise AssertionError(f"expected {status} for {kwargs}")


hi = [{"role": "user", "content": "hi"}]
expect(404, model="llama3.2", messages=hi)
expect(400, model=model, messages=hi, options={"temprature": 0.5})
expect(400, model=model, messages=hi, options={"mirostat": 2})
expect(400, model=model, messages=hi, format={"type": "string", "minLength": 3, "maxLength": 1})

# Structured output through `format`: a schema the reply follows (random weights: only the
# constraint makes it valid).
schema = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"enum": [1, 2, 3]}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
r = client.chat(model=model, messages=hi, format=schema, options={"num_predict": 200, "seed": 2}, think=False)
jsonschema.validate(json.loads(r.message.content), schema)
check(r.done_reason == "stop", r)
try:
    ollama.Client(host=base, headers={"Authorization": "Bearer wrong"}).list()
    raise AssertionError("a wrong key was accepted")
except ollama.ResponseError as e:
    check(e.status_code == 401, e)

# Tools round trip on the forced server: a Python function as the tool, as the client allows.
def get_weather(city: str, days: int) -> str:
    """The weather in a city.

    Args:
      city: The city
      days: How many days
    """
    return "sunny, 21 C"


forced = ollama.Client(host=forced_base, headers=auth, timeout=300)
messages = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
r = forced.chat(model=model, messages=messages, tools=[get_weather])
check(r.message.thinking == "Checking the weather.", r.message)
call = r.message.tool_calls[0]
check(call.function.name == "get_weather" and call.function.arguments == {"city": "Paris", "days": 3}, call)
calls = [c for chunk in forced.chat(model=model, messages=messages, tools=[get_weather], stream=True)
         for c in (chunk.message.tool_calls or [])]
check(len(calls) == 1 and calls[0].function.arguments == {"city": "Paris", "days": 3}, calls)
messages += [r.message, {"role": "tool", "content": get_weather(**call.function.arguments), "tool_name": "get_weather"}]
r = forced.chat(model=model, messages=messages, tools=[get_weather])
check(r.done, r)

print(f"ollama {version('ollama')}: {check.count} checks passed")
