"""The compose emulation (tests/support/compose) reads Dockerfiles and compose.yaml the way Docker does."""

from pathlib import Path

import pytest

from tests.support.compose.dockerfile import Directory, UnsupportedDockerfileError, load_image, parse_dockerfile
from tests.support.compose.images import node_docker_entrypoint
from tests.support.compose.project import load_project, parse_duration

ROOT = Path(__file__).resolve().parents[1]


def test_a_volume_path_the_image_lacks_gets_dockers_root_owned_directory() -> None:
    image = parse_dockerfile("FROM node:22-slim\nWORKDIR /idp\nUSER node\n")
    assert image.directory("/keys") is None
    assert image.user == "node"


def test_a_directory_created_and_chowned_in_a_run_line_keeps_that_owner() -> None:
    image = parse_dockerfile("FROM node:22-slim\nRUN mkdir -p /keys \\\n  && chown node:node /keys\nUSER node\n")
    assert image.directory("/keys") == Directory("node", "node", 0o755)
    image = parse_dockerfile("FROM node:22-slim\nUSER node\nRUN mkdir /keys\n")
    assert image.directory("/keys") == Directory("node", "node", 0o755)


def test_a_run_command_the_emulation_cannot_reproduce_is_refused_not_ignored() -> None:
    with pytest.raises(UnsupportedDockerfileError, match="apt-get"):
        parse_dockerfile("FROM python:3.11-slim\nRUN apt-get install -y curl\n")
    with pytest.raises(UnsupportedDockerfileError, match="chown fails unless the build runs as root"):
        parse_dockerfile("FROM node:22-slim\nUSER node\nRUN mkdir /keys && chown node /keys\n")
    with pytest.raises(UnsupportedDockerfileError, match="no facts about this base image"):
        parse_dockerfile("FROM alpine:3\n")


def test_the_app_image_runs_as_the_user_it_creates_in_its_workdir() -> None:
    image = load_image(ROOT)
    assert (image.workdir, image.user) == ("/app", "coatcheck")
    assert ["useradd", "--system", "--uid", "10001", "coatcheck"] in image.account_commands
    assert image.env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert ("pip", "/app") in image.installs
    assert any(copy.sources == ("migrations",) and copy.dest == "/app/migrations" for copy in image.copies)


def test_the_node_images_entrypoint_prefixes_node_only_when_the_command_is_not_a_program(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    assert node_docker_entrypoint(["node", "server.mjs"], env, tmp_path) == ["node", "server.mjs"]
    assert node_docker_entrypoint(["server.mjs"], env, tmp_path) == ["node", "server.mjs"]
    assert node_docker_entrypoint(["-e", "1"], env, tmp_path) == ["node", "-e", "1"]


def test_compose_merge_keys_and_depends_on_conditions_are_resolved() -> None:
    project = load_project(ROOT)
    app = project.services["app"]
    assert app.environment["REQUEST_STATE_KEYS"].startswith("dev-only-")  # from <<: *dev-secrets
    assert "REQUEST_STATE_KEYS" not in project.services["migrate"].environment
    order = [service.name for service in project.start_order()]
    assert order.index("db") < order.index("migrate") < order.index("app")
    assert order.index("idp") < order.index("app")
    assert app.depends_on["migrate"] == "service_completed_successfully"
    assert parse_duration("1m30s") == 90.0
    assert parse_duration("500ms") == 0.5
