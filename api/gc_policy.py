"""How the serving process uses Python's garbage collector.

Importing the stack and building the app leave ~190 000 long-lived objects (SQLAlchemy, Litestar, pydantic
schemas, every tool's models) that the collector's oldest generation walks in full on each of its passes:
under load that was a stall of hundreds of milliseconds a few times per 5 000 calls, which set the p99.
Freezing them once after start-up moves them out of every future collection; request garbage is still
collected as before.

A tool call leaves a few dozen objects in reference cycles (the SDK's per-request connection and runner)
that only the collector frees. At CPython's default young-generation threshold (700 net allocations) a
young pass ran about every twelve calls, each walking everything the calls in flight held: 28 us of GC per
call in-process, 10 us at ``YOUNG_THRESHOLD`` (a higher one saves nothing more; docs/performance.md). The
same cycles are collected, later: the young generation holds at most ``YOUNG_THRESHOLD`` objects more.
"""

import gc

YOUNG_THRESHOLD = 10_000
"""Net container allocations between two young-generation collections (CPython's default: 700)."""


def serving_policy() -> int:
    """:func:`freeze_startup_objects`, then young collections every ``YOUNG_THRESHOLD`` allocations.

    Call once per serving process, after the app is built and before it serves; the older generations keep
    CPython's thresholds. Returns how many objects were frozen.
    """
    frozen = freeze_startup_objects()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    return frozen


def freeze_startup_objects() -> int:
    """Collect the garbage start-up left, then exempt everything still alive from future collections.

    Call once per process, after the app is built and before it serves. Returns how many objects were frozen.
    """
    gc.collect()  # garbage frozen now would never be freed
    gc.freeze()
    return gc.get_freeze_count()
