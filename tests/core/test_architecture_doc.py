"""docs/architecture.md checked against the code for the claims it makes.

- its map (the first code block under "## The map") names every module under ``src/oblr`` on one line of its
  own, with a description, and names no file that does not exist (a package's line stands for its
  ``__init__.py``; nesting is by two-space indentation);
- the counts it states: "N callers" of the update core (the call sites of ``accumulate_policy_gradient``
  outside ``update.py``), "three engines" of the exact-norm family (the names ``gradnorm/engine.py``
  registers, which its map line lists);
- every "`src/oblr/....py` ... under N lines" holds.

The code side is read from the source with ``ast`` (no torch import), so the test is fast.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import oblr

ROOT = Path(oblr.__file__).parent
DOC = ROOT.parent.parent / "docs" / "architecture.md"
WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
LINE = re.compile(r"^(?P<indent> *)(?P<name>[A-Za-z_][\w.]*/?)(?P<gap> {2,})(?P<text>\S.*)$")


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def parse_map(text: str) -> dict[str, str]:
    """``{path relative to src/oblr: description}`` of the map; raises on a line that is not one module's
    line (``name  description``) or a ``#`` comment, and on a name given twice."""
    start = text.index("## The map")
    block = text[text.index("```\n", start) + 4:]
    block = block[: block.index("```")]
    lines = block.splitlines()
    assert lines[0] == "src/oblr/", f"the map's first line is {lines[0]!r}, not src/oblr/"
    out: dict[str, str] = {}
    stack: list[str] = []  # the packages enclosing the current line
    for n, line in enumerate(lines[1:], start=2):
        if line.strip().startswith("#") or not line.strip():
            continue
        m = LINE.match(line)
        assert m, f"docs/architecture.md map line {n} is not 'name  description': {line!r}"
        depth, rem = divmod(len(m["indent"]), 2)
        assert rem == 0 and 1 <= depth <= len(stack) + 1, f"map line {n}: indentation {len(m['indent'])}: {line!r}"
        del stack[depth - 1:]
        name = m["name"]
        path = "/".join(stack + [name.rstrip("/")])
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
            path += "/__init__.py"
        assert path not in out, f"map line {n}: {path} is described twice"
        out[path] = m["text"]
    return out


def source_modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")}


def test_the_map_names_every_module_once_and_no_missing_file():
    described = parse_map(_doc())
    modules = source_modules()
    missing = sorted(modules - set(described))
    extra = sorted(set(described) - modules)
    assert not missing, f"docs/architecture.md's map does not describe: {', '.join(missing)}"
    assert not extra, f"docs/architecture.md's map names files that do not exist: {', '.join(extra)}"


def test_the_map_parser_catches_a_missing_a_doubled_and_a_continuation_line():
    text = "## The map\n\n```\nsrc/oblr/\n  a.py   one\n  pkg/   the package\n    b.py  two\n```\n"
    assert parse_map(text) == {"a.py": "one", "pkg/__init__.py": "the package", "pkg/b.py": "two"}
    for bad in ("  a.py   one\n  a.py   again\n", "  a.py   one\n               continued\n", "  a.py\n"):
        try:
            parse_map(f"## The map\n\n```\nsrc/oblr/\n{bad}```\n")
        except AssertionError:
            continue
        raise AssertionError(f"parse_map accepted {bad!r}")


def _calls(name: str) -> list[str]:
    """``path:line`` of every call of ``name`` (plain or attribute) under src/oblr."""
    out = []
    for p in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name):
                    out.append(f"{p.relative_to(ROOT).as_posix()}:{node.lineno}")
    return out


def _number(word: str) -> int:
    return int(word) if word.isdigit() else WORDS[word.lower()]


def test_the_update_cores_callers_are_as_many_as_the_doc_says():
    m = re.search(r"\b(\w+) callers:", _doc())
    assert m, "docs/architecture.md no longer says how many callers the update core has"
    sites = [s for s in _calls("accumulate_policy_gradient") if not s.startswith("update.py:")]
    assert _number(m[1]) == len(sites), f"the doc says {m[1]} callers, the code has {len(sites)}: {sites}"


def test_the_exact_norm_engines_are_the_three_the_doc_names():
    tree = ast.parse((ROOT / "gradnorm" / "engine.py").read_text(encoding="utf-8"))
    registered = [n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Attribute) and n.func.attr == "register"
                  and isinstance(n.func.value, ast.Name) and n.func.value.id == "ENGINES"]
    described = parse_map(_doc())
    m = re.search(r"\b(\w+) engines as one family", described["gradnorm/__init__.py"])
    assert m and _number(m[1]) == len(registered), (m and m[1], registered)
    named = re.search(r"registry ENGINES \(([^)]*)\)", described["gradnorm/engine.py"])[1]
    assert [s.strip() for s in named.split("|")] == registered


def test_every_under_n_lines_claim_holds():
    claims = re.findall(r"`(src/oblr/[\w/]+\.py)`[^.]*?\bunder (\d+) lines", _doc().replace("\n", " "))
    assert claims, "no 'under N lines' claim found: the pattern no longer matches the doc's wording"
    for path, limit in claims:
        p = ROOT.parent.parent / path
        assert p.is_file(), f"docs/architecture.md: {path} does not exist"
        lines = len(p.read_text(encoding="utf-8").splitlines())
        assert lines < int(limit), f"docs/architecture.md says {path} is under {limit} lines; it has {lines}"
