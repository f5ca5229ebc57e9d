"""Soak and fault suite for `bucketserve serve`: the CLI of bucketserve.bench.soak.

perf/reliability/soak.py --duration 600             mixed load at 2x measured capacity
perf/reliability/soak.py --faults --duration 600    the same, killing each part in turn
perf/reliability/soak.py --cycles 10                start/SIGTERM cycles, then kill -9 cases
"""

import sys

from bucketserve.bench.soak import main

if __name__ == "__main__":
    sys.exit(main())
