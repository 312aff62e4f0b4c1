"""Figures that tests measure and CI should show: printed in pytest's terminal summary (``-q`` included).

Tests call :func:`note` with a section title and a line; the root conftest prints every section once at the
end of the run. Use it for counts and ratios an issue asks to see in CI's output, never for assertions.
"""

from typing import Any

_SECTIONS: dict[str, list[str]] = {}


def note(section: str, line: str) -> None:
    """Record ``line`` under ``section`` for the end-of-run summary."""
    _SECTIONS.setdefault(section, []).append(line)


def emit(terminalreporter: Any) -> None:
    """Write every recorded section to pytest's terminal summary, then forget them."""
    for section, lines in _SECTIONS.items():
        terminalreporter.section(section)
        for line in lines:
            terminalreporter.write_line(line)
    _SECTIONS.clear()
