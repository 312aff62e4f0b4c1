"""Imports in ``api/`` run one way: no module imports, even lazily, a module that imports it back, and loading
the settings (every operator command does) pulls in no OAuth client library.
"""

import ast
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "api"

Graph = Mapping[str, frozenset[str]]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """Every module name an ``import`` anywhere in the file may load: top level, in functions, lazy or not."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative (ruff bans them; resolved anyway so the graph cannot miss one)
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)  # `from api.oauth import providers`


def import_graph() -> dict[str, frozenset[str]]:
    """``module -> the api modules it imports`` over api/**/*.py (``from a.b import c`` names a.b.c if it is one)."""
    files = {_module_name(path): path for path in API.rglob("*.py")}
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        own_packages = {".".join(module.split(".")[:n]) for n in range(1, module.count(".") + 1)}
        targets = set()
        for name in _imported_names(tree, module, path.name == "__init__.py"):
            if name not in files:
                continue
            # Importing a.b.c runs a/__init__ and a/b/__init__ first, unless they are this module's own packages.
            ancestors = {".".join(name.split(".")[:n]) for n in range(1, name.count(".") + 1)}
            targets |= {name, *(ancestors - own_packages)}
        targets.discard(module)
        graph[module] = frozenset(targets)
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the DFS stack, "done" after

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target, [*path, target])
                if found:
                    return found
        state[module] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_the_modules_of_api_import_one_another_without_a_cycle() -> None:
    graph = import_graph()
    # The graph is the real one, so a parser that found nothing cannot pass: the server runner is imported by
    # both commands that serve, and settings validate providers through the configuration module.
    assert len(graph) > 40
    assert sum(len(targets) for targets in graph.values()) > 100
    assert {"api.serving", "api.commands.dev"} <= graph["api.cli"]
    assert "api.serving" in graph["api.commands.dev"]
    assert "api.provider_config" in graph["api.settings"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
    # And the check sees the circle this layering replaced: dev importing the runner from the CLI again.
    reverted = {**graph, "api.commands.dev": graph["api.commands.dev"] | {"api.cli"}}
    assert find_cycle(reverted) == ["api.cli", "api.commands.dev", "api.cli"]


def test_loading_the_settings_imports_no_oauth_client_library() -> None:
    probe = (
        "import json, sys\n"
        "import api.settings\n"
        "after_settings = sorted(m for m in sys.modules if m.partition('.')[0] == 'authlib')\n"
        "import api.oauth.client\n"
        "after_client = sorted(m for m in sys.modules if m.partition('.')[0] == 'authlib')\n"
        "print(json.dumps([after_settings, after_client]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    after_settings, after_client = json.loads(done.stdout)
    assert after_settings == []
    assert after_client  # the probe sees authlib once something that needs it is imported
