"""The package's layers: imports only go down, no cycles, no private names across modules (ARCHITECTURE.md).

An `ast` walk of every module, function-level imports included; the only
imports that may go up are the few documented in `LAZY_UP`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "traceflops"

# Lowest first. A module may import from its own layer and the layers before it.
LAYERS = ("core", "flops", "parsers", "stages", "metrics", "views", "pipeline", "storage", "run", "report", "export", "top")
TOP = {"traceflops", "traceflops.api", "traceflops.torch_handler"}
# Narrower than the order: what these layers may read at all.
ONLY = {
    "stages": {"core", "flops", "stages"},  # stages see the Trace, never how it was read
    "storage": {"core", "storage"},  # storage keeps tables; it never decides a number
    "report": {"core", "report"},  # renderers read finished values
    "export": {"core", "parsers", "export"},  # a trace written back: the parser's streaming reader and event rules
}
# Upward imports kept inside a function, each for a reason (ARCHITECTURE.md, "Lazy imports").
LAZY_UP: set[tuple[str, str]] = set()


def layer_of(module: str) -> str:
    if module in TOP or module.startswith("traceflops.cli"):
        return "top"
    part = module.split(".")[1]
    return part if part in LAYERS else "top"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path, root: Path) -> list[tuple[str, list[str], bool, int]]:
    """(module imported, names, at top level?, line) for every traceflops import in the file."""
    tree = ast.parse(path.read_text())
    top_level = {id(n) for n in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` and `try:` blocks at top level count as top level
        if isinstance(node, (ast.If, ast.Try)):
            top_level |= {id(n) for n in ast.walk(node)}
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "traceflops" or target.startswith("traceflops."):
                out.append((target, [a.name for a in node.names], id(node) in top_level, node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("traceflops"):
                    out.append((a.name, [], id(node) in top_level, node.lineno))
    return out


def known_modules(root: Path) -> set[str]:
    return {module_name(p, root) for p in root.rglob("*.py")}


def resolve(target: str, names: list[str], modules: set[str]) -> list[tuple[str, str | None]]:
    """(module, imported name or None) pairs: `from pkg import mod` imports the module `pkg.mod`."""
    out = []
    for n in names or [None]:
        if n is not None and f"{target}.{n}" in modules:
            out.append((f"{target}.{n}", None))
        else:
            out.append((target, n))
    return out


def violations(root: Path = PACKAGE) -> list[str]:
    modules = known_modules(root)
    bad: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path in sorted(root.rglob("*.py")):
        me = module_name(path, root)
        mine = layer_of(me)
        for target, names, top, line in imports(path, root):
            for mod, name in resolve(target, names, modules):
                if mod == me:
                    continue
                where = f"{path.relative_to(root.parent)}:{line}"
                theirs = layer_of(mod)
                lazy_ok = not top and (me, mod) in LAZY_UP
                if not lazy_ok:
                    graph[me].add(mod)
                    if mod not in modules and mod != "traceflops":
                        bad.append(f"{where}: imports {mod}, which does not exist")
                    elif LAYERS.index(theirs) > LAYERS.index(mine):
                        bad.append(f"{where}: {me} ({mine}) imports {mod} ({theirs}), a layer above it")
                    elif mine in ONLY and theirs not in ONLY[mine]:
                        bad.append(f"{where}: {me} ({mine}) may import only {sorted(ONLY[mine])}, not {mod}")
                if name is not None and name.startswith("_") and not name.startswith("__"):
                    bad.append(f"{where}: {me} imports the private name {name} from {mod}")
    bad += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_imports_go_down_without_cycles_or_private_names():
    assert violations() == []


def test_every_module_says_why_it_exists():
    missing = [str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
               if p.name != "__main__.py" and not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "traceflops"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()
    return root


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"parsers/kineto.py": "from traceflops.stages.link import link\n", "stages/link.py": "link = 1\n"}, "a layer above it"),
        ({"parsers/kineto.py": "def f():\n    from traceflops.metrics import budget\n", "metrics/budget.py": ""}, "a layer above it"),
        ({"parsers/kineto.py": "from traceflops import pipeline\n", "pipeline.py": ""}, "a layer above it"),
        ({"parsers/kineto.py": "def f():\n    from traceflops.storage.cache import load\n", "storage/cache.py": "load = 1\n"}, "a layer above it"),
        ({"stages/a.py": "from traceflops.stages.b import x\n", "stages/b.py": "def f():\n    from traceflops.stages.a import y\nx = 1\n"}, "import cycle"),
        ({"stages/a.py": "from traceflops.stages.b import _x\n", "stages/b.py": "_x = 1\n"}, "private name _x"),
        ({"report/html.py": "from traceflops.views.advice import advise\n", "views/advice.py": "advise = 1\n"}, "may import only"),
        ({"storage/cache.py": "from traceflops.parsers import parse\n", "parsers/__init__.py": "parse = 1\n"}, "may import only"),
    ],
)
def test_the_check_fails_on_a_bad_import(tmp_path, files, expected):
    root = _fake_package(tmp_path, files)
    found = violations(root)
    assert any(expected in v for v in found), found


def test_the_check_passes_a_downward_import(tmp_path):
    root = _fake_package(tmp_path, {"stages/link.py": "from traceflops.core.trace import Trace\n", "core/trace.py": "Trace = 1\n"})
    assert violations(root) == []
