"""Drives `qwen-gdn serve` with the official `openai` Python client (run by
scripts/test-serve-clients.sh, which starts the servers).

    python scripts/test_serve_openai.py BASE_URL API_KEY FORCED_BASE_URL

BASE_URL serves a tiny checkpoint with --api-key API_KEY; FORCED_BASE_URL serves it with the
debug-build switch QWEN_GDN_TEST_FORCE_OUTPUT set to a Qwen XML tool call (the tiny models
print gibberish, so a real call has to be forced). Every check raises on failure.
"""

import json
import sys

import openai
from openai import OpenAI
from serve_client_checks import Checks

base, key, forced_base = sys.argv[1:4]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
check = Checks()


# Models: the served name is the --model argument.
models = client.models.list()
model = models.data[0].id
check(len(models.data) == 1 and models.data[0].object == "model", f"models: {models}")

# Chat, not streamed.
r = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Hello there"}],
    max_tokens=8,
    temperature=0,
    extra_body={"chat_template_kwargs": {"enable_thinking": False}},
)
check(r.object == "chat.completion", r)
check(r.choices[0].finish_reason in ("stop", "length"), r)
check(isinstance(r.choices[0].message.content, str), r)
check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)
greedy = r.choices[0].message.content

# The same, streamed (with usage): the deltas join to the same greedy text.
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Hello there"}],
    max_tokens=8,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
    extra_body={"chat_template_kwargs": {"enable_thinking": False}},
)
text, finish, usage = "", None, None
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = chunk.usage
check(text == greedy, f"streamed {text!r} != {greedy!r}")
check(finish in ("stop", "length") and usage is not None, (finish, usage))

# Thinking on (the default for this vocabulary): the reply comes as reasoning_content.
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0
)
check(getattr(r.choices[0].message, "reasoning_content", None), r)

# Completions.
r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=6, temperature=0)
check(r.object == "text_completion" and isinstance(r.choices[0].text, str), r)
check(r.usage.completion_tokens >= 1, r.usage)
pieces = list(
    client.completions.create(model=model, prompt="Once upon a time", max_tokens=6, temperature=0, stream=True)
)
check("".join(p.choices[0].text for p in pieces) == r.choices[0].text, pieces)

# The prompt cache: a second conversation sharing the system prompt reuses its tokens.
system = {"role": "system", "content": "You are a helpful assistant who answers in French. " * 8}
for question, want_cached in (("What is the sea?", False), ("What is the sky?", True)):
    r = client.chat.completions.create(
        model=model, messages=[system, {"role": "user", "content": question}], max_tokens=2
    )
    cached = r.usage.prompt_tokens_details.cached_tokens
    check((cached > 0) == want_cached, f"{question}: cached_tokens = {cached}")

# Errors, as the client's exception classes.
def expect(exc, code=None, **kwargs):
    try:
        client.chat.completions.create(**kwargs)
    except exc as e:
        check(e.body is None or "message" in e.body, e.body)
        if code:
            check(e.code == code, f"{e.code} != {code}")
        return
    raise AssertionError(f"expected {exc.__name__} for {kwargs}")


hi = [{"role": "user", "content": "hi"}]
expect(openai.NotFoundError, "model_not_found", model="gpt-4o", messages=hi)
expect(openai.BadRequestError, model=model, messages=hi, temperature=-1)
expect(openai.BadRequestError, model=model, messages=hi, top_p=2)
expect(openai.BadRequestError, "context_length_exceeded", model=model,
       messages=[{"role": "user", "content": "sea " * 6000}])
try:
    OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError:
    check(True, "a wrong key is refused")

# Tools round trip, on the server whose reply is forced to a call.
forced = OpenAI(base_url=forced_base, api_key=key, max_retries=0, timeout=300)
tools = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}]
messages = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
r = forced.chat.completions.create(model=model, messages=messages, tools=tools)
choice = r.choices[0]
check(choice.finish_reason == "tool_calls", r)
call = choice.message.tool_calls[0]
check(call.function.name == "get_weather", call)
check(json.loads(call.function.arguments) == {"city": "Paris", "days": 3}, call.function.arguments)

# Streamed, the client accumulates the call from its deltas.
calls = {}
for chunk in forced.chat.completions.create(model=model, messages=messages, tools=tools, stream=True):
    for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
        c = calls.setdefault(d.index, {"name": "", "arguments": ""})
        c["name"] += d.function.name or ""
        c["arguments"] += d.function.arguments or ""
check(calls and calls[0]["name"] == "get_weather", calls)
check(json.loads(calls[0]["arguments"])["city"] == "Paris", calls)

# The call and the tool's answer go back through the template.
messages += [choice.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
r = forced.chat.completions.create(model=model, messages=messages, tools=tools)
check(r.choices[0].message is not None, r)

print(f"openai {openai.__version__}: {check.count} checks passed")
