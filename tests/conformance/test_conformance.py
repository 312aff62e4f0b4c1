"""The pinned MCP conformance suite against Coatcheck, in the conformance and the production profile.

The conformance profile must pass every scenario the suite requires for 2026-07-28 with no
wire-schema failures. The production profile (``coatcheck serve`` exactly as deployed, no fixtures)
is run on every scenario that needs no fixture; the rest are listed below with the reason they
cannot apply, and a test keeps that list complete when the suite pin changes.
"""

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx2
import pytest

from tests.support import figures
from tests.support.conformance.profiles import ProxiedServer
from tests.support.conformance.suite import REVISION, describe, required_server_scenarios, run_suite
from tests.support.wire import post, response_message

SECTION = "MCP conformance and interop"

REPO_ROOT = Path(__file__).resolve().parents[2]
REQUIRED_SCENARIO_COUNT = 37

# Scenarios that exercise generic protocol behaviour, so they run against production as is.
# http-header-validation is "pending" (not scored) in the pin but generic, so it runs too.
PRODUCTION_SCENARIOS = [
    "tools-list",
    "caching",
    "dns-rebinding-protection",
    "server-sse-multiple-streams",
    "input-required-result-unsupported-methods",
    "server-stateless",
    "sep-2164-resource-not-found",
    "http-header-validation",
]

_FIXTURE_TOOL = "calls a fixture tool that only the conformance profile registers"
_FIXTURE_PROMPT = "gets a fixture prompt that only the conformance profile registers"
_FIXTURE_RESOURCE = "reads a fixture resource that only the conformance profile registers"
_NO_PRIMITIVES = "production registers no {}; with none listed the scenario passes without checking anything"
NOT_APPLICABLE_IN_PRODUCTION = {
    "completion-complete": "completes an argument of the fixture prompt test_prompt_with_arguments",
    "tools-call-simple-text": f"{_FIXTURE_TOOL} (test_simple_text)",
    "tools-call-image": f"{_FIXTURE_TOOL} (test_image_content)",
    "tools-call-audio": f"{_FIXTURE_TOOL} (test_audio_content)",
    "tools-call-embedded-resource": f"{_FIXTURE_TOOL} (test_embedded_resource)",
    "tools-call-mixed-content": f"{_FIXTURE_TOOL} (test_multiple_content_types)",
    "tools-call-error": f"{_FIXTURE_TOOL} (test_error_handling)",
    "tools-call-with-progress": f"{_FIXTURE_TOOL} (test_tool_with_progress); no product tool reports progress",
    "resources-list": _NO_PRIMITIVES.format("resources"),
    "resources-read-text": f"{_FIXTURE_RESOURCE} (test://static-text)",
    "resources-read-binary": f"{_FIXTURE_RESOURCE} (test://static-binary)",
    "resources-templates-read": f"{_FIXTURE_RESOURCE} template (test://template/{{id}}/data)",
    "prompts-list": _NO_PRIMITIVES.format("prompts"),
    "prompts-get-simple": f"{_FIXTURE_PROMPT} (test_simple_prompt)",
    "prompts-get-with-args": f"{_FIXTURE_PROMPT} (test_prompt_with_arguments)",
    "prompts-get-embedded-resource": f"{_FIXTURE_PROMPT} (test_prompt_with_embedded_resource)",
    "prompts-get-with-image": f"{_FIXTURE_PROMPT} (test_prompt_with_image)",
    **{
        f"input-required-result-{name}": f"{_FIXTURE_TOOL} ({tool})"
        for name, tool in {
            "basic-elicitation": "test_input_required_result_elicitation",
            "basic-sampling": "test_input_required_result_sampling",
            "basic-list-roots": "test_input_required_result_list_roots",
            "request-state": "test_input_required_result_request_state",
            "multiple-input-requests": "test_input_required_result_multiple_inputs",
            "multi-round": "test_input_required_result_multi_round",
            "missing-input-response": "test_input_required_result_elicitation",
            "result-type": "test_input_required_result_elicitation",
            "tampered-state": "test_input_required_result_tampered_state",
            "capability-check": "test_input_required_result_capabilities",
            "ignore-extra-params": "test_input_required_result_elicitation",
            "validate-input": "test_input_required_result_elicitation",
        }.items()
    },
    "input-required-result-non-tool-request": f"{_FIXTURE_PROMPT} (test_input_required_result_prompt)",
}

# Checks of server-stateless that need its diagnostic tools; in production they fail as
# untestable, warn, or pass without exercising anything, so they are judged in the profile only.
FIXTURE_DEPENDENT_STATELESS_CHECKS = {
    "sep-2575-server-rejects-undeclared-capability": "needs test_missing_capability",
    "sep-2575-missing-capability-http-400": "needs test_missing_capability",
    "sep-2575-http-server-no-independent-requests-on-stream": "needs test_streaming_elicitation",
    "sep-2575-server-no-log-without-loglevel": "needs test_logging_tool",
    "sep-2575-server-honors-notification-filter": "needs test_trigger_tool_change to emit a filtered event",
    "sep-2575-server-sends-tools-list-changed-on-subscription": "needs test_trigger_tool_change",
    "sep-2575-server-sends-prompts-list-changed-on-subscription": "needs test_trigger_prompt_change",
}
# Checks of caching that call prompts/resources methods unconditionally. Production has neither, so it
# does not advertise them and answers -32601 (server-stateless requires exactly that pairing); judged in
# the profile, which has fixture prompts and resources.
UNADVERTISED_IN_PRODUCTION_CHECKS = {
    "sep-2549-prompts-list-caching-hints": "production has no prompts (not advertised, -32601)",
    "sep-2549-resources-list-caching-hints": "production has no resources (not advertised, -32601)",
    "sep-2549-resources-templates-list-caching-hints": "production has no resources (not advertised, -32601)",
}
NOT_JUDGED_IN_PRODUCTION = FIXTURE_DEPENDENT_STATELESS_CHECKS | UNADVERTISED_IN_PRODUCTION_CHECKS


def test_the_conformance_profile_passes_every_required_scenario_with_schema_valid_messages(
    conformance_profile: ProxiedServer, tmp_path: Path
) -> None:
    required = required_server_scenarios()
    started = time.monotonic()
    run = run_suite(conformance_profile.mcp_url, tmp_path / "results")
    elapsed = time.monotonic() - started

    passed = [name for name in required if run.passed(name)]
    not_scored = sorted(set(run.checks) - set(required))
    counts = run.status_counts(required)
    figures.note(
        SECTION,
        f"conformance profile, --requirements {REVISION}: {len(passed)}/{len(required)} required scenarios passed "
        f"({counts['SUCCESS']} checks ok, {counts['WARNING']} warnings, {counts['FAILURE']} failures), "
        f"{len(run.wire_schema_failures())} wire-schema failures, in {elapsed:.1f}s",
    )
    figures.note(
        SECTION,
        "  not scored (pending/extension): "
        + ", ".join(f"{name} {'ok' if run.passed(name) else 'fails'}" for name in not_scored),
    )
    assert len(required) == REQUIRED_SCENARIO_COUNT, "the pinned suite changed its required set; review the pin"
    assert not run.failures(required), f"required scenarios failed:\n{describe(run.failures(required))}"
    assert passed == required, f"scenarios without results: {sorted(set(required) - set(run.checks))}"
    assert not run.wire_schema_failures(), f"messages off the schema:\n{describe(run.wire_schema_failures())}"


@pytest.mark.parametrize("scenario", PRODUCTION_SCENARIOS)
def test_the_production_profile_passes_every_scenario_that_needs_no_fixture(
    production_profile: ProxiedServer, tmp_path: Path, scenario: str
) -> None:
    run = run_suite(production_profile.mcp_url, tmp_path / "results", scenario=scenario)
    checks = run.checks[scenario]
    judged = [check for check in checks if check.id not in NOT_JUDGED_IN_PRODUCTION]
    set_aside = [check for check in checks if check.id in NOT_JUDGED_IN_PRODUCTION]
    failed = [check for check in judged if check.status == "FAILURE"]
    statuses = Counter(check.status.lower() for check in judged)
    figures.note(
        SECTION,
        f"production profile, {scenario}: {'ok' if not failed else 'FAILED'} "
        f"({', '.join(f'{count} {status}' for status, count in sorted(statuses.items()))}"
        + (f"; {len(set_aside)} fixture-dependent checks not applicable)" if set_aside else ")"),
    )
    assert not failed, describe(failed)
    assert not run.wire_schema_failures(), describe(run.wire_schema_failures())


def test_every_required_scenario_runs_against_production_or_is_recorded_as_not_applicable() -> None:
    required = set(required_server_scenarios())
    accounted = (set(PRODUCTION_SCENARIOS) & required) | set(NOT_APPLICABLE_IN_PRODUCTION)
    assert accounted == required
    assert not set(PRODUCTION_SCENARIOS) & set(NOT_APPLICABLE_IN_PRODUCTION)
    figures.note(
        SECTION,
        f"production profile: {len(set(PRODUCTION_SCENARIOS) & required)} required scenarios run, "
        f"{len(NOT_APPLICABLE_IN_PRODUCTION)} not applicable (fixture names; see docs/compatibility.md)",
    )


def test_dns_rebinding_probes_are_refused_by_coatcheck_itself_behind_the_proxy(
    production_profile: ProxiedServer, tmp_path: Path
) -> None:
    before = len(production_profile.exchanges())
    run = run_suite(production_profile.mcp_url, tmp_path / "results", scenario="dns-rebinding-protection")
    assert run.passed("dns-rebinding-protection"), describe(run.failures())
    probes = production_profile.exchanges()[before:]
    # The proxy forwarded the forged Host with a valid token; the 421 came from Coatcheck's allow-list.
    rebinding = [probe for probe in probes if probe["host"] == "evil.example.com"]
    assert rebinding
    assert {probe["status"] for probe in rebinding} == {421}
    genuine = [probe for probe in probes if probe["host"] == production_profile.public_url.removeprefix("http://")]
    assert genuine
    assert {probe["status"] for probe in genuine} == {200}


def test_the_production_app_lists_no_conformance_fixture(production_profile: ProxiedServer) -> None:
    with httpx2.Client(timeout=15.0) as http:
        answers = {
            method: response_message(post(http, production_profile.mcp_url, method))
            for method in ("tools/list", "prompts/list", "resources/list", "resources/templates/list")
        }
    tool_names = {tool["name"] for tool in answers["tools/list"]["result"]["tools"]}
    assert not {name for name in tool_names if name.startswith("test_")}
    # No prompts or resources at all: not advertised, and their methods are not found.
    for method in ("prompts/list", "resources/list", "resources/templates/list"):
        assert answers[method]["error"]["code"] == -32601, answers[method]


def test_no_product_module_imports_the_conformance_fixtures() -> None:
    probe = "import sys, api.app, api.cli; print(sorted(m for m in sys.modules if 'conformance' in m))"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "[]"
