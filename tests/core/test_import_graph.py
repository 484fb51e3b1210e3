"""The import graph of src/oblr, read from the source with ast: no import runs from a lower layer to a higher
one, and no set of modules imports itself back (directly or through others).

Every import counts: at module level, inside functions and methods, under ``try``/``if`` (only those under
``if TYPE_CHECKING:`` do not: they never run). Importing ``a.b.c`` also runs the packages ``a.b`` (an edge
to each; a module's own packages are running already), and a package whose names are exported lazily
(:func:`oblr._lazy.lazy_exports`) has an edge to each module it exports from: a lazily exported name is an
import. Names in strings (``Registry(modules=...)``, the config's ``choices="module:NAME"``, the CLI's
subcommand modules) are not read: they name where a registry is filled, they are not calls into it.

:data:`LAYERS` is the order docs/architecture.md states below its map, lowest first; a module belongs to the
layer of the longest name that starts it. Failures name each offending edge with the file and line of its import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import oblr

ROOT = Path(oblr.__file__).parent

#: lowest first; a module may import from its own layer and the layers below it
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("oblr", "oblr._lazy", "oblr.registry", "oblr.checks", "oblr.hashing", "oblr.safe_load",
                    "oblr.disk_errors", "oblr.provenance", "oblr.plugins")),
    ("algorithm", ("oblr.params", "oblr.logprobs", "oblr.losses", "oblr.estimators", "oblr.estimator_enumeration",
                   "oblr.snr", "oblr.schedules", "oblr.step_scale", "oblr.kl_rate", "oblr.memory_model", "oblr.flop_model",
                   "oblr.gradnorm")),
    ("update core", ("oblr.update",)),
    ("distributed", ("oblr.distributed",)),
    ("rollout", ("oblr.rollout",)),
    ("config", ("oblr.config", "oblr.config_schema", "oblr.config_rules", "oblr.config_validate")),
    ("grading", ("oblr.grading",)),
    ("tasks", ("oblr.tasks",)),
    ("models", ("oblr.models",)),
    ("tracking", ("oblr.tracking",)),
    ("train", ("oblr.train",)),
    ("adapters and evaluation", ("oblr.integrations", "oblr.evaluate", "oblr.evaluate_cli", "oblr.export_cli")),
    ("experiments", ("oblr.experiments",)),
    ("entry points", ("oblr.launch", "oblr.cli", "oblr.__main__")),
]

#: edges the checks leave out, each with its reason; an entry whose edge no longer exists fails
#: (test_the_allowed_edges_still_exist), so the list only shrinks
ALLOWED: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _lazy_targets(tree: ast.Module, package: str) -> list[tuple[str, int]]:
    """``(module, line)`` for each module a ``lazy_exports(__name__, {module: names})`` call exports from."""
    out = []
    assigned = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports" and len(node.args) > 1):
            continue
        table = node.args[1]
        if isinstance(table, ast.Name):
            table = assigned.get(table.id)
        if not isinstance(table, ast.Dict):
            raise AssertionError(f"{package}: lazy_exports' table is not a dict literal the check can read (line "
                                 f"{node.lineno})")
        for key in table.keys:
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise AssertionError(f"{package}: a lazy_exports module name is not a string (line {node.lineno})")
            name = key.value
            if name.startswith("."):  # relative to the package
                up = len(name) - len(name.lstrip("."))
                base = package.split(".")[: len(package.split(".")) - up + 1]
                name = ".".join(base + [name.lstrip(".")])
            out.append((name, node.lineno))
    return out


def _imports(name: str, path: Path, modules: dict) -> dict[str, int]:
    """Every module of the package that ``name`` imports (or runs by importing), with the first line."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skipped = set()  # nodes under `if TYPE_CHECKING:`
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: dict[str, int] = {}

    def add(module: str, line: int) -> None:
        if module in modules and module != name:
            found.setdefault(module, line)

    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Import):
            targets, read = [a.name for a in node.names], []
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                full = ".".join(base + ([node.module] if node.module else []))
            else:
                full = node.module or ""
            subs = [f"{full}.{a.name}" for a in node.names]
            targets = [s for s in subs if s in modules] + [full]
            # names that are not submodules are read from the module itself, even from one's own package
            read = [full] if any(s not in modules for s in subs) else []
        for module in read:
            add(module, node.lineno)
        for target in targets:
            if target in modules and not name.startswith(target + "."):
                add(target, node.lineno)
            parts = target.split(".")
            for i in range(2, len(parts)):  # the packages the import runs first (its own are running already)
                pkg = ".".join(parts[:i])
                if not name.startswith(pkg + "."):
                    add(pkg, node.lineno)
    if path.name == "__init__.py":
        for module, line in _lazy_targets(tree, name):
            add(module, line)
    return found


def import_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    """``(graph, where)``: module -> the modules it imports, and ``file:line`` of each edge's import."""
    modules = _modules()
    graph, where = {}, {}
    for n, p in modules.items():
        edges = _imports(n, p, modules)
        graph[n] = set(edges)
        for m, line in edges.items():
            where[(n, m)] = f"{p.relative_to(ROOT.parent.parent)}:{line}"
    return graph, where


def _without_allowed(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {n: {m for m in deps if (n, m) not in ALLOWED} for n, deps in graph.items()}


def layer_of(module: str) -> int | None:
    """Index in :data:`LAYERS` of the longest prefix naming ``module`` (None: no layer names it)."""
    best, at = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, at = len(p), i
    return at


def upward_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((n, m) for n, deps in graph.items() for m in deps
                  if None not in (layer_of(n), layer_of(m)) and layer_of(m) > layer_of(n))


def strong_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm), each sorted."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
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
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(comps)


def import_cycles() -> list[list[str]]:
    return strong_components(_without_allowed(import_graph()[0]))


def _describe_edge(n: str, m: str, where: dict) -> str:
    ln, lm = layer_of(n), layer_of(m)
    layers = f" [{LAYERS[ln][0]} -> {LAYERS[lm][0]}]" if None not in (ln, lm) else ""
    return f"  {n} -> {m}{layers}  ({where[(n, m)]})"


def test_every_module_has_a_layer():
    missing = sorted(n for n in _modules() if layer_of(n) is None)
    assert not missing, "modules in no layer of LAYERS (add each where docs/architecture.md puts it): " + ", ".join(
        missing)


def test_no_import_runs_upward():
    graph, where = import_graph()
    up = upward_edges(_without_allowed(graph))
    assert not up, f"{len(up)} imports run from a lower layer to a higher one:\n" + "\n".join(
        _describe_edge(n, m, where) for n, m in up)


def test_no_import_cycles_in_the_package():
    graph, where = import_graph()
    graph = _without_allowed(graph)
    comps = strong_components(graph)
    lines = []
    for comp in comps:
        lines.append(f"{len(comp)} modules import each other: {', '.join(comp)}; their edges:")
        lines += [_describe_edge(n, m, where) for n in comp for m in sorted(graph[n]) if m in comp]
    assert not comps, "\n".join(lines)


def test_the_allowed_edges_still_exist():
    graph, _ = import_graph()
    gone = sorted(e for e in ALLOWED if e[1] not in graph.get(e[0], ()))
    assert not gone, f"allowed edges that no longer exist (remove them from ALLOWED): {gone}"


def test_the_check_sees_cycles_and_upward_imports(tmp_path):
    """The checks are not vacuous: top-level, function-level and lazily exported cycles are reported, an
    upward import too; a module importing a sibling through its package is no cycle."""
    pkg = tmp_path / "oblr"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from oblr import b\n")
    (pkg / "b.py").write_text("import oblr.a\n")
    (pkg / "sub" / "__init__.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text("from . import helper\n")  # a submodule: no cycle
    (pkg / "sub" / "helper.py").write_text("")
    (pkg / "reg").mkdir()  # a package whose submodule reads a name from the package that imports it
    (pkg / "reg" / "__init__.py").write_text("def register(): pass\nfrom . import rule\n")
    (pkg / "reg" / "rule.py").write_text("from . import register\n")
    (pkg / "f.py").write_text("def late():\n    from oblr.g import x\n")  # function-level imports
    (pkg / "g.py").write_text("x = 1\nclass C:\n    def m(self):\n        import oblr.f\n")
    (pkg / "lazy").mkdir()  # a lazily exported module that reads a name of a module importing the package
    (pkg / "lazy" / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nfrom oblr._lazy import lazy_exports\n"
        "if TYPE_CHECKING:\n    from oblr.h import y\n"  # annotations only: no edge
        "_EXPORTS = {'.impl': ['Impl']}\n__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)\n")
    (pkg / "lazy" / "impl.py").write_text("def f():\n    from oblr.h import y\n")
    (pkg / "h.py").write_text("import oblr.lazy.other\ny = 1\n")  # runs the package oblr.lazy
    (pkg / "lazy" / "other.py").write_text("")
    (pkg / "plain.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import oblr.a\n")
    globals()["ROOT"] = pkg
    try:
        graph, _ = import_graph()
        assert graph["oblr.lazy"] == {"oblr.lazy.impl"}  # the TYPE_CHECKING import is no edge
        assert graph["oblr.plain"] == set()
        assert import_cycles() == [["oblr.a", "oblr.b"], ["oblr.f", "oblr.g"],
                                   ["oblr.h", "oblr.lazy", "oblr.lazy.impl"], ["oblr.reg", "oblr.reg.rule"]]
        assert layer_of("oblr.tasks.math") == layer_of("oblr.tasks") > layer_of("oblr.grading")
        assert upward_edges({"oblr.grading.x": {"oblr.tasks.y"}, "oblr.tasks.y": {"oblr.grading"}}) == [
            ("oblr.grading.x", "oblr.tasks.y")]
    finally:
        globals()["ROOT"] = Path(oblr.__file__).parent
