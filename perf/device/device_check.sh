#!/usr/bin/env bash
# The one prepared device run (issue 11), <= 8 minutes on one H200 with the project copied over
# and PYTHONPATH only (torch, triton, transformers from the image; no pip install). In order:
#   1 env          versions, GPU, memory, optional tools
#   2 correctness  ours vs transformers, identical weights: 2-layer Llama-3-8B dims, fp32/bf16,
#                  sdpa/triton, prompts 1..8k tokens (prefill + 8 decode steps)
#   3 ipc          KV hand-off between two real processes (bytes compared, timed at 2k/8k tokens)
#   4 decode       step breakdown: wall, host, GPU, kernels; eager vs CUDA graph; vs a measured
#                  copy-bandwidth floor (batch 1/64, context 128/2048, dummy:llama-3-8b bf16)
#   5 attention    Triton paged decode vs SDPA at context 1k..32k; recompiles as tables grow
#   6 sizing       two instances on one GPU: same pool split, activation peak vs estimate
#   7 server       one streamed request through tritonserver (when installed)
# Without a GPU every step runs what it can on CPU and says what it skipped.
# Results: $OUT/<step>.json (JSON lines, one per finished case; + .err), $OUT/summary.json and
# $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-perf/results/device}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/backends:$PWD/client${PYTHONPATH:+:$PYTHONPATH}"
BUDGET_S=${BUDGET_S:-470}  # the whole run, so a slow step cannot push the rest past 8 minutes
SCALE=1
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null || SCALE=5
T0=$(date +%s)
step() {  # step NAME TIMEOUT_S CMD...: stdout (one JSON object) to NAME.json, stderr to NAME.err
  local name=$1 limit=$(( $2 * SCALE )); shift 2
  if [ "$SCALE" = 1 ]; then
    local left=$(( BUDGET_S - ($(date +%s) - T0) ))
    (( left < limit )) && limit=$left
  fi
  echo "== $name (limit ${limit}s): $*"
  if (( limit < 5 )); then
    echo '{"status": "skipped", "reason": "out of the time budget"}' > "$OUT/$name.json"; return
  fi
  local start=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  local rc=$?
  if (( rc == 124 )); then  # keep the lines a step printed before it ran out of time
    echo "{\"status\": \"timeout\", \"limit_s\": $limit}" >> "$OUT/$name.json"
  elif (( rc != 0 )) || [ ! -s "$OUT/$name.json" ]; then
    echo "{\"status\": \"failed\", \"rc\": $rc}" > "$OUT/$name.json"; tail -5 "$OUT/$name.err"
  fi
  echo "   $(( $(date +%s) - start ))s: $(head -c 600 "$OUT/$name.json")"
}
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$OUT/nvidia-smi.txt"
step env 30 $PY perf/device/env_check.py
step correctness 110 $PY perf/device/correctness.py
step ipc 50 $PY perf/device/ipc_check.py
step decode 110 $PY perf/device/decode_breakdown.py
if [ "$SCALE" = 1 ]; then
  step attention 50 $PY perf/engine/gpu_attention_check.py --shapes 1x1024,1x8192,1x32768,64x1024,64x4096
else
  echo '{"status": "skipped", "reason": "needs a GPU (the interpreted kernel is covered by tests/unit/engine/test_triton_attention.py)"}' > "$OUT/attention.json"
fi
step sizing 70 $PY perf/device/sizing_check.py
step server 120 $PY perf/device/server_check.py
$PY perf/device/summary.py "$OUT" "$(( $(date +%s) - T0 ))"
