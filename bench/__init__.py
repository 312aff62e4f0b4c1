"""Throughput benchmark: ``python -m bench`` (see the README's Performance section) and ``python -m bench.inproc``."""
