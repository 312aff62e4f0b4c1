"""Lines for the "MCP conformance and interop" section of pytest's terminal summary.

Tests append scenario counts and timings with ``note``; the conftests of ``tests/conformance`` and
``tests/interop`` print them once at the end of the run (``-q`` included).
"""

from typing import Any

_LINES: list[str] = []


def note(line: str) -> None:
    _LINES.append(line)


def emit(terminalreporter: Any) -> None:
    if not _LINES:
        return
    terminalreporter.section("MCP conformance and interop")
    for line in _LINES:
        terminalreporter.write_line(line)
    _LINES.clear()
