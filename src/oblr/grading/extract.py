"""Answer extraction from model text: linear-time string scans, no regex backtracking, no eval.

Everything here runs in the calling process, so it must stay cheap on any input: every scan is a single
pass (``O(len(text))``), numbers longer than :data:`MAX_DIGITS` digits are rejected instead of converted.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_DIGITS = 60  # longer numerals are not converted (Python int parsing and Fraction are super-linear)

# A number as written in GSM8K-style text: optional sign (not after a word character, so "3-5" gives 5),
# optional "$", thousands groups "1,234,567", decimals; a trailing period is not part of the number.
_NUM_RE = re.compile(
    r"(?<![\w.])(-)?[ ]?\\?\$?[ ]?(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?![\d])"
)
_PLAIN_NUM_RE = re.compile(r"-?(?:\d+(?:\.\d+)?|\.\d+)")
_ANCHOR_RE = re.compile(
    r"(?:final answer|the answer|answer)\s*(?:is|:|=)|(?:^|\n)[ \t]*A[ \t]*:", re.IGNORECASE
)
_BOX_CMDS = ("\\boxed", "\\fbox")
MAX_BOX_TRIES = 4


def _match_braces(text: str, start: int) -> int | None:
    """Index just past the ``}`` closing the ``{`` at ``text[start]``; escaped ``\\{``/``\\}`` are skipped."""
    depth = 0
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``) with nested braces; None if none.

    An unbalanced last box (``\\boxed{1+{2}``) is skipped and the previous one is tried, at most
    :data:`MAX_BOX_TRIES` boxes from the end (so the scan stays linear on ``"\\boxed{" * 5000``).
    """
    end = len(text)
    for _ in range(MAX_BOX_TRIES):
        pos = max(text.rfind(cmd, 0, end) for cmd in _BOX_CMDS)
        if pos < 0:
            return None
        cmd_len = len("\\boxed") if text.startswith("\\boxed", pos) else len("\\fbox")
        j = pos + cmd_len
        if j < len(text) and text[j].isalpha():  # e.g. \boxedfoo: not our command
            end = pos
            continue
        while j < len(text) and text[j] == " ":
            j += 1
        if j < len(text) and text[j] == "{":
            close = _match_braces(text, j)
            if close is not None:
                return text[j + 1:close - 1].strip()
        elif j > pos + cmd_len:  # "\boxed 5": one token
            m = re.match(r"[^\s$]+", text[j:])
            if m:
                return m.group(0).rstrip(".")
        end = pos
    return None


def to_fraction(sign: str | None, digits: str) -> Fraction | None:
    """Exact value of a matched numeral (commas removed); None when it has more than MAX_DIGITS digits."""
    digits = digits.replace(",", "")
    if sum(ch.isdigit() for ch in digits) > MAX_DIGITS:
        return None
    value = Fraction(digits)
    return -value if sign else value


def _first_number(text: str) -> Fraction | None:
    m = _NUM_RE.search(text)
    return to_fraction(m.group(1), m.group(2)) if m else None


def _last_number(text: str) -> Fraction | None:
    last = None
    for last in _NUM_RE.finditer(text):
        pass
    return to_fraction(last.group(1), last.group(2)) if last else None


def extract_gsm8k_number(text: str) -> tuple[Fraction | None, str]:
    """The final numeric answer of GSM8K-style text and how it was found.

    Order: the text after the last ``####``; the last ``\\boxed{}``; after the last "answer is"/"answer:"/
    "A:" anchor; the last number in the text. Returns ``(value, source)`` with source one of
    ``"####"``, ``"boxed"``, ``"anchor"``, ``"last_number"``, ``"none"``.
    """
    if "####" in text:
        v = _first_number(text[text.rfind("####") + 4:])
        if v is not None:
            return v, "####"
    boxed = last_boxed(text)
    if boxed is not None:
        v = _first_number(boxed.replace("{,}", ","))
        if v is not None:
            return v, "boxed"
    anchor = None
    for anchor in _ANCHOR_RE.finditer(text):
        pass
    if anchor is not None:
        v = _first_number(text[anchor.end():anchor.end() + 200])
        if v is not None:
            return v, "anchor"
    v = _last_number(text)
    return (v, "last_number") if v is not None else (None, "none")


def plain_number(s: str) -> Fraction | None:
    """Exact value when ``s`` is just a decimal numeral (``-3``, ``70.0``, ``.5``), else None."""
    s = s.strip().strip("$").strip()
    s = s.removesuffix(".")
    if len(s) > MAX_DIGITS + 2 or not _PLAIN_NUM_RE.fullmatch(s):
        return None
    neg = s.startswith("-")
    return to_fraction("-" if neg else None, s.lstrip("-"))


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


# Units: a unit word written in the answer that names a *different known* unit than the reference's unit
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
    """True when ``pred`` spells a known unit (``\\text{hours}``) other than the reference ``unit``."""
    if not unit:
        return False
    want = canonical_unit(unit)
    if want is None:
        return False
    for m in _TEXT_UNIT_RE.finditer(pred):
        got = canonical_unit(m.group(1) + (m.group(2) or "").replace("{", "").replace("}", ""))
        if got is not None and got != want:
            return True
    return False


_CTRL_BEFORE_LETTER = re.compile(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])")
_WS = re.compile(r"\s+")
_SUB_CHAR = re.compile(r"_([A-Za-z0-9])")
_SUB_CMD = re.compile(r"_(\\[A-Za-z]+)")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])")


def canonical_latex(s: str) -> str:
    """A canonical spelling of a LaTeX answer, meaning unchanged (TeX ignores spaces in math mode except
    the one ending a control word before a letter): spaces removed (``2 i`` -> ``2i``, ``\\\\text {red}`` ->
    ``\\\\text{red}``), ``\\\\dfrac``/``\\\\tfrac`` -> ``\\\\frac``, ``\\\\left``/``\\\\right`` dropped, one-token
    subscripts braced (``E_1`` -> ``E_{1}``). Applied to both sides before the symbolic check. Linear time."""
    s = _CTRL_BEFORE_LETTER.sub(lambda m: m.group(1) + "\x00", s)
    s = _WS.sub("", s).replace("\x00", " ")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _LEFT_RIGHT.sub("", s)
    s = _SUB_CMD.sub(r"_{\1}", s)
    return _SUB_CHAR.sub(r"_{\1}", s)
