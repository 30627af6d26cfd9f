"""The package's imports run one way: every import of one of its own modules goes to a layer below
(or to the same sub-package), in the order docs/DESIGN.md writes down, and no modules of one
sub-package import each other in a circle. Imports inside functions and under TYPE_CHECKING count.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"lookahead": ROOT / "lookahead", "lookahead.cli": ROOT / "cli", "lookahead.benchmarks": ROOT / "benchmarks"}

# Lowest first. A unit is a sub-package or a top-level module; ``lookahead`` is the package's __init__.
LAYERS = (
    ("lookahead.errors",),
    ("lookahead.config",),
    ("lookahead.kernels",),
    ("lookahead.native",),
    ("lookahead.model",),
    ("lookahead.cost", "lookahead.loading"),
    ("lookahead.call",),
    ("lookahead.core",),
    ("lookahead.proposers",),
    ("lookahead.verify",),
    ("lookahead.plan",),
    ("lookahead.decode",),
    ("lookahead.generator",),
    ("lookahead.hf",),
    ("lookahead",),
    ("lookahead.serve",),
    ("lookahead.benchmarks",),
    ("lookahead.vllm",),
    ("lookahead.cli",),
)
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def modules() -> dict[str, Path]:
    """Every module of the installed package by its dotted name (cli/ and benchmarks/ mapped in)."""
    found = {}
    for prefix, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's own modules that module ``name`` imports, anywhere in its body."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "lookahead")
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module.split(".")[0] != "lookahead":
                continue
            for alias in node.names:
                full = f"{module}.{alias.name}"
                out.add(full if full in known else module)
    return out


def unit(name: str) -> str:
    """The layer unit a module belongs to: its sub-package, or the top-level module itself."""
    return ".".join(name.split(".")[:2])


def edges() -> list[tuple[str, str]]:
    known = modules()
    return [(a, b) for a, path in known.items() for b in imported(a, path, known)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_every_unit_has_a_layer():
    assert {unit(name) for name in modules()} <= set(RANK), "a new sub-package needs its place in LAYERS"


def test_imports_go_down_the_layers():
    upward = sorted({(unit(a), unit(b)) for a, b in edges()
                     if unit(a) != unit(b) and RANK[unit(b)] > RANK[unit(a)]})
    assert not upward, f"imports against the layer order (importer, imported): {upward}"


def test_no_circle_between_sub_packages():
    graph: dict[str, set[str]] = {}
    for a, b in edges():
        if unit(a) != unit(b):
            graph.setdefault(unit(a), set()).add(unit(b))
    assert cycles(graph) == []


def test_no_circle_inside_a_sub_package():
    graph: dict[str, set[str]] = {}
    for a, b in edges():
        if unit(a) == unit(b) and a != b and not b == unit(b):  # a package's __init__ re-exporting is no circle
            graph.setdefault(a, set()).add(b)
    assert cycles(graph) == []


def test_the_order_is_the_one_design_writes_down():
    """docs/DESIGN.md's line "Import layers, lowest first: errors < config < ... < cli" lists LAYERS."""
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    line = next((ln for ln in text.splitlines() if ln.startswith("Import layers, lowest first:")), None)
    assert line is not None, "docs/DESIGN.md must state the layer order"
    groups = line.split(":", 1)[1].strip().rstrip(".").replace("`", "").split(" < ")
    written = [tuple(sorted(u if u == "lookahead" else f"lookahead.{u}" for u in g.split(", "))) for g in groups]
    assert written == [tuple(sorted(units)) for units in LAYERS]


def test_the_walk_sees_an_upward_import_inside_a_function(tmp_path):
    """The checks can fail: an import against the order, hidden in a function, is found and ranked up."""
    path = tmp_path / "fake.py"
    path.write_text("def f():\n    from ..plan.planner import Planner\n    from ..kernels import trie\n")
    known = modules()
    found = imported("lookahead.core.fake", path, known)
    assert found == {"lookahead.plan.planner", "lookahead.kernels.trie"}
    assert RANK[unit("lookahead.plan.planner")] > RANK[unit("lookahead.core.fake")]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_public_names_load_on_first_use_and_every_one_resolves():
    """``import lookahead`` (and the command's start) imports neither torch nor transformers; every name in
    ``__all__`` resolves, from the module the lazy table names."""
    import subprocess
    import sys

    code = ("import sys, lookahead, lookahead.cli.main\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported eagerly'\n"
            "assert sorted(lookahead._HOMES) == sorted(lookahead.__all__)\n"
            "for name in lookahead.__all__:\n"
            "    assert getattr(lookahead, name) is not None, name\n"
            "from lookahead import LookaheadGenerator\n"
            "assert LookaheadGenerator.__module__ == 'lookahead.generator'\n"
            "try:\n"
            "    lookahead.no_such_name\n"
            "except AttributeError:\n"
            "    pass\n"
            "else:\n"
            "    raise SystemExit('an unknown name resolved')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def private_imports(known: dict[str, Path], prefix: str, public: set[str]) -> tuple[list[str], int]:
    """Imports in the modules of ``known`` under ``prefix`` of the package's own code that are neither a
    name of ``public`` from ``lookahead`` itself nor a module under ``prefix``; and how many imports of
    the package's own code were looked at."""
    allowed = prefix
    wrong, seen = [], 0
    for name, path in known.items():
        if not (name == prefix or name.startswith(prefix + ".")):
            continue
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "lookahead":
                        seen += 1
                        if not (alias.name == allowed or alias.name.startswith(allowed + ".")):
                            wrong.append(f"{name}: import {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                if module.split(".")[0] != "lookahead":
                    continue
                seen += 1
                if module == allowed or module.startswith(allowed + "."):
                    continue
                names = [a.name for a in node.names]
                if module != "lookahead" or not set(names) <= public:
                    wrong.append(f"{name}: from {module} import {', '.join(names)}")
    return wrong, seen


def test_serve_imports_only_the_public_names_and_its_own_modules():
    """The server stands on the package's public face (``lookahead.__all__``: the generator and its open
    batch), as any other program serving a model would: nothing from the layers beneath."""
    import lookahead

    wrong, seen = private_imports(modules(), "lookahead.serve", set(lookahead.__all__))
    assert seen >= 5, "serve/ imports nothing of the package: the check would show nothing"
    assert wrong == [], f"serve/ reaches past the public names: {wrong}"


def test_the_public_import_check_catches_a_private_import(tmp_path):
    path = tmp_path / "fake.py"
    path.write_text("from .. import LookaheadGenerator, OpenBatch\nfrom ..decode.loop import DecodeRun\n"
                    "from .. import Sequence\nfrom .engine import Engine\n")
    import lookahead

    wrong, seen = private_imports({"lookahead.serve.fake": path}, "lookahead.serve", set(lookahead.__all__))
    assert seen == 4
    assert wrong == ["lookahead.serve.fake: from lookahead.decode.loop import DecodeRun",
                     "lookahead.serve.fake: from lookahead import Sequence"]
