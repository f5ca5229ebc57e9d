"""Discrete-event simulator driving the real schedulers (bucketserve.scheduling) against a
latency model: `bucketserve.sim.cli.main` (`bucketserve simulate`) and
`python -m bucketserve.sim.reproduce` (paper-scale reproduction)."""
