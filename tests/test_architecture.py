"""The house rules, checked on the source: imports run one way, floor by floor (function-level
imports included), there is no import cycle, and no source file outgrows 600 lines.

Floors, bottom to top (docs/architecture.md): foundation modules, trace/, analysis/,
diagnosis/, results/, report/, then the orchestration floor (capture/ -> verify/ -> fix/ ->
integrations/), then the facades (api, cli, the package itself). A module may import its own
floor and those below.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "torchtriage"
FOUNDATION = ("errors", "units", "version", "document")
FLOORS = ("trace", "analysis", "diagnosis", "results", "report", "capture", "verify", "fix",
          "integrations")
FACADES = ("api", "cli", "demo", "__main__", "")  # "" is the package's __init__
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    mods = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that ``name`` imports anywhere in its file (package-relative names)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(["torchtriage", *package[:len(package) - node.level + 1]])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            targets = [module, *(f"{module}.{a.name}" for a in node.names)]
        for target in targets:
            if target == "torchtriage" or target.startswith("torchtriage."):
                rel = target.removeprefix("torchtriage").removeprefix(".")
                if rel in known and rel != name:
                    found.add(rel)
    return found


def _floor(name: str) -> int:
    top = name.split(".")[0]
    if top in FOUNDATION:
        return 0
    if top in FLOORS:
        return 1 + FLOORS.index(top)
    assert top in FACADES, f"{name}: not on any floor; add it to FLOORS or FACADES"
    return 1 + len(FLOORS)


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, set(mods)) for name, path in mods.items()}


def test_imports_never_go_up_a_floor():
    upward = [f"{a} -> {b}" for a, targets in _graph().items() for b in targets
              if _floor(b) > _floor(a)]
    assert not upward, "imports that go up a floor:\n" + "\n".join(sorted(upward))


def test_no_import_cycle():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from torchtriage.report.html import esc\n"
                      "    from . import traces\n")
    found = _imports("diagnosis.m", module, {"report.html", "diagnosis.traces", "diagnosis"})
    assert found == {"report.html", "diagnosis", "diagnosis.traces"}
    assert _floor("report.html") > _floor("diagnosis.m")


def test_no_source_file_over_600_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


# What each command may not load. torch: only run/ab/fix/demo/profile() and the bootstrap;
# the rest: the implementations and libraries a quick answer does not need.
_NEVER = ("torch", "typer", "pydantic", "psutil", "plotly", "numpy.ma", "lightning",
          "transformers", "torchtriage.integrations")
_NOT_FOR_A_QUICK_ANSWER = (*_NEVER, "numpy", "msgspec", "rich", "torchtriage.trace",
                           "torchtriage.analysis", "torchtriage.diagnosis", "torchtriage.report",
                           "torchtriage.results", "torchtriage.capture", "torchtriage.verify",
                           "torchtriage.fix", "concurrent.futures")
_NOT_FOR_ANALYZE = (*_NEVER, "torchtriage.capture", "torchtriage.verify", "torchtriage.fix",
                    "torchtriage.report.html", "concurrent.futures")


def _modules_after(argv: list[str], tmp_path) -> set[str]:
    """The modules a fresh interpreter holds after ``torchtriage ARGV``."""
    import json
    import subprocess
    import sys

    listing = tmp_path / "modules.json"
    code = ("import json, sys\nfrom torchtriage.cli import main\n"
            f"status = main({argv!r})\n"
            f"open({str(listing)!r}, 'w').write(json.dumps(sorted(sys.modules)))\n"
            "sys.exit(status)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return set(json.loads(listing.read_text()))


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if n in modules or any(m.startswith(n + ".") for m in modules)]


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["analyze", "--help"],
                                  ["run", "--help"], ["history", "--help"]])
def test_quick_answers_load_no_implementation(argv, tmp_path):
    assert not _loaded(_modules_after(argv, tmp_path), _NOT_FOR_A_QUICK_ANSWER)


@pytest.mark.parametrize("argv", [["analyze", "--json"], ["analyze"], ["schema"], ["history"],
                                  ["knobs"]])
def test_trace_and_store_commands_do_not_import_torch(argv, tmp_path):
    from tests.conftest import write_trace, x

    if argv[0] == "analyze":
        trace = write_trace(tmp_path / "t.json", [
            x("ProfilerStep#1", 0, 100), x("aten::mm", 10, 50), x("ProfilerStep#2", 100, 100),
            x("aten::mm", 110, 50)])
        argv = [*argv, str(trace)]
    modules = _modules_after(argv, tmp_path)
    allowed = ("torchtriage.verify",) if argv == ["history"] else ()  # the run store
    assert not _loaded(modules, tuple(n for n in _NOT_FOR_ANALYZE if n not in allowed))
    if argv[:2] == ["analyze", "--json"]:  # the terminal view is not drawn
        assert not _loaded(modules, ("rich",))


def test_importing_the_package_and_diagnosing_a_trace_does_not_import_torch(tmp_path):
    import subprocess
    import sys

    from tests.conftest import write_trace, x

    trace = write_trace(tmp_path / "t.json", [x("ProfilerStep#1", 0, 100), x("aten::mm", 10, 50),
                                              x("ProfilerStep#2", 100, 100),
                                              x("aten::mm", 110, 50)])
    code = ("import sys, torchtriage.cli, torchtriage\n"
            f"torchtriage.diagnose({str(trace)!r})\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_floors_count_every_module():
    names = defaultdict(list)
    for name in _modules():
        names[_floor(name)].append(name)
    assert names[0] and names[len(FLOORS) + 1]


def test_analyze_of_a_real_trace_with_shapes_loads_nothing_it_does_not_need(tmp_path,
                                                                           shared_traces):
    """A real CPU trace with input shapes and types takes paths the synthetic one does not
    (float64 inputs read from the shapes: `np.unique` there imported numpy.ma, 10 ms)."""
    trace = shared_traces / "hta" / "rank_non_gpu" / "rank_non_gpu.json.gz"
    assert not _loaded(_modules_after(["analyze", "--json", str(trace)], tmp_path),
                       (*_NOT_FOR_ANALYZE, "rich"))
    # its terminal view: rich's table of emoji codes is not loaded (7 ms: names print as
    # written, cli.output.console)
    assert not _loaded(_modules_after(["analyze", str(trace)], tmp_path), ("rich._emoji_codes",))
