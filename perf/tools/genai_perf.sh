#!/usr/bin/env bash
# genai-perf against a running BucketServe, from its own venv (it pins its own dependencies).
#   perf/tools/genai_perf.sh [GRPC_URL] [OUT_DIR]     e.g. perf/tools/genai_perf.sh 127.0.0.1:8001 perf/results/x/genai-perf
# Env: CONCURRENCY (2), REQUESTS (16), OUTPUT_MEAN (16), INPUT_MEAN (84, synthetic prompts) or
# INPUT_FILE (JSONL {"text": ...} per line: our prompts), BACKEND (vllm) and MODEL.
# --backend vllm --endpoint-type kserve sends shape-[1] tensors (text_input, stream,
# exclude_input_in_output): the vLLM-backend convention of `bucketserve` (default MODEL).
# --backend tensorrtllm sends shape-[1, 1] tensors: use BACKEND=tensorrtllm MODEL=tensorrt_llm_bls
# (or MODEL=ensemble), the TensorRT-LLM-shaped entry models. The output length goes as top-level
# max_tokens/min_tokens tensors (--extra-inputs) with either backend. PA_HEADERS: space-separated
# KEY:VALUE gRPC metadata for every call (e.g. triton-grpc-protocol-api-key:KEY with --api-key).
set -euo pipefail
. "$(dirname "$0")/bench_tool.sh" .genai-venv genai-perf
URL="${1:-127.0.0.1:8001}"
OUT="${2:-$ROOT/perf/results/tmp/genai-perf}"
CUDART="$("$ROOT/.venv/bin/python" -c 'import nvidia.cuda_runtime as c, os; print(os.path.join(list(c.__path__)[0], "lib"))')"
# perf_analyzer comes from tritonclient[all] in the project venv; it needs libcudart.so.12 and libb64.
export PATH="$VENV/bin:$ROOT/.venv/bin:$PATH"
export LD_LIBRARY_PATH="$CUDART${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$OUT"
HEADERS=()
for h in ${PA_HEADERS:-}; do HEADERS+=(--header "$h"); done
set -x
COLUMNS=200 genai-perf profile -m "${MODEL:-bucketserve}" --backend "${BACKEND:-vllm}" --endpoint-type kserve \
  --streaming -u "$URL" --tokenizer "$TOKENIZER" "${INPUTS[@]}" \
  --extra-inputs "max_tokens:$N_OUT" --extra-inputs "min_tokens:$N_OUT" \
  --concurrency "${CONCURRENCY:-2}" --request-count "${REQUESTS:-16}" --warmup-request-count 2 \
  --random-seed 0 --artifact-dir "$OUT" ${HEADERS[@]+"${HEADERS[@]}"} > "$OUT/genai_perf_stdout.txt" 2>&1
set +x
cat "$OUT"/*/profile_export_genai_perf.csv
