#!/usr/bin/env bash
# AIPerf (NVIDIA's current benchmark tool; it speaks only OpenAI) against BucketServe's
# OpenAI-compatible front end, from its own venv perf/.aiperf-venv (kept apart from the
# project's pinned dependencies).
#   perf/tools/aiperf.sh [OPENAI_URL] [OUT_DIR]     e.g. perf/tools/aiperf.sh http://127.0.0.1:9000 perf/results/x/aiperf
# Env: CONCURRENCY (space-separated sweep, "2"), REQUESTS (16), OUTPUT_MEAN (16), INPUT_MEAN (84,
# synthetic prompts) or INPUT_FILE (JSONL {"text": ...} per line: our prompts), ENDPOINT
# (chat | completions), MODEL (smollm2). The output length is forced with the vLLM-style extra
# field min_tokens, so every request produces exactly OUTPUT_MEAN tokens. SEED (0): AIPerf's
# --random-seed; EXTRA_ARGS: more AIPerf options, word-split (e.g. "--shared-system-prompt-length 1000").
set -euo pipefail
. "$(dirname "$0")/bench_tool.sh" .aiperf-venv aiperf --custom-dataset-type single_turn
URL="${1:-http://127.0.0.1:9000}"
OUT="${2:-$ROOT/perf/results/tmp/aiperf}"
for C in ${CONCURRENCY:-2}; do
  DIR="$OUT/concurrency$C"
  mkdir -p "$DIR"
  set -x
  "$VENV/bin/aiperf" profile --model "${MODEL:-smollm2}" --url "$URL" \
    --endpoint-type "${ENDPOINT:-chat}" --streaming --tokenizer "$TOKENIZER" \
    "${INPUTS[@]}" \
    --output-tokens-mean "$N_OUT" --output-tokens-stddev 0 --extra-inputs "min_tokens:$N_OUT" \
    --concurrency "$C" --request-count "${REQUESTS:-16}" --warmup-request-count 2 \
    --random-seed "${SEED:-0}" ${EXTRA_ARGS:-} --artifact-dir "$DIR" > "$DIR/aiperf_stdout.txt" 2>&1
  set +x
  cat "$DIR"/*.csv 2>/dev/null | head -40 || true
done
