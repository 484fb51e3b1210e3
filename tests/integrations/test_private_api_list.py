"""docs/integrations_private_api.md lists every private framework name the TRL and verl adapters touch, and only
those: read from the adapter sources with ast (no framework imported); and, in its second table, those the rest
of oblr touches (a narrower rule: attributes reached from an imported framework name, and private names
passed to getattr/hasattr/setattr).

A private name is touched where an adapter reads, writes or calls ``x._name`` (or ``getattr(x, "_name")``),
overrides a ``_name`` method or class attribute in a subclass of a framework class (or in a ``...Mixin`` class,
written to be mixed into one: its ``self`` is the framework object), or imports ``_name`` from a framework
module. Not counted: oblr's own state on framework objects (``_oblr...``), ``self._x`` in oblr's
own classes, names imported from oblr, and Python's dunder names (other dunders, such as Ray's
``__ray_actor_class__``, count).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import oblr

REPO = Path(oblr.__file__).resolve().parents[2]
ADAPTERS = Path(oblr.__file__).parent / "integrations"
TABLE = REPO / "docs" / "integrations_private_api.md"
PYTHON_DUNDERS = {"__name__", "__qualname__", "__module__", "__doc__", "__dict__", "__class__", "__init__",
                  "__post_init__", "__getattr__", "__call__", "__wrapped__", "__file__", "__version__",
                  "__globals__"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("_oblr") and name not in PYTHON_DUNDERS


def touched(source: str, file: str) -> set[tuple[str, str]]:
    """``{(private name, file)}`` of the framework names ``source`` touches (module docstring's rule)."""
    tree = ast.parse(source)
    framework_names = set()  # names bound by imports from outside oblr
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith("oblr"):
            framework_names.update(a.asname or a.name for a in node.names)
            out.update((a.name, file) for a in node.names if _private(a.name))
        elif isinstance(node, ast.Import):
            framework_names.update((a.asname or a.name).split(".")[0] for a in node.names
                                   if not a.name.startswith("oblr"))

    def root(expr) -> str | None:
        while isinstance(expr, (ast.Attribute, ast.Call, ast.Subscript)):
            expr = expr.func if isinstance(expr, ast.Call) else expr.value
        return expr.id if isinstance(expr, ast.Name) else None

    def visit(node, framework_class: bool):
        if isinstance(node, ast.ClassDef):
            derived = any(root(b) in framework_names for b in node.bases) or node.name.endswith("Mixin")
            for b in node.bases:
                visit(b, framework_class)
            for stmt in node.body:
                if derived and isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(stmt.name):
                    out.add((stmt.name, file))
                if derived and isinstance(stmt, ast.Assign):
                    out.update((t.id, file) for t in stmt.targets if isinstance(t, ast.Name) and _private(t.id))
                visit(stmt, derived)
            return
        if isinstance(node, ast.Attribute) and _private(node.attr):
            on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
            if framework_class or not on_self:
                out.add((node.attr, file))
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr")
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str) and _private(node.args[1].value)):
            out.add((node.args[1].value, file))
        for child in ast.iter_child_nodes(node):
            visit(child, framework_class)

    visit(tree, False)
    return out


def adapter_names() -> set[tuple[str, str]]:
    found = set()
    for sub in ("trl", "verl"):
        for p in sorted((ADAPTERS / sub).glob("*.py")):
            found |= touched(p.read_text(), f"{sub}/{p.name}")
    return found


def table_names() -> set[tuple[str, str]]:
    """``{(attribute, file)}`` of the table's rows (first column: the name; second: ``file:function``)."""
    rows = set()
    for line in TABLE.read_text().splitlines():
        m = re.match(r"\| `([^`]+)` \| `([a-z]+/[a-z_]+\.py):", line)
        if m:
            rows.add((m.group(1), m.group(2)))
    return rows


def test_every_private_framework_name_the_adapters_touch_is_listed():
    missing = sorted(adapter_names() - table_names())
    assert not missing, (f"private framework names touched by the adapters but not listed in {TABLE.name} (add a row "
                         f"each: attribute, file:function, framework, version checked on): {missing}")


def test_every_listed_name_is_still_touched():
    stale = sorted(table_names() - adapter_names())
    assert not stale, f"rows of {TABLE.name} naming what the adapters no longer touch (remove them): {stale}"


def core_touched(source: str, file: str) -> set[tuple[str, str]]:
    """``{(private name, file)}`` outside the adapters: ``x._name`` where ``x`` starts from an imported
    framework name (torch, transformers, a stdlib module...), and ``getattr/hasattr/setattr(obj, "_name")``."""
    tree = ast.parse(source)
    framework_names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith("oblr"):
            framework_names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            framework_names.update((a.asname or a.name).split(".")[0] for a in node.names
                                   if not a.name.startswith("oblr"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            expr = node.value
            while isinstance(expr, (ast.Attribute, ast.Call, ast.Subscript)):
                expr = expr.func if isinstance(expr, ast.Call) else expr.value
            if isinstance(expr, ast.Name) and expr.id in framework_names:
                out.add((node.attr, file))
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr")
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str) and _private(node.args[1].value)):
            out.add((node.args[1].value, file))
    return out


def core_names() -> set[tuple[str, str]]:
    src = Path(oblr.__file__).parent
    found = set()
    for p in sorted(src.rglob("*.py")):
        if "integrations" not in p.relative_to(src).parts:
            found |= core_touched(p.read_text(), p.relative_to(src).as_posix())
    return found


def core_table_names() -> set[tuple[str, str]]:
    """Rows of the table under "## Outside the adapters" (``| `name` | `file` |``)."""
    text = TABLE.read_text().split("## Outside the adapters", 1)[1]
    return {(m.group(1), m.group(2)) for m in re.finditer(r"^\| `([^`]+)` \| `([a-z_/]+\.py)` \|", text, re.M)}


def test_every_private_name_outside_the_adapters_is_listed():
    missing = sorted(core_names() - core_table_names())
    assert not missing, f"private framework names touched outside the adapters, not listed in {TABLE.name}: {missing}"
    stale = sorted(core_table_names() - core_names())
    assert not stale, f"rows of {TABLE.name} (outside the adapters) naming what oblr no longer touches: {stale}"


def test_the_core_check_sees_framework_names_and_not_oblr_s_own():
    src = '''
import torch
from transformers import AutoModel
def f(model, book):
    torch._foreach_add_([], [])
    getattr(model, "_tied_weights_keys", None)
    return AutoModel._model_mapping, book._own_state, model.config.name
'''
    assert core_touched(src, "f.py") == {("_foreach_add_", "f.py"), ("_tied_weights_keys", "f.py"),
                                          ("_model_mapping", "f.py")}


def test_the_check_sees_private_names():
    """Not vacuous: each kind of touch is found; oblr's own names are not."""
    src = '''
from trl import GRPOTrainer
from verl.utils import _helper
from oblr.x import _ours
class T(GRPOTrainer):
    _tag_names = ["x"]
    def _calculate_rewards(self, a):
        self._oblr_state = 1
        return super()._calculate_rewards(a) + self._metrics["train"]
    def f(self):
        return getattr(self.model_wrapped, "_global_grad_norm", None)
class Mine:
    def __init__(self):
        self._own = 1
    def g(self, trainer):
        return trainer._step, self._own
'''
    assert touched(src, "f.py") == {(n, "f.py") for n in ("_helper", "_tag_names", "_calculate_rewards", "_metrics",
                                                          "_global_grad_norm", "_step")}
    assert table_names() >= {("_metrics", "trl/trainer.py"), ("_compute_old_log_prob", "verl/recipe.py")}
