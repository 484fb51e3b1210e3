"""The value a numeric answer states, read whole and exactly (``fractions.Fraction``): the GSM8K rule.

A numeric answer is read as the value it states, never by its leading digits. :func:`read_value` reads
one answer (what follows ``####``, a box, "the answer is"); :func:`last_value` finds the last numeric
expression of free text. What can be read:

- numerals: ``18``, ``-5`` (also the Unicode minus), ``.5``, ``18.``/``18.00`` (a trailing period ends
  the sentence), thousands commas only in groups of three (``1,234,567.5``; LaTeX ``1{,}200``,
  ``1,\\!200``); a currency sign before (``$``, ``\\$``, ``€``, ``£``, ``¥``, ``₹``) and words or ``%``
  after (units) are not part of the value, a scale word is (``$2.5 million`` = 2500000);
- fractions ``2/3``, ``\\frac{2}{3}``, ``\\frac23``; mixed numbers ``1 1/2``, ``1\\frac{1}{2}`` (3/2);
- scientific notation ``1e9``, ``1.5E-3``, ``3 x 10^5``, ``3 \\times 10^{5}``, ``3*10^5``; powers ``2^10``;
- other bases ``1010_2``, ``17_{8}``, ``0x1F``, ``0b101``, ``0o17``;
- a chain ``20 - 2 = 18``: the value after the last ``=``.

What states no single value, and is graded wrong against any number: a malformed numeral (``1,00``,
``12,3456``, ``1.2.3``, ``1 000``), a time or ratio (``12:30``, ``3:2``), a list at the start of an answer
(``12, 13``, ``12 or 13``), an expression left unevaluated (``5 + 3``, ``3 x 4``), digits invalid in
their base (``129_2``), a numeral over :data:`MAX_DIGITS` digits, an expression of more than
:data:`MAX_CHAIN` numbers. Such a reading has ``value None`` and a ``note`` saying why.

Every scan is linear in the text with bounded look-ahead; powers are refused before they grow past
:data:`MAX_DIGITS` digits; nothing is eval'd.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

MAX_DIGITS = 60  # longer numerals are not converted (Python int parsing and Fraction are super-linear)
MAX_EXPONENT = 200
MAX_CHAIN = 64  # numbers read in one expression (a longer one states no single value)

_CURRENCY = r"(?:\\\$|\$|€|£|¥|₹)"
_MINUS = "-−"
# where a value may start: not inside a word or after a decimal point ("x5", "1.5" read from its start)
_START_RE = re.compile(
    r"(?<![\w.])(?:[-−+][ ]?)?(?:" + _CURRENCY + r"[ ]?)?(?:[-−][ ]?)?(?=\d|\.\d|\\[dt]?frac)")
_VALUE_RE = re.compile(
    r"(?P<sign>[-−+])?[ ]?(?:" + _CURRENCY + r"[ ]?)?(?P<sign2>[-−])?[ ]?"
    r"(?:0[xX](?P<hex>[0-9a-fA-F]{1,50})(?![\w])|0[bB](?P<bin>[01]{1,200})(?![\w])"
    r"|0[oO](?P<oct>[0-7]{1,70})(?![\w])"
    r"|\\[dt]?frac\s{0,3}\{\s{0,3}(?P<fn>[-−]?\d+(?:\.\d+)?)\s{0,3}\}"
    r"\s{0,3}\{\s{0,3}(?P<fd>[-−]?\d+(?:\.\d+)?)\s{0,3}\}"
    r"|\\[dt]?frac(?P<fn1>\d)(?P<fd1>\d)"
    r"|(?P<num>\d[\d,.]*|\.\d+))"
)
_NUMERAL_RE = re.compile(r"\d+(?:\.\d*)?|\.\d+|[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")
_SCI_RE = re.compile(r"[eE](?P<exp>[+-]?\d{1,3})(?![\w])")
_BASE_RE = re.compile(r"_\{?(?P<base>\d{1,2})\}?")
_TIME_RE = re.compile(r"(?::\d+)+")
_SCALE_RE = re.compile(r"[ ]{1,3}(thousand|million|billion|trillion)\b", re.IGNORECASE)
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_MIXED_RE = re.compile(r"(?:[ ]{1,3}|\\[ ,;]|~)?\\[dt]?frac\s{0,3}\{(?P<a>\d+)\}\s{0,3}\{(?P<b>\d+)\}"
                       r"|[ ]{1,3}(?P<c>\d+)/(?P<d>\d+)(?![\d/.])")
_OP_RE = re.compile(r"[ ]{0,3}(?P<op>\\times|\\cdot|\\div|[-−+*×·÷/^]|[xX](?=[ ]{0,3}\d))[ ]{0,3}")
_EXP_RE = re.compile(r"\{?[ ]{0,3}(?P<e>[-−+]?\d{1,4})[ ]{0,3}\}?")
_EQ_RE = re.compile(r"[ ]{0,3}=[ ]{0,3}")
_LIST_RE = re.compile(r"(?:[ ]{0,3}[,;]|[ ]{1,3}(?:and|or))[ ]{0,3}(?:[-−][ ]?)?(?:" + _CURRENCY + r"[ ]?)?\d")
_SPACED_DIGIT_RE = re.compile(r"[ ]{1,3}\d")
_MUL = {"*", "×", "·", "x", "X", "\\times", "\\cdot"}
_BASES = {"hex": 16, "bin": 2, "oct": 8}


@dataclass(frozen=True)
class Reading:
    """One numeric expression read from ``text[start:end]``: its ``value`` (None when it states no single
    number) and ``note`` (why not: "malformed number", "time or ratio", "list", ...; "" when read)."""

    value: Fraction | None
    start: int
    end: int
    note: str = ""


def numeral_value(digits: str) -> Fraction | None:
    """Exact value of an unsigned decimal numeral in a valid shape (``1,234.5``, ``18.``, ``.5``); None when
    malformed or longer than :data:`MAX_DIGITS` digits."""
    if not _NUMERAL_RE.fullmatch(digits) or sum(ch.isdigit() for ch in digits) > MAX_DIGITS:
        return None
    return Fraction(digits.replace(",", "").rstrip("."))


def _signed(neg: bool, v: Fraction | None) -> Fraction | None:
    return -v if (v is not None and neg) else v


def _power(base: Fraction, exp: int) -> Fraction | None:
    """``base ** exp`` when the result stays within MAX_DIGITS digits (checked before computing)."""
    if abs(exp) > MAX_EXPONENT:
        return None
    size = max(abs(base.numerator), base.denominator)
    if size > 1 and (size.bit_length() - 1) * abs(exp) > 3.33 * MAX_DIGITS:
        return None
    if base == 0 and exp < 0:
        return None
    return base ** exp


def _read_atom(text: str, pos: int, allow_sign: bool = True) -> tuple[Fraction | None, int, str] | None:
    """One number at ``pos``: ``(value, end, note)``, or None when no number starts there."""
    m = _VALUE_RE.match(text, pos)
    if m is None or (not allow_sign and (m.group("sign") or m.group("sign2"))):
        return None
    neg = m.group("sign") in ("-", "−") or m.group("sign2") is not None
    end = m.end()
    for name, base in _BASES.items():
        if m.group(name):
            return _signed(neg, Fraction(int(m.group(name), base))), end, ""
    if m.group("fn") is not None or m.group("fn1") is not None:
        n, d = m.group("fn", "fd") if m.group("fn") is not None else m.group("fn1", "fd1")
        nv = _signed(n[0] in _MINUS, numeral_value(n.lstrip(_MINUS)))
        dv = _signed(d[0] in _MINUS, numeral_value(d.lstrip(_MINUS)))
        if nv is None or not dv:
            return None, end, "malformed fraction"
        return _signed(neg, nv / dv), end, ""
    num = m.group("num")
    stripped = num.rstrip(".,")  # "18." ends a sentence, "18," a clause
    end = m.start("num") + len(stripped)
    value = numeral_value(stripped)
    if value is None:
        return None, m.end(), "number too long" if _NUMERAL_RE.fullmatch(stripped) else "malformed number"
    plain_int = stripped.isdigit()
    if s := _SCI_RE.match(text, end):
        p = _power(Fraction(10), int(s.group("exp")))
        if p is None:
            return None, s.end(), "exponent too large"
        return _signed(neg, value * p), s.end(), ""
    if plain_int and (b := _BASE_RE.match(text, end)):
        base = int(b.group("base"))
        if not 2 <= base <= 36 or any(int(ch) >= base for ch in stripped):
            return None, b.end(), f"digits invalid in base {base}"
        return _signed(neg, Fraction(int(stripped, base))), b.end(), ""
    if plain_int and (t := _TIME_RE.match(text, end)):
        return None, t.end(), "time or ratio"
    if plain_int and (x := _MIXED_RE.match(text, end)):
        a, b = (x.group("a"), x.group("b")) if x.group("a") is not None else (x.group("c"), x.group("d"))
        fa, fb = numeral_value(a), numeral_value(b)
        if fa is not None and fb and fa < fb:
            return _signed(neg, value + fa / fb), x.end(), ""
    if sc := _SCALE_RE.match(text, end):
        return _signed(neg, value * _SCALES[sc.group(1).lower()]), sc.end(), ""
    return _signed(neg, value), end, ""


def _eval_segment(vals: list[Fraction | None], ops: list[str]) -> tuple[Fraction | None, str]:
    """The value a segment states: one number, ``a/b``, ``a x 10^k``, ``a^k``; else None (unevaluated)."""
    if any(v is None for v in vals):
        return None, "malformed number"
    if not ops:
        return vals[0], ""
    if ops == ["/"]:
        return (vals[0] / vals[1], "") if vals[1] else (None, "division by zero")
    if ops == ["^"] and vals[1].denominator == 1:
        p = _power(vals[0], int(vals[1]))
        return (p, "") if p is not None else (None, "exponent too large")
    if len(ops) == 2 and ops[0] in _MUL and ops[1] == "^" and vals[1] == 10 and vals[2].denominator == 1:
        p = _power(Fraction(10), int(vals[2]))
        return (vals[0] * p, "") if p is not None else (None, "exponent too large")
    return None, "unevaluated expression"


def _read_expression(text: str, pos: int) -> Reading | None:
    """The numeric expression starting at ``pos`` (see the module docstring); None if no number is there."""
    first = _read_atom(text, pos)
    if first is None:
        return None
    vals, ops, end, note = [first[0]], [], first[1], first[2]
    for _ in range(MAX_CHAIN):
        if (o := _OP_RE.match(text, end)) is not None:
            op = o.group("op")
            if op == "^":
                e = _EXP_RE.match(text, o.end())
                if e is None:
                    break
                vals.append(Fraction(int(e.group("e").replace("−", "-"))))
                ops.append(op)
                end = e.end()
                continue
            nxt = _read_atom(text, o.end(), allow_sign=op not in "-−+")
            if nxt is None:
                break
            vals.append(nxt[0])
            ops.append(op)
            end, note = nxt[1], note or nxt[2]
            continue
        if (q := _EQ_RE.match(text, end)) is not None and (nxt := _read_atom(text, q.end())) is not None:
            vals, ops, end, note = [nxt[0]], [], nxt[1], nxt[2]
            continue
        break
    else:
        return Reading(None, pos, end, "expression too long")
    value, why = _eval_segment(vals, ops)
    return Reading(value, pos, end, "" if value is not None else (note or why))


def read_value(span: str) -> Reading | None:
    """The value an answer states: the first numeric expression of ``span`` (text after ``####``, a box's
    content, an answer sentence), read whole. A second number right after it (``12, 13``, ``12 13``,
    ``12 or 13``) makes it a list: no single value. None when ``span`` holds no number."""
    span = span.replace("{,}", ",").replace(",\\!", ",")
    m = _START_RE.search(span)
    if m is None:
        return None
    r = _read_expression(span, m.start())
    if r is None:
        return None
    if r.value is not None and (_LIST_RE.match(span, r.end) or _SPACED_DIGIT_RE.match(span, r.end)):
        return Reading(None, r.start, r.end, "several numbers")
    return r


def last_value(text: str) -> Reading | None:
    """The last numeric expression of free text (``16 - 3 - 4 = 9 eggs, 9 * 2 = 18`` -> 18), read whole.

    Read from the end: from the last place a number starts, earlier starts are tried while the expression
    read from them still reaches the end of the last one (``3 x 10^5`` from ``5``, ``10``, then ``3``), at
    most :data:`MAX_CHAIN` of them (a longer chain is no single value anyway). Linear time."""
    text = text.replace("{,}", ",").replace(",\\!", ",")
    starts = [m.start() for m in _START_RE.finditer(text)]
    last = None
    for s in reversed(starts[-MAX_CHAIN:]):
        r = _read_expression(text, s)
        if r is None:
            continue
        if last is not None and r.end < last.end:
            break
        last = r
    return last


_SCI_FORM_RE = re.compile(r"(?P<m>.+?)(?:\s*(?:\\times|\\cdot|×|\*|x)\s*10\s*\^\s*\{?\s*(?P<e1>[-−+]?\d{1,3})\s*\}?"
                          r"|[eE](?P<e2>[+-]?\d{1,3}))")


def plain_number(s: str) -> Fraction | None:
    """Exact value when ``s`` is just a number in decimal or scientific notation (``-3``, ``70.0``, ``.5``,
    ``12,000,023``, ``7.78.``, ``\\$18``, ``2.88e-19``, ``6.6 \\times 10^{-34}``), else None. Used for the
    exact fast path of the math kind (math-verify's tolerance is absolute: every number below 1e-6 would
    equal every other)."""
    s = s.strip().replace("\\$", "").strip("$").strip().removesuffix(".")
    s = s.replace("{,}", ",").replace(",\\!", ",")
    if len(s) > 2 * MAX_DIGITS or not s:
        return None
    exp = 0
    if (m := _SCI_FORM_RE.fullmatch(s)) is not None:
        s, exp = m.group("m"), int((m.group("e1") or m.group("e2")).replace("−", "-"))
    neg = s[0] in _MINUS
    v = _signed(neg, numeral_value(s[1:] if neg else s))
    return v * Fraction(10) ** exp if v is not None else None
