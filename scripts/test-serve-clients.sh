#!/usr/bin/env bash
# `qwen-gdn serve` driven by real clients, each API by its own: the official `openai`,
# `anthropic` and `ollama` Python packages, and the Prometheus project's `prometheus_client`
# parser for /metrics (pinned in scripts/requirements-serve-test.txt, installed into a venv),
# and curl. Starts two servers once, on free ports with a tiny checkpoint and a debug build
# (the second one's test switch forces some thinking and a tool call), and runs every client
# against them: each API's own checks (log-probabilities against `eval --json`, structured
# output validated by `jsonschema`), the same greedy text through the three APIs, then the
# metrics those requests left and the JSON request log. A third server, with a small
# --max-batch and --queue-size, takes the load test (continuous batching: 64 concurrent
# clients, each completed greedy reply equal to its reply alone, each choice of the n=2
# requests equal to its reply alone with seed + i, the rest clean 503s).
#
#   bash scripts/test-serve-clients.sh
#
# VENV (default <repo>/.venv-serve-clients), PYTHON (the interpreter that creates it) and
# QWEN_GDN (a debug binary; default: target/debug/qwen-gdn, built here) can be set.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="${VENV:-$repo/.venv-serve-clients}"
model="$repo/models/qwen3.5-tiny-4bit"
fail() { echo "test-serve-clients: FAILED: $*" >&2; exit 1; }

if [ -z "${QWEN_GDN:-}" ]; then
    cargo build -q -p qwen-gdn --bin qwen-gdn
    QWEN_GDN="$repo/target/debug/qwen-gdn"
fi
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --disable-pip-version-check -q -r scripts/requirements-serve-test.txt
py="$venv/bin/python"

tmp="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# Starts a server on a free port, with the environment assignments given as arguments and
# the flags in $serve_flags; sets $base_url once it listens. (Not run in $(...): the server
# would hold its output open.)
serve_flags=()
start() {
    local log="$tmp/server-${#pids[@]}.log"
    env "$@" "$QWEN_GDN" serve --model "$model" --served-model-name "$name" --port 0 \
        --api-key "$key" --log-format json "${serve_flags[@]}" >/dev/null 2>"$log" &
    pids+=($!)
    for _ in $(seq 1 600); do
        if grep -q "http://" "$log"; then
            base_url="$(grep -o "http://[0-9.:]*" "$log" | head -1)"
            return
        fi
        kill -0 "${pids[-1]}" 2>/dev/null || { cat "$log" >&2; fail "the server exited"; }
        sleep 0.1
    done
    cat "$log" >&2
    fail "the server did not start"
}

key="test-key-$RANDOM"
name="qwen3.5-tiny"
start
url="$base_url"
main_log="$tmp/server-0.log"
forced_call=$'Checking the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>'
start QWEN_GDN_TEST_FORCE_OUTPUT="$forced_call"
forced_url="$base_url"
serve_flags=(--max-batch 12 --queue-size 20)
start
load_url="$base_url"
serve_flags=()

echo "== openai client" >&2
"$py" scripts/test_serve_openai.py "$url/v1" "$key" "$forced_url/v1" || fail "the openai client checks"
echo "== openai client: log-probabilities against eval --json" >&2
"$py" scripts/test_serve_logprobs.py "$url/v1" "$key" "$QWEN_GDN" "$model" || fail "the log-probabilities"
echo "== openai client: structured output validated with jsonschema" >&2
"$py" scripts/test_serve_structured.py "$url/v1" "$key" || fail "the structured output"
echo "== anthropic client" >&2
"$py" scripts/test_serve_anthropic.py "$url" "$key" "$forced_url" "$name" || fail "the anthropic client checks"
echo "== ollama client" >&2
"$py" scripts/test_serve_ollama.py "$url" "$key" "$forced_url" "$name" || fail "the ollama client checks"
echo "== the same greedy text through every API" >&2
"$py" scripts/test_serve_same_text.py "$url" "$key" "$name" || fail "the APIs' texts differ"

echo "== load: 64 concurrent openai clients against --max-batch 12 --queue-size 20" >&2
timeout 300 "$py" scripts/test_serve_load.py "$load_url" "$key" "$name" || fail "the load test"

echo "== curl" >&2
auth=(-H "Authorization: Bearer $key")
json=(-H "Content-Type: application/json")
# status BODY_FILE curl-args...: the HTTP status of a request, its body saved.
status() { local out="$1"; shift; curl -sS -o "$out" -w '%{http_code}' "$@"; }
expect_status() {
    local want="$1"; shift
    local got; got="$(status "$tmp/body" "$@")"
    [ "$got" = "$want" ] || fail "curl $* -> $got, expected $want: $(cat "$tmp/body")"
}
# The body must be OpenAI's error shape.
expect_error() {
    expect_status "$@"
    "$py" -c 'import json,sys; e=json.load(open(sys.argv[1]))["error"]; assert e["message"] and "type" in e and "param" in e and "code" in e' "$tmp/body" \
        || fail "not an OpenAI error: $(cat "$tmp/body")"
}
expect_status 200 "$url/health"
expect_status 200 "${auth[@]}" "$url/v1/models"
expect_status 200 "${auth[@]}" "${json[@]}" "$url/v1/chat/completions" \
    -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":4,"temperature":0}'
"$py" -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["object"]=="chat.completion" and r["usage"]["completion_tokens"]>=1' "$tmp/body" \
    || fail "chat reply: $(cat "$tmp/body")"
curl -sSN "${auth[@]}" "${json[@]}" "$url/v1/chat/completions" \
    -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":4,"stream":true}' > "$tmp/sse"
[ "$(grep -c '^data: ' "$tmp/sse")" -ge 3 ] || fail "stream: $(cat "$tmp/sse")"
[ "$(grep '^data: ' "$tmp/sse" | tail -1)" = "data: [DONE]" ] || fail "stream does not end in [DONE]"
expect_status 200 "${auth[@]}" "${json[@]}" "$url/v1/completions" -d '{"prompt":"Hello","max_tokens":3}'
expect_error 401 "${json[@]}" "$url/v1/completions" -d '{"prompt":"Hello"}'
expect_error 401 -H "Authorization: Bearer nope" "$url/v1/models"
expect_error 400 "${auth[@]}" "${json[@]}" "$url/v1/chat/completions" -d '{"messages": ['
expect_error 400 "${auth[@]}" "${json[@]}" "$url/v1/chat/completions" \
    -d '{"messages":[{"role":"user","content":"hi"}],"min_p":3}'
expect_error 404 "${auth[@]}" "${json[@]}" "$url/v1/chat/completions" \
    -d '{"model":"nope","messages":[{"role":"user","content":"hi"}]}'
expect_error 404 "${auth[@]}" "$url/v1/embeddings"
head -c 40000000 /dev/zero | tr '\0' 'a' > "$tmp/big"
expect_error 413 "${auth[@]}" "${json[@]}" "$url/v1/completions" --data-binary @"$tmp/big"
expect_status 200 "$url/health"

echo "== metrics and the JSON request log" >&2
"$py" scripts/test_serve_metrics.py "$url" "$key" || fail "the metrics"
# With --log-format json every request is one JSON line on stderr (the rest is start-up text).
"$py" - "$main_log" <<'PY' || fail "the request log: $(tail -5 "$main_log")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
apis = {l["api"] for l in lines}
assert {"openai", "anthropic", "ollama"} <= apis, apis
assert all({"time", "method", "path", "status", "duration_ms"} <= l.keys() for l in lines)
done = [l for l in lines if "completion_tokens" in l]
assert done and all(l["finish"] in ("stop", "length") for l in done if l["status"] == 200)
print(f"request log: {len(lines)} JSON lines, {len(done)} with a generation")
PY
echo "test-serve-clients: all passed" >&2
