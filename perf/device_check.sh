#!/usr/bin/env bash
# The prepared GPU run for a session that is lent a device (one call, ~5 min on an H200):
#   * Triton paged-decode kernel vs SDPA: correctness and time per call (Llama-3-8B heads, bf16)
#   * engine bench, dummy:llama-3-8b bf16, batch 1 and 64: ours (default attention) and
#     transformers eager, with the step time's ratio to the memory floor
#   * the same engine bench with attention=triton (ours only)
# Needs only torch, transformers and triton on the device (no pip install: PYTHONPATH).
# Results go to $OUT (default perf/results/device); the exit status says whether all ran.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-perf/results/device}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/backends:$PWD/client${PYTHONPATH:+:$PYTHONPATH}"
failed=0
step() {  # step NAME CMD...: stdout to NAME.jsonl, stderr to NAME.err
  local name=$1; shift
  echo "== $name: $*"
  if ! timeout 240 "$@" > "$OUT/$name.jsonl" 2> "$OUT/$name.err"; then
    echo "!! $name failed (see $OUT/$name.err)"; tail -5 "$OUT/$name.err"; failed=1
  fi
  cat "$OUT/$name.jsonl"
}
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
$PY -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)" | tee "$OUT/versions.txt"
step attention_check $PY perf/gpu_attention_check.py
step engine_bench $PY perf/engine_bench.py --device cuda --model dummy:llama-3-8b --batch-sizes 1,64
step engine_bench_triton $PY perf/engine_bench.py --device cuda --model dummy:llama-3-8b \
  --batch-sizes 1,64 --impl bucketserve --attention triton
exit $failed
