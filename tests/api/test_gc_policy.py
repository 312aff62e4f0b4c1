"""The serving process freezes what start-up left alive, after collecting what start-up threw away."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import gc, json, weakref
    from api.gc_policy import freeze_startup_objects

    class Node:
        pass

    kept = Node()
    garbage = Node()
    garbage.self = garbage  # a reference cycle: only the collector can free it
    dead = weakref.ref(garbage)
    del garbage
    frozen = freeze_startup_objects()
    # Frozen objects are in no generation the collector walks.
    walked = any(obj is kept for obj in gc.get_objects())
    print(json.dumps({"frozen": frozen, "garbage_freed": dead() is None, "kept_walked": walked}))
    """
)


def test_start_up_garbage_is_collected_and_the_live_objects_are_frozen() -> None:
    # A subprocess: freezing is for the lifetime of the process.
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["garbage_freed"] is True
    assert result["frozen"] > 1000  # the interpreter's and the test's own objects at least
    assert result["kept_walked"] is False


def test_the_serving_policy_freezes_and_runs_young_collections_less_often_keeping_the_older_thresholds() -> None:
    script = textwrap.dedent(
        """
        import gc, json
        from api.gc_policy import YOUNG_THRESHOLD, serving_policy

        before = gc.get_threshold()
        frozen = serving_policy()
        print(json.dumps({"before": before, "after": gc.get_threshold(), "young": YOUNG_THRESHOLD, "frozen": frozen}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["young"] > result["before"][0]
    assert result["after"] == [result["young"], *result["before"][1:]]
    assert result["frozen"] > 1000
