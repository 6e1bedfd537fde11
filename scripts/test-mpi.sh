#!/usr/bin/env bash
# The MPI layer between real processes on this machine's CPU (loopback) under mpirun:
#  1. the collectives on 2 and 3 ranks (crates/qwen-gdn-collective/tests/mpi_collective.rs);
#  2. the pipeline plan's gate on 2 and 3 ranks: every hybrid fixture, 64 greedy steps, tokens
#     and f32 logits bit for bit those of one rank (crates/qwen-gdn-model/tests/pipeline_mpi.rs);
#  3. a rank that dies or stalls mid-decode: every other rank ends with one `error: rank ...`
#     line and a non-zero exit within its 5 s deadline (plus start-up), no hang;
#  3b. the expert-parallel plan's gate on 2 and 3 ranks (crates/qwen-gdn-model/tests/
#     experts_mpi.rs: every MoE fixture bit for bit one process's) and its faults;
#  3c. the tensor-parallel plan's gate on 2 and 3 ranks (tests/tensor_mpi.rs: every hybrid
#     fixture bit for bit one process's, the MoE ones with their experts split too);
#  3d. the prompt cache over ranks on 2 and 3 ranks (tests/prompt_cache_mpi.rs: each rank's
#     shard snapshotted and restored, a resumed request bit for bit a cold one, every plan);
#  4. `qwen-gdn generate --ranks 2` and `mpirun -n 3 qwen-gdn generate` (the `mpi` build):
#     the same text as one process, with the layout printed;
#  5. `qwen-gdn chat --ranks 2` and `mpirun -n 3 qwen-gdn chat`: two turns print what one
#     process prints, the second resumed from the prompt cache as far; SIGTERM ends every rank;
#  6. `serve --ranks 2` and `mpirun -n 3 qwen-gdn serve` (scripts/test-mpi-serve.sh): plain and
#     streamed completions as one process's, the prompt cache across ranks, a client leaving
#     mid-stream, SIGTERM, and a rank killed.
# Installs Open MPI from Debian when missing (CI runs as root on a fresh machine); bindgen also
# needs libclang. Each run is bounded by a timeout so that a stuck rank fails the job instead
# of hanging it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq libopenmpi-dev openmpi-bin libclang-dev >/dev/null
fi
# The path of the executable target $1 that cargo command "${@:2}" builds.
built() {
    local name=$1
    shift
    cargo "$@" --message-format=json | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$name"
}
# The path of test binary $3 of package $1 built with feature $2.
test_binary() {
    built "$3" test --locked -p "$1" --features "$2" --test "$3" --no-run
}
mpirun=(mpirun --allow-run-as-root --oversubscribe)
collective=$(test_binary qwen-gdn-collective mpi mpi_collective)
for ranks in 2 3; do
    echo "mpi_collective on $ranks ranks"
    timeout 120 "${mpirun[@]}" -np "$ranks" "$collective" --test-threads=1
done

pipeline=$(test_binary qwen-gdn-model mpi pipeline_mpi)
for ranks in 2 3; do
    echo "pipeline_mpi on $ranks ranks"
    timeout 300 "${mpirun[@]}" -np "$ranks" "$pipeline" --test-threads=1 --nocapture
done

# A fault at decode step 3 of 3 ranks: the survivors' one line each, within the deadline.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for fault in stall:1:3 die:1:3 stall:2:3; do
    echo "pipeline_mpi on 3 ranks, fault $fault"
    start=$(date +%s)
    status=0
    PIPELINE_TEST_FAULT=$fault timeout 60 "${mpirun[@]}" -np 3 "$pipeline" --test-threads=1 \
        --nocapture >"$log" 2>&1 || status=$?
    took=$(( $(date +%s) - start ))
    faulty=${fault#*:}; faulty=${faulty%%:*}
    if [ "$status" -eq 0 ] || [ "$status" -eq 124 ]; then
        cat "$log"; echo "FAIL: fault $fault: exit status $status (expected a failure, not a pass or a hang)"; exit 1
    fi
    for rank in 0 1 2; do
        [ "$rank" = "$faulty" ] && continue
        # Its own timeout's line, or, when mpirun stopped it first (after the dead rank, or
        # after the first survivor to give up), the line of the launcher's SIGTERM.
        if [ "$(grep -c "^error: rank $rank: " "$log")" != 1 ]; then
            cat "$log"; echo "FAIL: fault $fault: rank $rank did not end with its one line"; exit 1
        fi
    done
    echo "fault $fault: exit $status after ${took}s"
done

# The expert-parallel plan: every MoE fixture (qwen4_exp included) with its experts over 2 and 3
# ranks, 64 greedy steps, tokens and f32 logits bit for bit one process's on every rank; then a
# rank that dies or stalls in a reduction: the others' one line each within the deadline.
experts=$(test_binary qwen-gdn-model mpi experts_mpi)
for ranks in 2 3; do
    echo "experts_mpi on $ranks ranks"
    timeout 300 "${mpirun[@]}" -np "$ranks" "$experts" --test-threads=1 --nocapture
done
for fault in stall:2:3 die:1:3; do
    echo "experts_mpi on 3 ranks, fault $fault"
    status=0
    EXPERTS_TEST_FAULT=$fault timeout 60 "${mpirun[@]}" -np 3 "$experts" --test-threads=1 \
        --nocapture >"$log" 2>&1 || status=$?
    faulty=${fault#*:}; faulty=${faulty%%:*}
    if [ "$status" -eq 0 ] || [ "$status" -eq 124 ]; then
        cat "$log"; echo "FAIL: experts fault $fault: exit status $status (expected a failure, not a pass or a hang)"; exit 1
    fi
    for rank in 0 1 2; do
        [ "$rank" = "$faulty" ] && continue
        if [ "$(grep -c "^error: rank $rank: " "$log")" != 1 ]; then
            cat "$log"; echo "FAIL: experts fault $fault: rank $rank did not end with its one line"; exit 1
        fi
    done
    echo "experts fault $fault: exit $status"
done

# The tensor-parallel plan: every hybrid fixture with its GDN and attention heads over 2 and 3
# ranks (4 heads: 2 / 1 / 1 on 3 ranks), 64 greedy steps, tokens and f32 logits bit for bit one
# process's on every rank; qwen4_exp refused in one line. (Its reductions are the expert plan's
# bounded sums, whose faults are injected above.)
tensor=$(test_binary qwen-gdn-model mpi tensor_mpi)
for ranks in 2 3; do
    echo "tensor_mpi on $ranks ranks"
    timeout 300 "${mpirun[@]}" -np "$ranks" "$tensor" --test-threads=1 --nocapture
done

# The prompt cache over ranks: each rank snapshots its own shard of the state (every plan, every
# hybrid fixture); a request resumed from the shards is bit for bit the cold one over ranks and
# in one process, and when one rank lost its snapshot every rank misses.
prompt_cache=$(test_binary qwen-gdn-model mpi prompt_cache_mpi)
for ranks in 2 3; do
    echo "prompt_cache_mpi on $ranks ranks"
    timeout 120 "${mpirun[@]}" -np "$ranks" "$prompt_cache" --test-threads=1 --nocapture
done

# generate over ranks prints what one process prints (greedy, the tied-head fixture and one with
# an untied head), and the layout.
qwen_gdn=$(built qwen-gdn build --locked -p qwen-gdn --features mpi --bin qwen-gdn)
for model in models/qwen3.5-tiny-4bit models/qwen3-next-tiny-4bit; do
    run=(generate --model "$model" --prompt "The pipeline" --max-tokens 24 --verbose false)
    want=$(timeout 120 "$qwen_gdn" "${run[@]}" 2>/dev/null)
    got2=$(timeout 120 "$qwen_gdn" "${run[@]}" --ranks 2 2>"$log")
    grep -q "^pipeline stage 1 of 2 on .*: layers 3..6 + final norm and output head$" "$log" \
        || { cat "$log"; echo "FAIL: $model: no layout line for rank 1 of 2"; exit 1; }
    got3=$(timeout 120 "${mpirun[@]}" -np 3 "$qwen_gdn" "${run[@]}" 2>"$log")
    grep -q "^pipeline stage 0 of 3 on .*: layers 0..2 + embedding$" "$log" \
        || { cat "$log"; echo "FAIL: $model: no layout line for rank 0 of 3"; exit 1; }
    if [ "$got2" != "$want" ] || [ "$got3" != "$want" ]; then
        printf 'one process: %q\n2 ranks:     %q\n3 ranks:     %q\n' "$want" "$got2" "$got3"
        echo "FAIL: $model: generate over ranks differs from one process"; exit 1
    fi
    echo "generate on $model: 2 and 3 ranks print what one process prints"
done

# generate with the experts, or the heads, split over ranks prints what one process prints
# (greedy, and sampled with a seed: every rank must draw the same token), with the layout.
model=models/qwen3-next-tiny-4bit
for plan in "experts:^expert parallel, rank 1 of 2 on .*: experts 4..8 of 8 in each MoE layer" \
    "tensor:^tensor parallel, rank 1 of 2 on .*: GDN value heads 2..4 of 4, attention heads 2..4 of 4" \
    "tensor-experts:^tensor parallel, rank 1 of 2 on .*: GDN value heads 2..4 of 4, .*; experts 4..8 of 8"; do
    kind=${plan%%:*}
    layout=${plan#*:}
    for sampling in "--temp 0" "--temp 0.8 --seed 7"; do
        # shellcheck disable=SC2206 # the sampling flags are words
        run=(generate --model "$model" --prompt "The $kind" --max-tokens 24 --verbose false $sampling)
        want=$(timeout 120 "$qwen_gdn" "${run[@]}" 2>/dev/null)
        got2=$(timeout 120 "$qwen_gdn" "${run[@]}" --ranks 2 --parallel "$kind" 2>"$log")
        grep -q "$layout" "$log" \
            || { cat "$log"; echo "FAIL: $model: no $kind layout line for rank 1 of 2"; exit 1; }
        got3=$(timeout 120 "${mpirun[@]}" -np 3 "$qwen_gdn" "${run[@]}" --parallel "$kind" 2>"$log")
        if [ "$got2" != "$want" ] || [ "$got3" != "$want" ]; then
            printf 'one process: %q\n2 ranks:     %q\n3 ranks:     %q\n' "$want" "$got2" "$got3"
            echo "FAIL: $model ($sampling): generate --parallel $kind differs from one process"; exit 1
        fi
        echo "generate --parallel $kind on $model ($sampling): 2 and 3 ranks print what one process prints"
    done
done

# chat over ranks: rank 0 holds the session and broadcasts each turn; two turns (greedy, and
# sampled with a seed) print what one process prints, and the second turn resumes from the
# prompt cache (every rank's shard) as far as one process does: the same "Prompt: N tokens,
# C cached" lines, C > 0.
counts() { grep -o '^Prompt: [0-9]* tokens, [0-9]* cached' "$1"; }
one=$(mktemp)
trap 'rm -f "$log" "$one"' EXIT
for model in models/qwen3-next-tiny-4bit models/qwen3.5-tiny-4bit; do
    for sampling in "--temp 0" "--temp 0.8 --seed 7"; do
        # shellcheck disable=SC2206 # the sampling flags are words
        run=(chat --model "$model" --max-tokens 12 --verbose $sampling)
        turns=$'Hello there\nTell me more\n'
        want=$(timeout 120 "$qwen_gdn" "${run[@]}" <<<"$turns" 2>"$one")
        [ "$(counts "$one" | tail -1 | grep -o '[0-9]* cached')" != "0 cached" ] \
            || { cat "$one"; echo "FAIL: $model: one process's second turn missed the prompt cache"; exit 1; }
        got2=$(timeout 120 "$qwen_gdn" "${run[@]}" --ranks 2 <<<"$turns" 2>"$log") \
            || { cat "$log"; echo "FAIL: $model: chat --ranks 2 failed"; exit 1; }
        [ "$(counts "$log")" = "$(counts "$one")" ] \
            || { cat "$one" "$log"; echo "FAIL: $model: chat --ranks 2 cached other counts"; exit 1; }
        plan=tensor-experts
        [ "$model" = models/qwen3.5-tiny-4bit ] && plan=tensor
        got3=$(timeout 120 "${mpirun[@]}" -np 3 "$qwen_gdn" "${run[@]}" --parallel $plan <<<"$turns" 2>"$log") \
            || { cat "$log"; echo "FAIL: $model: chat on 3 ranks ($plan) failed"; exit 1; }
        [ "$(counts "$log")" = "$(counts "$one")" ] \
            || { cat "$one" "$log"; echo "FAIL: $model: chat on 3 ranks ($plan) cached other counts"; exit 1; }
        if [ "$got2" != "$want" ] || [ "$got3" != "$want" ]; then
            printf 'one process: %q\n2 ranks:     %q\n3 ranks:     %q\n' "$want" "$got2" "$got3"
            echo "FAIL: $model ($sampling): chat over ranks differs from one process"; exit 1
        fi
        echo "chat on $model ($sampling): pipeline on 2 ranks and $plan on 3 print what one process prints, $(counts "$log" | tail -1)"
    done
done

# SIGTERM to `chat --ranks 2` waiting for a message ends every rank (each with its one line)
# within 10 s, leaving no process of the job behind.
fifo=$(mktemp -u)
mkfifo "$fifo"
exec 3<>"$fifo"
"$qwen_gdn" chat --model models/qwen3-next-tiny-4bit --ranks 2 <"$fifo" >/dev/null 2>"$log" &
parent=$!
for _ in $(seq 120); do
    [ "$(grep -c '^pipeline stage' "$log")" = 2 ] && break
    sleep 0.5
done
sleep 1 # past the load, into the wait for a message
start=$(date +%s)
kill -TERM "$parent"
status=0
timeout 10 tail --pid="$parent" -f /dev/null || status=$?
exec 3>&-
rm -f "$fifo"
left=$(pgrep -f "$qwen_gdn chat --model models/qwen3-next-tiny-4bit" || true)
if [ "$status" -ne 0 ] || [ -n "$left" ]; then
    cat "$log"; echo "FAIL: SIGTERM did not end chat --ranks 2 within 10 s (left: ${left:-none})"
    [ -n "$left" ] && kill -KILL $left
    exit 1
fi
for rank in 0 1; do
    [ "$(grep -c "^error: rank $rank: " "$log")" = 1 ] \
        || { cat "$log"; echo "FAIL: SIGTERM: rank $rank did not end with its one line"; exit 1; }
done
echo "SIGTERM ended chat --ranks 2 and its ranks after $(( $(date +%s) - start ))s"

# serve over ranks: rank 0 serves HTTP and leads each request over the ranks.
bash scripts/test-mpi-serve.sh "$qwen_gdn"
