"""No module of src/oblr imports, at its top level, a module that imports it back (directly or through
others): read from the source with ast (imports inside functions and under TYPE_CHECKING do not count;
importing ``a.b.c`` also runs the packages ``a.b``)."""

from __future__ import annotations

import ast
from pathlib import Path

import oblr

ROOT = Path(oblr.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _top_level_imports(name: str, path: Path, modules: dict) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deps: set[str] = set()
    direct: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
                direct.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    full = ".".join(base + ([node.module] if node.module else []))
                else:
                    full = node.module or ""
                deps.add(full)
                deps.update(f"{full}.{a.name}" for a in node.names)
                # names that are not submodules are read from the module itself, even from one's own package
                if any(f"{full}.{a.name}" not in modules for a in node.names):
                    direct.add(full)
                direct.update(f"{full}.{a.name}" for a in node.names if f"{full}.{a.name}" in modules)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit(node.body)
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))

    visit(ast.parse(path.read_text()).body)
    out = {d for d in direct if d in modules and d != name}  # what the module reads names from
    for d in deps:
        parts = d.split(".")
        for i in range(2, len(parts) + 1):  # the packages an import runs first (its own are running already)
            m = ".".join(parts[:i])
            if m in modules and m != name and not name.startswith(m + "."):
                out.add(m)
    return out


def import_cycles() -> list[list[str]]:
    modules = _modules()
    graph = {n: _top_level_imports(n, p, modules) for n, p in modules.items()}
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return cycles


def test_no_import_cycles_in_the_package():
    assert import_cycles() == []


def test_the_check_sees_a_cycle(tmp_path):
    """The check is not vacuous: two modules importing each other at top level are reported."""
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
    globals()["ROOT"] = pkg
    try:
        assert sorted(import_cycles()) == [["oblr.a", "oblr.b"], ["oblr.reg", "oblr.reg.rule"]]
    finally:
        globals()["ROOT"] = Path(oblr.__file__).parent
