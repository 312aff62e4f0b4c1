"""Throughput benchmark: ``python -m bench`` (see docs/performance.md) and ``python -m bench.inproc``."""
