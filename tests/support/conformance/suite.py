"""Run the pinned MCP conformance suite against a URL and read its per-check results.

The suite writes one ``server-<scenario>-<timestamp>/checks.json`` per scenario into the output
directory; a scenario passes when none of its checks is a FAILURE (warnings and INFO do not fail,
exactly as the suite itself scores). Every scenario also validates each server message against the
2026-07-28 JSON schema (checks with id ``wire-schema-valid``).
"""

import json
import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tests.support.node import CONFORMANCE_CLI, CONFORMANCE_REQUIREMENTS, ensure_conformance_suite

REVISION = "2026-07-28"
SUITE_TIMEOUT = 600.0
_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


@dataclass(frozen=True)
class Check:
    scenario: str
    id: str
    status: str  # SUCCESS, FAILURE, WARNING, SKIPPED or INFO
    message: str


@dataclass(frozen=True)
class SuiteRun:
    """The checks of one suite invocation, by scenario, plus its console output."""

    checks: dict[str, tuple[Check, ...]]
    output: str

    def passed(self, scenario: str) -> bool:
        return scenario in self.checks and all(check.status != "FAILURE" for check in self.checks[scenario])

    def failures(self, scenarios: list[str] | None = None) -> list[Check]:
        names = scenarios if scenarios is not None else list(self.checks)
        return [check for name in names for check in self.checks.get(name, ()) if check.status == "FAILURE"]

    def wire_schema_failures(self) -> list[Check]:
        """Messages the server sent that do not match the revision's JSON schema, in any scenario."""
        return [
            check
            for checks in self.checks.values()
            for check in checks
            if check.id.startswith("wire-schema") and check.status != "SUCCESS"
        ]

    def status_counts(self, scenarios: list[str] | None = None) -> Counter[str]:
        names = scenarios if scenarios is not None else list(self.checks)
        return Counter(check.status for name in names for check in self.checks.get(name, ()))


def required_server_scenarios(revision: str = REVISION) -> list[str]:
    """The server scenarios the pinned suite's frozen requirement file lists for ``revision``."""
    ensure_conformance_suite()
    lines = (CONFORMANCE_REQUIREMENTS / f"{revision}.yaml").read_text().splitlines()
    start = lines.index("server:") + 1
    scenarios = []
    for line in lines[start:]:
        if not line.startswith("  - "):
            break
        scenarios.append(line.removeprefix("  - ").strip())
    return scenarios


def run_suite(url: str, output_dir: Path, *, scenario: str | None = None) -> SuiteRun:
    """Run every scenario ``--requirements 2026-07-28`` fixes, or one ``scenario`` at that wire revision."""
    node = ensure_conformance_suite()
    if scenario is None:
        selection = ["--requirements", REVISION]
    else:
        selection = ["--scenario", scenario, "--spec-version", REVISION]
    output_dir.mkdir(parents=True, exist_ok=True)
    completed = subprocess.run(
        [str(node), str(CONFORMANCE_CLI), "server", "--url", url, *selection, "--output-dir", str(output_dir)],
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT,
        check=False,
    )
    checks: dict[str, tuple[Check, ...]] = {}
    for result_dir in sorted(output_dir.iterdir()):
        match = _RESULT_DIR.match(result_dir.name)
        if match is None or not (result_dir / "checks.json").exists():
            continue
        name = match["scenario"]
        raw = json.loads((result_dir / "checks.json").read_text())
        checks[name] = tuple(
            Check(name, str(item["id"]), str(item["status"]), str(item.get("errorMessage") or "")) for item in raw
        )
    if not checks:
        raise RuntimeError(
            f"the conformance suite produced no results (exit code {completed.returncode})\n"
            f"--- stdout ---\n{completed.stdout[-4000:]}\n--- stderr ---\n{completed.stderr[-4000:]}"
        )
    return SuiteRun(checks=checks, output=completed.stdout + completed.stderr)


def describe(checks: list[Check]) -> str:
    return "\n".join(f"  {check.scenario} / {check.id}: {check.status} {check.message[:300]}" for check in checks)
