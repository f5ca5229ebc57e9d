"""Discrete-event simulator driving the real schedulers: `bucketserve simulate` (quick sweeps)
and `python -m bucketserve.sim.evidence` (every table of docs/scheduling.md, 5 seeds)."""
