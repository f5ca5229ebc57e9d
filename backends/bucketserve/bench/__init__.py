"""Benchmark library: workloads (shared with the simulator), load generator, metrics, reports.

The scripts that drive it live in the checkout's perf/ folder, grouped by suite (perf/README.md).
"""
