from typing import Any

from tests.conformance import report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    report.emit(terminalreporter)
