"""The one way oblr reads user YAML and JSON: size and depth limits, so hostile input fails fast.

Every config file, ``key=value`` override value, saved run config, grid file, ``--engine-options`` value
and data-file row goes through :func:`load_yaml` / :func:`load_yaml_file` / :func:`load_json`. What they
refuse, with one line (:class:`InputError`, a ``ValueError``; :class:`InputLimitError` for the limits) that names the source and, where
known, the line:

- a YAML alias bomb ("billion laughs": anchors whose aliases nest, so a few hundred bytes stand for
  billions of values): the document's size *with every alias expanded* is measured on the node graph
  (each node counted once, in linear time) before anything is built, and may not exceed
  :data:`MAX_NODES` values; more than :data:`MAX_ALIASES` aliases are refused while parsing;
- a recursive alias (``&a [*a]``), which would build a structure containing itself;
- nesting deeper than :data:`MAX_DEPTH` levels (YAML, aliases expanded, or JSON), checked while parsing
  so a deep document never reaches Python's recursion limit;
- invalid YAML or JSON: ``SOURCE:LINE:COLUMN: not valid YAML: ...`` on one line.

Values come back as plain trees: an alias yields its own copy of the anchored value, so changing one
place (an override) never changes another.

    data = load_yaml_file("configs/x.yaml", what="config file")
    row = load_json(line, "data.jsonl:12")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

MAX_DEPTH = 50  # nesting levels (a config is 3-4 deep, a data row rarely more than 3)
MAX_NODES = 100_000  # values of a YAML document with its aliases expanded (a large grid file holds ~1000)
MAX_ALIASES = 1_000  # alias references in one YAML document


class InputError(ValueError):
    """YAML or JSON that oblr cannot read (one line naming the source): invalid, or beyond a limit.
    ``source`` and ``what`` are the two halves of the message ``"{source}: {what}"``."""

    def __init__(self, source: str, what: str):
        super().__init__(f"{source}: {what}")
        self.source, self.what = source, what


class InputLimitError(InputError):
    """YAML or JSON beyond a limit: an alias bomb, a recursive alias, nesting too deep."""


class _LimitedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with a depth and an alias count checked while the node graph is composed."""

    def __init__(self, stream, source: str, max_depth: int, max_aliases: int):
        super().__init__(stream)
        self._source, self._max_depth, self._max_aliases = source, max_depth, max_aliases
        self._depth = 0
        self._aliases = 0

    def _where(self) -> str:
        mark = self.peek_event().start_mark
        return f"{self._source}:{mark.line + 1}:{mark.column + 1}"

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > self._max_aliases:
                raise InputLimitError(self._where(), f"more than {self._max_aliases} YAML aliases; refused "
                                       f"(an alias bomb?)")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > self._max_depth:
            raise InputLimitError(self._where(), f"nested deeper than {self._max_depth} levels; refused")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _measure(root: yaml.Node, source: str, max_nodes: int, max_depth: int) -> None:
    """Size and depth of the document with every alias expanded, each distinct node visited once."""
    done: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, expanded depth)
    active: set[int] = set()

    def visit(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key in done:
            return done[key]
        if key in active:
            line = node.start_mark.line + 1
            raise InputLimitError(f"{source}:{line}", "a YAML alias refers to a value that contains it; refused")
        if isinstance(node, yaml.ScalarNode):
            done[key] = (1, 1)
            return done[key]
        active.add(key)
        children = ([c for kv in node.value for c in kv] if isinstance(node, yaml.MappingNode) else node.value)
        size, depth = 1, 1
        for child in children:
            s, d = visit(child)
            size, depth = size + s, max(depth, d + 1)
            if size > max_nodes:
                raise InputLimitError(source, f"expands to more than {max_nodes} values through its YAML "
                                       f"aliases; refused (an alias bomb?)")
            if depth > max_depth:
                raise InputLimitError(source, f"nested deeper than {max_depth} levels once its YAML aliases "
                                       f"are expanded; refused")
        active.discard(key)
        done[key] = (size, depth)
        return done[key]

    visit(root)


def _plain(value: Any) -> Any:
    """A copy in which no container is shared (aliases give equal, independent values)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _yaml_error(e: yaml.YAMLError, source: str) -> InputError:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    what = " ".join(str(getattr(e, "problem", None) or e).split())
    return InputError(where, f"not valid YAML: {what}")


def load_yaml(text: str | bytes, source: str = "<yaml>", *, max_depth: int = MAX_DEPTH,
              max_nodes: int = MAX_NODES, max_aliases: int = MAX_ALIASES) -> Any:
    """One YAML document, as ``yaml.safe_load`` reads it (None for an empty one), within the limits of the
    module docstring; ``source`` names it in errors."""
    loader = _LimitedLoader(text, source, max_depth, max_aliases)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node, source, max_nodes, max_depth)
        return _plain(loader.construct_document(node))
    except yaml.YAMLError as e:
        raise _yaml_error(e, source) from None
    except RecursionError:  # a limit above Python's own (never with the defaults)
        raise InputLimitError(source, "nested too deeply to read; refused") from None
    finally:
        loader.dispose()


def load_yaml_file(path: str | Path, *, what: str = "file") -> Any:
    """:func:`load_yaml` of a file (UTF-8); a missing or unreadable file raises ``FileNotFoundError`` /
    :class:`InputError` naming ``what`` and the path."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} not found: {p}")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise InputError(f"{p}:{line}", f"not valid UTF-8 (byte 0x{data[e.start]:02x})") from None
    return load_yaml(text, str(p))


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 1), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((c, d + 1) for c in v.values())
        elif isinstance(v, list):
            stack.extend((c, d + 1) for c in v)
    return deepest


def load_json(text: str, source: str = "<json>", *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)`` with a depth limit; every failure (syntax, nesting, a number Python refuses to
    read) is one :class:`InputError` naming ``source`` (and the line within ``text`` when known)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(source, f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise InputLimitError(source, f"JSON nested deeper than {max_depth} levels; refused") from None
    except ValueError as e:  # e.g. an integer with more digits than Python converts
        raise InputError(source, f"JSON value refused: {e}") from None
    if json_depth(value) > max_depth:
        raise InputLimitError(source, f"JSON nested deeper than {max_depth} levels; refused")
    return value
