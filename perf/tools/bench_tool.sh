# Sourced by aiperf.sh and genai_perf.sh:  . bench_tool.sh VENV_DIR TOOL [INPUT_FILE_ARGS...]
# Sets ROOT; VENV (perf/VENV_DIR, made by `make bench-tools` when TOOL is missing); TOKENIZER
# (the default model's local checkpoint); INPUTS: INPUT_FILE's prompts (with the tool's
# INPUT_FILE_ARGS) or INPUT_MEAN (84) synthetic tokens; N_OUT: OUTPUT_MEAN (16).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/perf/$1"
[ -x "$VENV/bin/$2" ] || make -C "$ROOT" bench-tools
TOKENIZER="$("$ROOT/.venv/bin/python" -c 'from bucketserve.engine.loader import resolve_model; print(resolve_model("smollm2"))')"
if [ -n "${INPUT_FILE:-}" ]; then
  INPUTS=(--input-file "$INPUT_FILE" "${@:3}")
else
  INPUTS=(--synthetic-input-tokens-mean "${INPUT_MEAN:-84}" --synthetic-input-tokens-stddev 0)
fi
N_OUT="${OUTPUT_MEAN:-16}"
