"""Perplexity of the engine in bfloat16 vs float32 on a fixed text (the library is
bucketserve.bench.perplexity); prints both and the delta.

    .venv/bin/python perf/engine/perplexity.py
"""

from bucketserve.bench.perplexity import main

if __name__ == "__main__":
    raise SystemExit(main())
