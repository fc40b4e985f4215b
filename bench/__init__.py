"""Benchmarks of label-rbac, each figure next to a baseline measured in the same run.

Run one with ``python -m bench NAME`` from the repository root (``python -m bench --help``
lists them). ``bench.core`` holds what several benchmarks share (the servers and their
processes, load generation, rates and ratios, the synthetic RBAC layout, the loopback API server
process); each other module is one benchmark and imports the core, never another benchmark
except the one it extends (``http --churn`` runs ``http_churn``).
"""
