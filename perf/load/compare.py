"""Policy comparison (static, fcfs, distserve, bucketserve, bucketserve+): the CLI of
bucketserve.bench.compare.

    python perf/load/compare.py --smoke            # CPU scale, a few minutes (make bench-smoke)
    python perf/load/compare.py --rates 0.25,0.5,1 --duration 120 --ablations
"""

import sys

from bucketserve.bench.compare import main

if __name__ == "__main__":
    sys.exit(main())
