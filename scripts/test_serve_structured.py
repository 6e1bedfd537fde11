"""Structured output from `qwen-gdn serve` through the official `openai` Python client: replies
constrained by `response_format` json_schema, and tool calls forced by `tool_choice`, parse and
validate against their schema with the `jsonschema` package (run by scripts/test-serve-clients.sh; the tiny model's weights are random,
so only the constraint makes them valid).

    python scripts/test_serve_structured.py BASE_URL API_KEY
"""

import json
import sys

import jsonschema
import openai
from openai import OpenAI
from serve_client_checks import Checks

base, key = sys.argv[1:3]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
check = Checks()
model = client.models.list().data[0].id

person = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "emails": {
            "type": "array",
            "items": {"type": "string", "maxLength": 12},
            "minItems": 1,
            "maxItems": 3,
        },
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["name", "age", "role", "emails", "address"],
    "additionalProperties": False,
}
for seed in range(4):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a person."}],
        max_tokens=400,
        temperature=1,
        seed=seed,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": person, "strict": True},
        },
    )
    text = r.choices[0].message.content
    check(r.choices[0].finish_reason == "stop", f"seed {seed}: cut off: {text!r}")
    jsonschema.validate(json.loads(text), person)
    check(True, "valid")

# A schema no document satisfies: OpenAI's 400 shape.
try:
    client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "string", "minLength": 3, "maxLength": 1}},
        },
    )
    raise AssertionError("an unsatisfiable schema was accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "Unsatisfiable" in str(e), e)

# Forced tool calls: tool_choice required or named gives one call to a declared tool whose
# arguments validate against its schema (the tiny model never writes one unconstrained).
alarm = {
    "type": "object",
    "properties": {
        "hour": {"type": "integer", "minimum": 0, "maximum": 23},
        "repeat": {"type": "boolean"},
        "label": {"type": "string", "minLength": 1, "maxLength": 8},
    },
    "required": ["hour", "repeat"],
    "additionalProperties": False,
}
tools = [
    {"type": "function", "function": {"name": "set_alarm", "parameters": alarm}},
    {"type": "function", "function": {"name": "add_person", "parameters": person}},
]
schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
for choice in ["required", {"type": "function", "function": {"name": "set_alarm"}}]:
    for seed in range(2):
        ask = dict(
            model=model,
            messages=[{"role": "user", "content": "Wake me at seven."}],
            tools=tools,
            tool_choice=choice,
            max_tokens=400,
            temperature=1,
            seed=seed,
        )
        r = client.chat.completions.create(**ask)
        check(r.choices[0].finish_reason == "tool_calls", f"{choice} seed {seed}: {r}")
        (call,) = r.choices[0].message.tool_calls
        name = call.function.name
        check(name in schemas and (choice == "required" or name == "set_alarm"), call)
        jsonschema.validate(json.loads(call.function.arguments), schemas[name])
        # Streamed: the same seed, the same call.
        deltas = [
            d
            for chunk in client.chat.completions.create(**ask, stream=True)
            for d in (chunk.choices[0].delta.tool_calls or [] if chunk.choices else [])
        ]
        check(len(deltas) == 1 and deltas[0].function.name == name, deltas)
        check(deltas[0].function.arguments == call.function.arguments, deltas)
try:
    client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "nope"}},
    )
    raise AssertionError("a tool_choice naming an undeclared tool was accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and e.body["param"] == "tool_choice", e)

print(f"structured output: {check.count} checks passed")
