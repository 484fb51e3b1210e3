"""The exact-norm engines as one family: the registry ENGINES and make_book's choice through it, and the package's
shape read from the source (no engine module imports another, no import circle inside oblr.gradnorm at module or
function level, no private name imported across its modules, files <= 400 lines, classes <= 250 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import tiny_qwen3
from gradnorm_helpers import checkpointed

import oblr.gradnorm as gradnorm
from oblr.gradnorm import (
    CHECKPOINTED_ENGINES,
    ENGINES,
    Book,
    BookKeeper,
    RecomputeBookKeeper,
    TwoPassBookKeeper,
    make_book,
)
from oblr.gradnorm.engine import engine_name

PACKAGE = Path(gradnorm.__file__).parent
ENGINE_MODULES = {"onepass", "twopass", "recompute"}


def test_the_registry_holds_the_three_engines_and_the_configs_choices_are_its_checkpointed_ones():
    assert dict(ENGINES.items()) == {"one_pass": BookKeeper, "recompute": RecomputeBookKeeper,
                                     "two_pass": TwoPassBookKeeper}
    assert all(issubclass(cls, Book) for _, cls in ENGINES.items())
    # the torch-free config choices (algorithm.checkpointed_engine, TRL's oblr_checkpointed_engine) name exactly
    # the engines that work with activation checkpointing
    assert CHECKPOINTED_ENGINES.names() == ["recompute", "two_pass"]
    assert [n for n, cls in ENGINES.items() if cls.checkpointed] == CHECKPOINTED_ENGINES.names()


def test_engine_name_follows_checkpointing_and_method():
    plain, ckpt = tiny_qwen3(seed=3), checkpointed(tiny_qwen3(seed=3))
    assert [engine_name(plain, "auto", e) for e in ("two_pass", "recompute")] == ["one_pass", "one_pass"]
    assert [engine_name(ckpt, "auto", e) for e in ("two_pass", "recompute")] == ["two_pass", "recompute"]
    assert engine_name(ckpt, "loop", "recompute") == "one_pass"  # the loop reference is the one-pass engine's
    for model in (plain, ckpt):  # an unknown name is refused whatever the model, listing the choices
        with pytest.raises(KeyError, match="registered: recompute, two_pass"):
            engine_name(model, "auto", "one_pass")


def test_make_book_builds_through_the_registry():
    """A class registered under the name is what make_book builds, with the model, method and sink."""
    made = []

    class Spy:
        def __init__(self, model, method, grad_sink):
            made.append((model, method, grad_sink))

    model, sink = checkpointed(tiny_qwen3(seed=3)), object()
    real = ENGINES.unregister("recompute")
    try:
        ENGINES.register("recompute", Spy)
        book = make_book(model, method="ghost", grad_sink=sink, engine="recompute")
    finally:
        ENGINES.unregister("recompute")
        ENGINES.register("recompute", real)
    assert isinstance(book, Spy) and made == [(model, "ghost", sink)]
    assert type(make_book(model, engine="two_pass")) is TwoPassBookKeeper


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """``(module, names, line)`` of every import in ``path`` (module level and inside functions; relative ones
    resolved inside oblr.gradnorm)."""
    pkg = "oblr.gradnorm" + ("." + ".".join(path.relative_to(PACKAGE).parent.parts)
                             if path.relative_to(PACKAGE).parent.parts else "")
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.append((mod, [a.name for a in node.names], node.lineno))
    return out


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["oblr.gradnorm", *parts])


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        deps = set()
        for mod, names, _ in _imports(path):
            deps |= {f"{mod}.{n}" for n in names if f"{mod}.{n}" in files}  # ``from . import x``
            if mod in files:
                deps.add(mod)
        graph[name] = deps - {name}
    return graph


def test_no_import_circle_inside_the_package():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(n, stack):
        state[n] = 1
        for m in graph.get(n, ()):
            if state.get(m) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if not state.get(m):
                visit(m, stack + [m])
        state[n] = 2

    for n in graph:
        if not state.get(n):
            visit(n, [n])


def test_no_engine_imports_another_engine_or_a_private_name():
    engines = {f"oblr.gradnorm.{m}" for m in ENGINE_MODULES}
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        for mod, names, line in _imports(path):
            if name in engines:
                assert mod not in engines - {name}, f"{path.name}:{line} imports the engine module {mod}"
            if mod.startswith("oblr.gradnorm"):
                private = [n for n in names if n.startswith("_") and n != "__future__"]
                assert not private, f"{path.name}:{line} imports private {private} from {mod}"


def test_files_and_classes_stay_small():
    for path in PACKAGE.rglob("*.py"):
        lines = path.read_text().splitlines()
        assert len(lines) <= 400, f"{path.name}: {len(lines)} lines"
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.ClassDef):
                n = node.end_lineno - node.lineno + 1
                assert n <= 250, f"{path.name}: class {node.name} has {n} lines"
