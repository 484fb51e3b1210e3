"""Answer strings made comparable for the math kind: references, extracted answers, LaTeX spelling, units.

- :func:`normalize_reference`: a reference (string, number, OlympiadBench list) as one LaTeX string.
- :func:`normalize_answer`: an extracted answer (or a reference) with the wrappers a model adds removed and
  number forms math-verify misreads rewritten: ``$``/``\\(``/``\\[`` delimiters, bold (``**``,
  ``\\textbf{}``, ``\\mathbf{}``), a trailing period (``7.78.``); percent written as a word
  (``28 percent``, ``28 pct``, ``28 per cent``, ``28%``) -> ``28\\%``; "and"/"or" between answers
  (``x=1 and x=-2``, ``1 \\text{ or } 2``) -> ``", "``; a mixed number written with a slash (``1 1/2``)
  -> ``\\frac{3}{2}``; ``1e9`` -> ``1\\times10^{9}``.
- :func:`answer_parts`: the answers of a multiple-answer reference (top-level commas, thousands commas in
  their valid shape excepted).
- :func:`canonical_latex`: one spelling per meaning, applied to both sides before the symbolic check.
- :func:`canonical_unit`, :func:`unit_conflict`: a unit in the answer that differs from the reference's.

All linear-time regex substitutions; nothing is evaluated.
"""

from __future__ import annotations

import re
from fractions import Fraction

from oblr.grading.numbers import numeral_value


def strip_dollars(s: str) -> str:
    """Remove math delimiters ``$`` and currency signs ``\\$`` (``\\$18.90`` -> ``18.90``)."""
    return s.replace("\\$", "").replace("$", "").strip()


def normalize_reference(reference) -> str:
    """A reference answer as one LaTeX string: lists (OlympiadBench ``final_answer``) joined by ``", "``,
    ``$`` delimiters and a trailing period removed. Floats such as ``70.0`` (AIME25/AMC23) become text."""
    if isinstance(reference, (list, tuple)):
        parts = [normalize_reference(r) for r in reference]
        return ", ".join(p for p in parts if p)
    s = strip_dollars(str(reference))
    return s.rstrip(". \n")


_DELIMS_RE = re.compile(r"\\[\[\]()]|\\displaystyle|\*\*")
_BOLD_RE = re.compile(r"\\(?:textbf|mathbf|bf)\s*\{([^{}]*)\}")
_PERCENT_WORD_RE = re.compile(
    r"(\d)\s*(?:\\%|%|\\text\{\s*(?:percent|pct)\s*\}|per\s?cent\b|percent\b|pct\b\.?)", re.IGNORECASE)
_CONNECTOR_RE = re.compile(r"\s*\\text\s*\{\s*(?:and|or)\s*\}\s*|\s+(?:and|or)\s+|\s*,\s*(?:and|or)\s+")
_MIXED_SLASH_RE = re.compile(r"(-?)(\d{1,12})\s+(\d{1,12})\s*/\s*(\d{1,12})")
_E_NOTATION_RE = re.compile(r"(-?\d{1,30}(?:\.\d{1,30})?)[eE]([+-]?\d{1,3})")


def normalize_answer(s: str) -> str:
    """An extracted answer (or a reference) without the wrappers a model adds, number forms made explicit
    (see the module docstring). ``32, 349`` is left alone: a comma followed by a space separates answers."""
    s = _BOLD_RE.sub(r"\1", _DELIMS_RE.sub("", strip_dollars(s))).strip()
    s = s.rstrip(" .;").strip()
    s = _PERCENT_WORD_RE.sub(r"\1\\%", s)
    s = _CONNECTOR_RE.sub(", ", s)
    if m := _MIXED_SLASH_RE.fullmatch(s):
        whole, num, den = (numeral_value(g) for g in m.groups()[1:])
        if den and num < den:
            v = (whole + Fraction(num, den)) * (-1 if m.group(1) else 1)
            return f"\\frac{{{v.numerator}}}{{{v.denominator}}}"
    if m := _E_NOTATION_RE.fullmatch(s):
        return f"{m.group(1)}\\times10^{{{m.group(2)}}}"
    return s


_OPEN, _CLOSE = "([{", ")]}"
_THOUSANDS_AT = re.compile(r"\d{3}(?!\d)")


def answer_parts(s: str) -> list[str]:
    """``s`` split at its top-level commas (outside brackets and braces); a comma in a valid thousands
    shape (``12,000``: digits, comma, exactly three digits, no space) does not split. Linear time."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth = max(depth - 1, 0)
        elif c == "," and depth == 0:
            if i > 0 and s[i - 1].isdigit() and _THOUSANDS_AT.match(s, i + 1):
                continue
            parts.append(s[start:i].strip())
            start = i + 1
    parts.append(s[start:].strip())
    return [p for p in parts if p]


# Units: a unit written in the answer that names a *different known* unit than the reference's unit
# makes the answer wrong ("45 hours" for 45 minutes). Unknown words are left to the symbolic check.
_UNIT_ALIASES = {
    "s": "second", "sec": "second", "secs": "second", "second": "second",
    "min": "minute", "mins": "minute", "minute": "minute",
    "h": "hour", "hr": "hour", "hrs": "hour", "hour": "hour",
    "day": "day", "week": "week", "month": "month", "year": "year", "yr": "year", "yrs": "year",
    "mm": "mm", "millimeter": "mm", "cm": "cm", "centimeter": "cm", "m": "m", "meter": "m", "metre": "m",
    "km": "km", "kilometer": "km", "kilometre": "km", "mile": "mile", "mi": "mile", "inch": "inch", "in": "inch",
    "ft": "foot", "foot": "foot", "feet": "foot", "yard": "yard", "yd": "yard",
    "cm^2": "cm^2", "m^2": "m^2", "km^2": "km^2", "cm^3": "cm^3", "m^3": "m^3",
    "km/h": "km/h", "kmh": "km/h", "kph": "km/h", "m/s": "m/s", "mph": "mph",
    "g": "gram", "gram": "gram", "kg": "kg", "kilogram": "kg",
    "^\\circ": "degree", "^{\\circ}": "degree", "\\circ": "degree", "degree": "degree", "rad": "radian",
    "radian": "radian", "%": "percent", "\\%": "percent", "percent": "percent",
    "dollar": "dollar", "cent": "cent",
}
_TEXT_UNIT_RE = re.compile(r"\\(?:text|mathrm|mbox|textrm|operatorname)\s*\{([^{}]{1,40})\}(\^\{?\d\}?)?")
_WORD_UNIT_RE = re.compile(r"(?<=\d)\s{0,3}([A-Za-z]{1,12}(?:/[A-Za-z]{1,4}|\^\{?\d\}?)?)(?![A-Za-z{\\])")


def canonical_unit(u: str) -> str | None:
    """The canonical name of a unit string (``"minutes"`` -> ``"minute"``), None when not in the table."""
    s = u.replace("$", "").replace("~", "").replace(" ", "").replace("{", "").replace("}", "").lower().rstrip(".")
    s = s.replace("\\mathrm", "").replace("\\text", "")
    for cand in (s, s[:-1] if s.endswith("s") and len(s) > 2 else None):
        if cand in _UNIT_ALIASES:
            return _UNIT_ALIASES[cand]
    if s.startswith("^") and "circ" in s:
        return "degree"
    return None


def unit_conflict(pred: str, unit: str | None) -> bool:
    """True when ``pred`` spells a known unit other than the reference ``unit``: in ``\\text{hours}``
    (``\\mathrm``, ...) or as a plain word right after a number (``45 hours``)."""
    if not unit:
        return False
    want = canonical_unit(unit)
    if want is None:
        return False
    written = [m.group(1) + (m.group(2) or "") for m in _TEXT_UNIT_RE.finditer(pred)]
    written += [m.group(1) for m in _WORD_UNIT_RE.finditer(pred)]
    return any((got := canonical_unit(w)) is not None and got != want for w in written)


_CTRL_BEFORE_LETTER = re.compile(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])")
_COMMA_SPACE_DIGIT = re.compile(r"(?<=\d),\s+(?=\d)")
_WS = re.compile(r"\s+")
_SUB_CHAR = re.compile(r"_([A-Za-z0-9])")
_SUB_CMD = re.compile(r"_(\\[A-Za-z]+)")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])")


def canonical_latex(s: str) -> str:
    """A canonical spelling of a LaTeX answer, meaning unchanged (TeX ignores spaces in math mode except
    the one ending a control word before a letter): spaces removed (``2 i`` -> ``2i``, ``\\\\text {red}`` ->
    ``\\\\text{red}``) except after a comma between digits (``32, 349`` is two numbers, not ``32,349``),
    ``\\\\dfrac``/``\\\\tfrac`` -> ``\\\\frac``, ``\\\\left``/``\\\\right`` dropped, one-token subscripts braced
    (``E_1`` -> ``E_{1}``). Applied to both sides before the symbolic check. Linear time."""
    s = _CTRL_BEFORE_LETTER.sub(lambda m: m.group(1) + "\x00", s)
    s = _COMMA_SPACE_DIGIT.sub(",\x00", s)
    s = _WS.sub("", s).replace("\x00", " ")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _LEFT_RIGHT.sub("", s)
    s = _SUB_CMD.sub(r"_{\1}", s)
    return _SUB_CHAR.sub(r"_{\1}", s)
