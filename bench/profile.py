"""Where a target's CPU goes: py-spy samples taken during a measured window, summarised per package and per stage.

py-spy (``pip install -e '.[bench]'``) samples the server's Python stacks without stopping it; only on-CPU
samples are kept, so shares are shares of server CPU, and ``share x CPU ms per call`` is CPU ms per call.
"""

import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>.*):(?P<line>\d+)\)$")


@dataclass(frozen=True)
class Frame:
    func: str
    path: str


def _frames(stack: str) -> list[Frame]:
    frames = []
    for raw in stack.split(";"):
        m = _FRAME.match(raw.strip())
        if m:
            frames.append(Frame(m["func"], m["path"]))
    return frames


def package_of(path: str) -> str:
    """The package a source file belongs to: a site-packages distribution, a Coatcheck layer, or stdlib."""
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if path.startswith(str(ROOT) + "/"):
        return "coatcheck:" + path[len(str(ROOT)) + 1 :].split("/", 1)[0]
    m = re.search(r"/python3\.\d+/([^/]+)", path)
    if m:
        return "stdlib:" + m[1].removesuffix(".py")
    return path


def _in(fragment: str) -> Callable[[Frame], bool]:
    return lambda f: fragment in f.path


def _func(name: str) -> Callable[[Frame], bool]:
    return lambda f: f.func == name


# Stages of one call, counted inclusively (a sample counts if any of its frames matches).
STAGES: list[tuple[str, Callable[[Frame], bool]]] = [
    ("Litestar (route lookup, ASGI handler)", _in("/litestar/")),
    ("Coatcheck /mcp edge (api/mcp/endpoint.py, api/app.py)", lambda f: f.path.endswith(("/api/mcp/endpoint.py",))),
    ("SDK auth middleware (mcp/server/auth/)", _in("/mcp/server/auth/")),
    ("  of which token verification (api/auth.py)", _in("/api/auth.py")),
    ("SDK transport security (Host/Origin)", _in("/mcp/server/transport_security.py")),
    ("SDK Mcp-Param validation (schema walk)", _func("_mcp_param_rejection")),
    ("SDK inbound classification (header ladder)", _func("classify_inbound_request")),
    ("SDK OpenTelemetry middleware", lambda f: "/_otel.py" in f.path or "/opentelemetry/" in f.path),
    ("SDK requestState boundary", _in("/mcp/server/request_state.py")),
    ("SDK tool call (argument validation, call_fn, result)", _func("call_tool")),
    ("  of which result building (convert_result)", _func("convert_result")),
    ("Coatcheck tool body (api/mcp/tools_*.py)", _in("/api/mcp/tools_")),
    ("  of which SQLAlchemy + asyncpg", lambda f: "/sqlalchemy/" in f.path and "/api/mcp/" not in f.path),
    ("  of which asyncpg", _in("/asyncpg/")),
    ("  of which output models (api/mcp/schemas.py)", _in("/api/mcp/schemas.py")),
    ("anyio (task group, streams)", _in("/anyio/")),
    ("uvicorn (HTTP parsing, ASGI glue)", _in("/uvicorn/")),
]


@dataclass(frozen=True)
class Profile:
    samples: int
    by_package: list[tuple[str, int]]
    by_stage: list[tuple[str, int]]
    top_functions: list[tuple[str, int]]

    def render(self, cpu_ms_per_call: float) -> str:
        """The profile as text: share of server CPU and CPU ms per call."""

        def row(name: str, count: int) -> str:
            share = count / self.samples if self.samples else 0.0
            return f"  {name:58} {100 * share:5.1f} %  {share * cpu_ms_per_call:6.3f} ms"

        out = [f"{self.samples} on-CPU samples; {cpu_ms_per_call:.3f} CPU ms per call", "by package (self time):"]
        out += [row(name, n) for name, n in self.by_package[:14]]
        out.append("by stage (inclusive):")
        out += [row(name, n) for name, n in self.by_stage]
        out.append("hottest functions (self time):")
        out += [row(name, n) for name, n in self.top_functions[:12]]
        return "\n".join(out)


def summarise(raw: str) -> Profile:
    """Aggregate py-spy ``--format raw`` output (collapsed stacks with counts)."""
    packages: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = _frames(stack)
        if not frames:
            continue
        count = int(count_text)
        total += count
        leaf = frames[-1]
        packages[package_of(leaf.path)] += count
        functions[f"{leaf.func} ({package_of(leaf.path)})"] += count
        for name, matches in STAGES:
            if any(matches(f) for f in frames):
                stages[name] += count
    return Profile(
        samples=total,
        by_package=packages.most_common(),
        by_stage=[(name, stages[name]) for name, _ in STAGES],
        top_functions=functions.most_common(),
    )


def record(pid: int, seconds: float) -> subprocess.Popen[bytes]:
    """Start py-spy sampling ``pid`` for ``seconds``; ``collect`` the result when the window is over."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy is not installed (pip install -e '.[bench]' -c constraints.txt)")
    out = tempfile.NamedTemporaryFile(prefix="bench-profile-", suffix=".txt", delete=False)  # noqa: SIM115
    out.close()
    process = subprocess.Popen(
        [
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "200",
            "--format",
            "raw",
            "--full-filenames",
            "--output",
            out.name,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    process.output_path = out.name  # type: ignore[attr-defined]
    return process


def collect(process: subprocess.Popen[bytes]) -> Profile:
    """Wait for ``record``'s py-spy and summarise what it sampled."""
    _, err = process.communicate(timeout=60)
    path = Path(process.output_path)  # type: ignore[attr-defined]
    if process.returncode != 0:
        raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')}")
    try:
        return summarise(path.read_text())
    finally:
        path.unlink(missing_ok=True)
