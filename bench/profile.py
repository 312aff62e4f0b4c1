"""Where a target's CPU goes: py-spy samples taken during a measured window, summarised per package and per stage.

py-spy (``pip install -e '.[bench]'``) samples the server's Python stacks; only samples holding the GIL are
kept (Python at work, not threads parked in a wait), so a share is a share of the server's Python CPU, and
``share x CPU ms per call`` is about what that part costs per call. Time in C extensions (asyncpg's protocol,
pydantic-core, httptools) counts towards the Python frame that called them.
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

    @property
    def name(self) -> str:
        """The function's own name, without its class."""
        return self.func.rsplit(".", 1)[-1]


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


API, STORE = str(ROOT / "api") + "/", str(ROOT / "store") + "/"

# Self time (the innermost frame: work done in that code, not in what it calls) by layer; the first layer
# whose fragment is in the file's path wins, so the layers add up to 100 %.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("Coatcheck api/ (edge, verifier, tools, results)", (API,)),
    ("Coatcheck store/ (repositories, unit of work)", (STORE,)),
    ("SQLAlchemy + greenlet (pool, execute, results)", ("/sqlalchemy/", "/greenlet/")),
    ("asyncpg (driver)", ("/asyncpg/",)),
    ("SDK auth middleware (mcp.server.auth, Starlette's)", ("/mcp/server/auth/", "/middleware/authentication")),
    ("OpenTelemetry (SDK spans)", ("/opentelemetry/", "/_otel.py")),
    ("SDK (transport, dispatch, requestState)", ("/mcp/", "/mcp_types/")),
    ("Starlette (SDK's app)", ("/starlette/",)),
    ("Litestar", ("/litestar/",)),
    ("anyio + sniffio (SSE task group, streams)", ("/anyio/", "/sniffio/")),
    ("pydantic (JSON-RPC models, validation)", ("/pydantic/", "/pydantic_core/")),
    ("uvicorn + httptools (HTTP)", ("/uvicorn/", "/httptools/")),
    ("logging (records and queue; the writer thread's format + write)", ("/logging/", "/queue.py", "/threading.py")),
    ("asyncio + stdlib", ("/python3.",)),
]

# Inclusive time (the function and everything it calls) of the calls worth naming.
CALLS: list[tuple[str, Callable[[Frame], bool]]] = [
    ("BearerAuthBackend.authenticate (SDK, calls the verifier)", lambda f: f.name == "authenticate"),
    ("  JwtVerifier.verify_token (Coatcheck, cache hit)", lambda f: f.name == "verify_token"),
    ("SDK Mcp-Param validation (_mcp_param_rejection)", lambda f: f.name == "_mcp_param_rejection"),
    ("the tool function (api/mcp/tools_*.py)", lambda f: "/api/mcp/tools_" in f.path),
    ("the request's log line, on the event loop (api/edge.py _log)", lambda f: f.name == "_log"),
    ("the log writer thread (QueueListener: format + write)", lambda f: f.name == "_monitor"),
    # SQLAlchemy runs its core in a greenlet, whose samples do not show the calling frames: its time is in
    # the SQLAlchemy layer above, not in these two.
    ("  unit of work (store/db.py: checkout, statements, return)", lambda f: f.path == STORE + "db.py"),
    (
        "  result building (convert_result, compact, output models)",
        lambda f: f.name in {"convert_result", "compact"} or f.path == API + "mcp/schemas.py",
    ),
]


def layer_of(path: str) -> str:
    """The layer (see LAYERS) a source file belongs to."""
    return next((name for name, fragments in LAYERS if any(x in path for x in fragments)), "other")


@dataclass(frozen=True)
class Profile:
    samples: int
    by_layer: list[tuple[str, int]]
    by_call: list[tuple[str, int]]
    top_functions: list[tuple[str, int]]

    def render(self, cpu_ms_per_call: float) -> str:
        """The profile as text: share of server CPU and CPU ms per call."""

        def row(name: str, count: int) -> str:
            share = count / self.samples if self.samples else 0.0
            return f"  {name:58} {100 * share:5.1f} %  {share * cpu_ms_per_call:6.3f} ms"

        out = [f"{self.samples} samples holding the GIL; {cpu_ms_per_call:.3f} CPU ms per call", "self time by layer:"]
        out += [row(name, n) for name, n in self.by_layer if n]
        out.append("inclusive time of named calls:")
        out += [row(name, n) for name, n in self.by_call]
        out.append("hottest functions (self time):")
        out += [row(name, n) for name, n in self.top_functions[:12]]
        return "\n".join(out)


def summarise(raw: str) -> Profile:
    """Aggregate py-spy ``--format raw`` output (collapsed stacks with counts)."""
    layers: Counter[str] = Counter()
    calls: Counter[str] = Counter()
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
        layers[layer_of(leaf.path)] += count
        functions[f"{leaf.func} ({package_of(leaf.path)})"] += count
        for name, matches in CALLS:
            if any(matches(f) for f in frames):
                calls[name] += count
    return Profile(
        samples=total,
        by_layer=[(name, layers[name]) for name, _ in [*LAYERS, ("other", ())]],
        by_call=[(name, calls[name]) for name, _ in CALLS],
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
            "--gil",  # only samples holding the GIL: Python work, not threads parked in a wait
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
