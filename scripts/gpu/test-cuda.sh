#!/usr/bin/env bash
# The CUDA device test (issue 6), run ON the GPU machine with the binaries that
# scripts/gpu/build-cuda.sh packed here:
#   run tool: carry ["gpu-artefacts/cuda"], command: bash scripts/gpu/test-cuda.sh
# 1. warm-up: one short generate on CUDA (a fresh machine JIT-compiles candle's PTX, ~15 s);
# 2. every CUDA kernel against its CPU twin on random inputs (the cuda_* test binaries);
# 3. the device plan on CUDA against mlx-lm's references on every tiny checkpoint, with the
#    model issue's gates (device_plan with QWEN_GDN_TEST_DEVICE=cuda), and the fused decode
#    step (a replayed CUDA graph) against the composed step (fused_decode); qwen4_exp's
#    device plan against transformers on its two fixtures (qwen4_exp device_plan), and its
#    fused step (QSA selection on the device, no read-back) against its composed step
#    (qwen4_exp fused_decode);
# 4. on a machine with 2 GPUs or more, the parallel plans between two NCCL ranks;
# 5. `qwen-gdn eval --device cuda --compare-state-dtype bf16` on every tiny checkpoint.
# Logs go to $OUT (or gpu-artefacts/out); the last lines are a summary. Exit 1 if any step fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/common.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/env.txt"

declare -a summary
step() { # step NAME LOGFILE COMMAND...
  local name=$1 log=$2
  shift 2
  local t0=$SECONDS
  "$@" >"$OUT/$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-34s %s  (%d s, %s)' "$name" "$([ $rc -eq 0 ] && echo PASS || echo "FAIL rc=$rc")" $((SECONDS - t0)) "$log")")
  return $rc
}

fail=0
step "warm-up generate (PTX JIT)" warmup.txt \
  "$bin/qwen-gdn" generate --model models/qwen3.5-tiny-4bit --prompt "Hello" --max-tokens 4 \
  --temp 0 --device cuda || fail=1
for t in "$bin"/cuda_*; do
  n=$(basename "$t")
  step "$n vs CPU twin" "$n.txt" "$t" --test-threads=1 --nocapture || fail=1
done
cat "$OUT"/cuda_*.txt >"$OUT/kernels.txt"
step "device plan vs mlx-lm (5 models)" device_plan.txt env QWEN_GDN_TEST_DEVICE=cuda \
  QWEN_GDN_MODELS_DIR="$PWD/models" "$bin/device_plan" --test-threads=1 --nocapture || fail=1
# The fused decode step (replayed as a CUDA graph) against the composed step and mlx-lm.
step "fused decode vs composed + mlx-lm" fused_decode.txt env QWEN_GDN_TEST_DEVICE=cuda \
  QWEN_GDN_MODELS_DIR="$PWD/models" "$bin/fused_decode" --test-threads=1 --nocapture || fail=1
# Speculative decoding's fused verify pass (k + 1 rows) against k + 1 fused decode steps
# (f32 gate), its rollback, its launch budget and no read-back inside it.
step "fused verify vs decode steps" fused_verify.txt env QWEN_GDN_TEST_DEVICE=cuda \
  QWEN_GDN_MODELS_DIR="$PWD/models" "$bin/fused_verify" verify_rows_are_decode_steps \
  --test-threads=1 --nocapture || fail=1
# A conversation resumed from prompt-cache snapshots gives the uncached run's tokens and
# logits bit for bit on the device plan.
step "prompt cache exact on the device plan" prompt_cache.txt env QWEN_GDN_TEST_DEVICE=cuda \
  QWEN_GDN_MODELS_DIR="$PWD/models" "$bin/prompt_cache" multi_turn_chat_is_exact_on_the_device_plan \
  --test-threads=1 --nocapture || fail=1
# The grouped MoE prefill products (per expert, and the grouped GEMM of
# kernels/affine_grouped.cu, the default on CUDA, so device_plan above ran it) against the
# per-pair products (random blocks, routing edge cases, every fixture), the GEMM's launches,
# and the device plan's gates with every expert's product on its own (grouped:1).
step "grouped + gemm MoE prefill vs pairs" grouped_moe.txt env QWEN_GDN_TEST_DEVICE=cuda \
  QWEN_GDN_MODELS_DIR="$PWD/models" "$bin/grouped_moe" --test-threads=1 --nocapture || fail=1
step "device plan, grouped:1, vs mlx-lm" device_plan_grouped.txt env QWEN_GDN_TEST_DEVICE=cuda \
  QWEN_GDN_MOE_PREFILL=grouped:1 QWEN_GDN_MODELS_DIR="$PWD/models" "$bin/device_plan" \
  --test-threads=1 --nocapture || fail=1
# qwen4_exp on both fixtures against transformers: the f32 gates and the bf16 KL gate of the
# device plan; its fused step (the QSA selection on the device: no read-back, counted)
# against the composed step (the host selection, one read-back a QSA layer).
step "qwen4_exp device plan vs transformers" qwen4_exp.txt env QWEN_GDN_TEST_DEVICE=cuda \
  QWEN_GDN_MODELS_DIR="$PWD/models" "$bin/qwen4_exp" device_plan fused_decode --test-threads=1 \
  --nocapture || fail=1
# The parallel plans between two NCCL ranks, one GPU each (issue 31; a machine with 2 GPUs or
# more): each test binary launches itself as two ranks (tests/common/ranks.rs). The pipeline
# with its stages and reference on CUDA, bit for bit; the expert and tensor plans on the CPU
# with NCCL carrying their sums, bit for bit; a rank stalled at decode step 3 ends the job with
# the other's one line within its deadline.
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  step "pipeline over 2 NCCL ranks (CUDA)" nccl_pipeline.txt env QWEN_GDN_TEST_DEVICE=cuda \
    QWEN_GDN_MODELS_DIR="$PWD/models" "$bin/pipeline_mpi" --test-threads=1 --nocapture || fail=1
  for plan in experts tensor; do
    step "$plan over 2 NCCL ranks" "nccl_$plan.txt" env QWEN_GDN_MODELS_DIR="$PWD/models" \
      "$bin/${plan}_mpi" --test-threads=1 --nocapture || fail=1
  done
  PIPELINE_TEST_FAULT=stall:1:3 QWEN_GDN_TEST_DEVICE=cuda QWEN_GDN_MODELS_DIR="$PWD/models" \
    timeout 60 "$bin/pipeline_mpi" --test-threads=1 --nocapture >"$OUT/nccl_fault.txt" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c '^error: rank 0: ' "$OUT/nccl_fault.txt")" = 1 ]; then
    summary+=("$(printf '%-34s %s' "a stalled NCCL rank" "PASS  (rc $rc, rank 0's one line)")")
  else
    summary+=("$(printf '%-34s %s' "a stalled NCCL rank" "FAIL rc=$rc (nccl_fault.txt)")"); fail=1
  fi
else
  summary+=("$(printf '%-34s %s' "NCCL ranks" "skipped: one GPU on this machine")")
fi
for m in qwen3-next-tiny-4bit qwen3.5-tiny-4bit qwen3.5-moe-tiny-4bit qwen3-next-tiny-bf16 qwen3.5-moe-tiny-hf qwen4-exp-tiny-hf qwen4-exp-tiny-4bit; do
  python3 -c "import json,sys; print(json.load(open('models/reference/$m.json'))['text'])" >"/tmp/$m.txt"
  # The gate's PASS/FAIL is reported, not required: random tiny models are more sensitive than
  # real ones (README, "GDN state dtype"); the command itself must succeed.
  step "compare-state-dtype bf16: $m" "state_$m.txt" \
    "$bin/qwen-gdn" eval --model "models/$m" --text-file "/tmp/$m.txt" --device cuda \
    --compare-state-dtype bf16 || fail=1
done

grep -hE "rel err|rel diff|KL|top-1|fused vs|fused verify|read-backs" "$OUT"/kernels.txt "$OUT"/device_plan.txt "$OUT"/fused_decode.txt "$OUT"/fused_verify.txt "$OUT"/grouped_moe.txt "$OUT"/device_plan_grouped.txt "$OUT"/qwen4_exp.txt | tail -n 400 >"$OUT/numbers.txt"
grep -hE "^test result|FAILED|panicked" "$OUT"/kernels.txt "$OUT"/device_plan.txt "$OUT"/fused_decode.txt "$OUT"/fused_verify.txt \
  "$OUT"/prompt_cache.txt "$OUT"/grouped_moe.txt "$OUT"/device_plan_grouped.txt "$OUT"/qwen4_exp.txt
for m in qwen3-next-tiny-4bit qwen3.5-tiny-4bit qwen3.5-moe-tiny-4bit qwen3-next-tiny-bf16 qwen3.5-moe-tiny-hf qwen4-exp-tiny-hf qwen4-exp-tiny-4bit; do
  echo "$m: $(grep -hiE "kl|top-1|pass|fail" "$OUT/state_$m.txt" | tr '\n' ' ' | cut -c1-220)"
done
printf '%s\n' "${summary[@]}"
exit $fail
