#!/usr/bin/env bash
# `serve` over ranks (run by scripts/test-mpi.sh with the `mpi` build of qwen-gdn as $1; alone:
# `bash scripts/test-mpi-serve.sh target/debug/qwen-gdn`), greedy, on qwen3-next-tiny-4bit:
#  1. one process's `serve` answers five requests (a plain chat completion, the same one
#     streamed, a second turn behind it, whose prefix the prompt cache holds, the first with a
#     stop string from the middle of its reply, and the first sampled with a seed);
#  2. `serve --ranks 2` (pipeline) and `mpirun -np 3 serve --parallel tensor-experts` answer
#     them with the same text and finish, the streamed ones too, and the repeated prefix hits the prompt
#     cache of every rank's shard (as many cached tokens as one process);
#  3. a client that leaves mid-stream cancels the turn on every rank (the next request is
#     still answered in step, with the same text); logprobs are answered 400 over ranks and
#     --max-batch 4 is refused in one line;
#  4. SIGTERM to `serve --ranks 2` ends every rank, each with its one line, within 10 s,
#     leaving no process of the job; killing rank 1 of the 3 ends rank 0's server with one
#     line within 10 s.
set -euo pipefail
cd "$(dirname "$0")/.."
qwen_gdn=$1
mpirun=(mpirun --allow-run-as-root --oversubscribe)
model=models/qwen3-next-tiny-4bit
tmp=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: serve over ranks: $*"; exit 1; }

# start LOG COMMAND...: the server in the background ($pid), its /v1 address in $url.
start() {
    local log=$1
    shift
    : >"$log" # there before the background job opens it, for the grep below
    "$@" 2>"$log" &
    pid=$!
    for _ in $(seq 480); do
        url=$(grep -o 'http://[0-9.:]*/v1' "$log" | head -1 || true)
        [ -n "$url" ] && return 0
        kill -0 "$pid" 2>/dev/null || { cat "$log"; fail "the server ended before listening: $*"; }
        sleep 0.25
    done
    cat "$log"
    fail "no address within 120 s: $*"
}

# stop: SIGTERM to the server; it must end within 10 s.
stop() {
    kill -TERM "$pid"
    timeout 10 tail --pid="$pid" -f /dev/null || fail "SIGTERM did not end the server within 10 s"
    wait "$pid" 2>/dev/null || true
    pid=
}

# No process of the job left (the launcher's, nor any rank's).
no_orphans() {
    local left
    left=$(pgrep -f -- "$qwen_gdn serve --model $model" || true)
    if [ -n "$left" ]; then
        ps -o pid,args -p "$(echo $left | tr ' ' ',')" || true
        kill -KILL $left 2>/dev/null || true
        fail "$1: processes left behind: $left"
    fi
}

client() { timeout 120 python3 scripts/serve_ranks_client.py "$url" "$@"; }
first='[{"role": "user", "content": "Hello there"}]'
# The requests; their replies, one JSON line each, into $1: the first turn plain and streamed,
# the second turn behind it (the prompt cache), the first with a stop string from the middle of
# its reply (rank 0 ends the turn on every rank), and sampled with a seed.
requests() {
    local out=$1 reply stop
    client plain "$first" 16 >"$out"
    client stream "$first" 16 >>"$out"
    reply=$(head -1 "$out" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["text"]))')
    client plain "[{\"role\": \"user\", \"content\": \"Hello there\"}, {\"role\": \"assistant\", \"content\": $reply}, {\"role\": \"user\", \"content\": \"Tell me more\"}]" 16 >>"$out"
    stop=$(head -1 "$out" | python3 -c 'import json,sys; t = json.load(sys.stdin)["text"]; print(json.dumps([t[len(t) // 2:len(t) // 2 + 3]]))')
    client plain "$first" 16 "{\"stop\": $stop}" >>"$out"
    client stream "$first" 16 '{"temperature": 0.8, "seed": 7}' >>"$out"
}

start "$tmp/one.log" "$qwen_gdn" serve --model "$model" --port 0
requests "$tmp/want"
stop
last_cached=$(sed -n 3p "$tmp/want" | python3 -c 'import json,sys; print(json.load(sys.stdin)["cached"])')
[ "$last_cached" -gt 0 ] || { cat "$tmp/want"; fail "one process's second turn missed the prompt cache"; }
sed -n 4p "$tmp/want" | grep -q '"finish": "stop"' || { cat "$tmp/want"; fail "one process's request with a stop string did not stop"; }

# 2 ranks, pipeline; each piece of text slowed, so that a client can leave mid-stream.
start "$tmp/two.log" env QWEN_GDN_TEST_TOKEN_DELAY_MS=20 "$qwen_gdn" serve --model "$model" --port 0 --ranks 2
grep -q "^qwen-gdn serve: over 2 ranks (--parallel pipeline), one request at a time" "$tmp/two.log" \
    || { cat "$tmp/two.log"; fail "no line for the one-at-a-time path over 2 ranks"; }
requests "$tmp/two"
cmp -s "$tmp/want" "$tmp/two" || { cat "$tmp/want" "$tmp/two"; fail "serve --ranks 2 answered other than one process"; }
echo "serve --ranks 2 (pipeline): plain, streamed, the cached second turn, a stop string and seeded sampling as one process:"
sed 's/^/    /' "$tmp/two"

# What needs the model outside the turn is refused in one answer naming the parameter.
status=$(curl -s -o "$tmp/refused" -w '%{http_code}' "$url/chat/completions" \
    -H 'content-type: application/json' \
    -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "logprobs": true}')
[ "$status" = 400 ] && grep -q '"param":"logprobs"' "$tmp/refused" \
    || { cat "$tmp/refused"; fail "logprobs over ranks: status $status, not a 400 naming logprobs"; }

# A client that leaves mid-stream: the turn ends (cancelled) on every rank, long before its
# 400 tokens, and the ranks answer the next request in step.
client leave "$first" 400 >/dev/null
text() { python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["text"])'; }
after=$(client plain "$first" 16 | text) \
    || { cat "$tmp/two.log"; fail "the request after a client left was not answered"; }
[ "$after" = "$(text <"$tmp/want")" ] || { cat "$tmp/two.log"; fail "the request after a client left differs: $after"; }
cancelled=$(grep -c "generated, cancelled" "$tmp/two.log" || true)
[ "$cancelled" = 1 ] || { cat "$tmp/two.log"; fail "the client that left did not cancel its turn"; }
echo "serve --ranks 2: a client that left cancelled its turn on every rank ($(grep "generated, cancelled" "$tmp/two.log"))"

# SIGTERM to `serve --ranks 2`: every rank ends with its one line, nothing is left.
started=$(date +%s)
stop
no_orphans "SIGTERM"
for rank in 0 1; do
    [ "$(grep -c "^error: rank $rank: " "$tmp/two.log")" = 1 ] \
        || { cat "$tmp/two.log"; fail "SIGTERM: rank $rank did not end with its one line"; }
done
echo "SIGTERM ended serve --ranks 2 and its ranks after $(( $(date +%s) - started ))s"

# Batching over ranks is refused before the ranks start, in one line.
status=0
"$qwen_gdn" serve --model "$model" --port 0 --ranks 2 --max-batch 4 2>"$tmp/refused" || status=$?
[ "$status" -ne 0 ] && [ "$(wc -l <"$tmp/refused")" = 1 ] && grep -q "^error: --max-batch: over ranks" "$tmp/refused" \
    || { cat "$tmp/refused"; fail "--max-batch 4 --ranks 2: exit $status, not one line"; }

# 3 ranks under mpirun, experts and heads split.
start "$tmp/three.log" "${mpirun[@]}" -np 3 "$qwen_gdn" serve --model "$model" --port 0 --parallel tensor-experts
requests "$tmp/three"
cmp -s "$tmp/want" "$tmp/three" || { cat "$tmp/want" "$tmp/three"; fail "serve on 3 ranks (tensor-experts) answered other than one process"; }
echo "serve on 3 ranks (tensor-experts): plain, streamed, the cached second turn, a stop string and seeded sampling as one process"

# Rank 1 killed: the launcher stops the others; rank 0's server ends with one line.
rank1=
for p in $(pgrep -f -- "$qwen_gdn serve --model $model" || true); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && rank1=$p
done
[ -n "$rank1" ] || fail "rank 1 of the 3 not found"
started=$(date +%s)
kill -KILL "$rank1"
timeout 10 tail --pid="$pid" -f /dev/null || fail "killing rank 1 did not end the job within 10 s"
wait "$pid" 2>/dev/null || true
pid=
no_orphans "rank 1 killed"
[ "$(grep -c "^error: rank 0: " "$tmp/three.log")" = 1 ] \
    || { cat "$tmp/three.log"; fail "rank 1 killed: rank 0 did not end with one line"; }
echo "rank 1 killed: rank 0's server ended after $(( $(date +%s) - started ))s with: $(grep "^error: rank 0: " "$tmp/three.log")"
