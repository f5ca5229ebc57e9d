"""perf_analyzer (tritonclient[all]) at a closed-loop concurrency on our prompts: the CLI of
bucketserve.bench.perf_analyzer.

    perf/tools/perf_analyzer.py --url 127.0.0.1:8001 --concurrency 2 --requests 16 --out DIR
"""

from bucketserve.bench.perf_analyzer import main

if __name__ == "__main__":
    main()
