"""Drives `qwen-gdn serve`'s Anthropic Messages API with the official `anthropic` Python
client (run by scripts/test-serve-clients.sh, which starts the servers).

    python scripts/test_serve_anthropic.py BASE_URL API_KEY FORCED_BASE_URL MODEL

BASE_URL serves a tiny checkpoint with --api-key API_KEY (the client sends it as x-api-key);
FORCED_BASE_URL serves it with the debug-build switch QWEN_GDN_TEST_FORCE_OUTPUT set to some
thinking and a Qwen XML tool call (the tiny models print gibberish, so a real call has to be
forced). MODEL is the served model name. Every check raises on failure.
"""

import sys

import anthropic
from anthropic import Anthropic
from serve_client_checks import Checks

base, key, forced_base, model = sys.argv[1:5]
client = Anthropic(base_url=base, api_key=key, max_retries=0, timeout=300)
# Anthropic's current API has no sampling fields (the SDK's create() takes none); the server
# still reads `temperature`, which makes the replies greedy and comparable.
GREEDY = {"temperature": 0}
check = Checks()


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


system = "You are a terse assistant. " * 6
conversation = [
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "Hi. What do you need?"},
    {"role": "user", "content": [{"type": "text", "text": "Tell me about the sea"}]},
]

# Plain: system, multi-turn, greedy.
r = client.messages.create(model=model, system=system, messages=conversation, max_tokens=12, extra_body=GREEDY)
check(r.type == "message" and r.role == "assistant", r)
check(r.stop_reason in ("end_turn", "max_tokens"), r.stop_reason)
check(r.usage.output_tokens >= 1 and r.usage.input_tokens >= 1, r.usage)
greedy = text_of(r)
check(greedy, r)

# Streamed: the SDK's accumulated message equals the plain one; the prompt now comes from the
# prompt cache.
with client.messages.stream(
    model=model, system=system, messages=conversation, max_tokens=12, extra_body=GREEDY
) as stream:
    streamed = "".join(stream.text_stream)
    final = stream.get_final_message()
check(streamed == greedy, f"streamed {streamed!r} != {greedy!r}")
check(text_of(final) == greedy and final.stop_reason == r.stop_reason, final)
check(final.usage.output_tokens == r.usage.output_tokens, final.usage)
check(final.usage.cache_read_input_tokens > 0, f"no cache read: {final.usage}")
check(
    final.usage.input_tokens + final.usage.cache_read_input_tokens
    == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0),
    (final.usage, r.usage),
)

# stop_sequences: two visible characters from the middle of the greedy text.
at = next(i for i in range(len(greedy) // 2, len(greedy) - 1) if not greedy[i : i + 2].isspace() and " " not in greedy[i : i + 2])
stop = greedy[at : at + 2]
r = client.messages.create(
    model=model, system=system, messages=conversation, max_tokens=12, stop_sequences=[stop], extra_body=GREEDY
)
check(r.stop_reason == "stop_sequence" and r.stop_sequence == stop, r)
check(text_of(r) == greedy[: greedy.index(stop)], (text_of(r), greedy, stop))

# Thinking: a thinking block first.
r = client.messages.create(
    model=model,
    messages=[{"role": "user", "content": "hi"}],
    max_tokens=8,
    extra_body=GREEDY,
    thinking={"type": "enabled", "budget_tokens": 1024},
)
check(r.content and r.content[0].type == "thinking" and r.content[0].thinking, r)

# Errors, as the SDK's exception classes, with Anthropic's error body.
def expect(exc, kind, **kwargs):
    try:
        client.messages.create(**kwargs)
    except exc as e:
        check(e.body["type"] == "error" and e.body["error"]["type"] == kind, e.body)
        return
    raise AssertionError(f"expected {exc.__name__} for {kwargs}")


hi = [{"role": "user", "content": "hi"}]
expect(anthropic.NotFoundError, "not_found_error", model="claude-of-another-server", messages=hi, max_tokens=5)
expect(anthropic.BadRequestError, "invalid_request_error", model=model, messages=hi, max_tokens=5, extra_body={"temperature": -1})
expect(anthropic.BadRequestError, "invalid_request_error", model=model, messages=[], max_tokens=5)
expect(
    anthropic.BadRequestError,
    "invalid_request_error",
    model=model,
    messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}]}],
    max_tokens=5,
)
try:
    Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(model=model, messages=hi, max_tokens=2)
    raise AssertionError("a wrong key was accepted")
except anthropic.AuthenticationError as e:
    check(e.body["error"]["type"] == "authentication_error", e.body)

# Tools round trip, on the server whose reply is forced to some thinking and a call.
forced = Anthropic(base_url=forced_base, api_key=key, max_retries=0, timeout=300)
tools = [{
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}]
messages = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
thinking = {"type": "enabled", "budget_tokens": 1024}
r = forced.messages.create(model=model, messages=messages, tools=tools, max_tokens=256, thinking=thinking)
check(r.stop_reason == "tool_use", r)
check([b.type for b in r.content] == ["thinking", "tool_use"], r.content)
check(r.content[0].thinking == "Checking the weather.", r.content[0])
call = r.content[1]
check(call.name == "get_weather" and call.input == {"city": "Paris", "days": 3}, call)
# Streamed, the SDK builds the call's input from its input_json_delta.
with forced.messages.stream(model=model, messages=messages, tools=tools, max_tokens=256, thinking=thinking) as s:
    final = s.get_final_message()
uses = [b for b in final.content if b.type == "tool_use"]
check(uses and uses[0].input == {"city": "Paris", "days": 3}, final)
# The call and its result go back through the template.
messages += [
    {"role": "assistant", "content": r.content},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}]},
]
r = forced.messages.create(model=model, messages=messages, tools=tools, max_tokens=256, thinking=thinking)
check(r.type == "message", r)

# tool_choice any / tool on the unforced server: the reply is constrained to one call to a
# declared tool with input valid against its schema (random weights never write one alone).
bounded = {
    "name": "set_alarm",
    "input_schema": {
        "type": "object",
        "properties": {
            "hour": {"type": "integer", "minimum": 0, "maximum": 23},
            "repeat": {"type": "boolean"},
            "label": {"enum": ["work", "gym"]},
        },
        "required": ["hour", "repeat"],
        "additionalProperties": False,
    },
}
for choice in [{"type": "any"}, {"type": "tool", "name": "set_alarm"}]:
    ask = dict(model=model, messages=messages[:1], tools=[bounded], tool_choice=choice, max_tokens=200)
    r = client.messages.create(**ask, extra_body=GREEDY)
    check(r.stop_reason == "tool_use", r)
    (use,) = [b for b in r.content if b.type == "tool_use"]
    hour, repeat = use.input.get("hour"), use.input.get("repeat")
    check(use.name == "set_alarm" and isinstance(hour, int) and 0 <= hour <= 23, use)
    check(isinstance(repeat, bool) and set(use.input) <= {"hour", "repeat", "label"}, use)
    with client.messages.stream(**ask, extra_body=GREEDY) as s:
        final = s.get_final_message()
    check(final.stop_reason == "tool_use", final)
    check([b.input for b in final.content if b.type == "tool_use"] == [use.input], final)
try:
    client.messages.create(model=model, messages=messages[:1], tools=[bounded], max_tokens=5,
                           tool_choice={"type": "tool", "name": "nope"})
    raise AssertionError("a tool_choice naming an undeclared tool was accepted")
except anthropic.BadRequestError as e:
    check(e.body["error"]["type"] == "invalid_request_error" and "tool_choice" in str(e), e.body)

print(f"anthropic {anthropic.__version__}: {check.count} checks passed")
