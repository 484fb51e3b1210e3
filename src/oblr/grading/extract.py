"""Finding the final answer in model text: boxes, answer sentences, ``####``, and one precedence rule.

Answer statements
-----------------
- a box: ``\\boxed{...}``, ``\\fbox{...}``, ``\\boxed 5`` (nested and escaped braces handled);
- an answer sentence: "... answer is ...", "... answers are ...", "Final Answer: ...", "The answer: ...",
  "Answer: ..." at the start of a line ("check our answer: ..." is none), ``A: ...`` at the start of a
  line, and the GSM8K marker ``#### ...``. Its content runs to
  the end of the sentence (a period followed by a space or the end, a line break outside display math)
  and stops before "I hope it is correct" and before a remark (", which ...", ", since ...", " (note
  ..."; not ", and"/", or"); leading filler words ("therefore", "actually", ...) and
  trailing punctuation are dropped. A sentence counts only if its content starts like an answer (a number,
  a sign, ``$``, a LaTeX command, a bracket, ``x = ...``, one capital letter; or a named quantity whose
  value follows: "Final Answer: The largest $n$ is 34." reads ``34``): "the answer is correct"
  is no statement, nor is a question ("what if the answer is 5?") or a supposition ("if the answer is
  5, ...", "whether our answer is 5").

Precedence (one rule): **the statement that starts last in the text is the answer.** A response that
states one answer and then corrects itself ("\\boxed{5}. Wait, the answer is 6.") is graded on the
correction; a box inside an answer sentence ("The final answer is $\\boxed{5}$.") starts after the
sentence, so the box is read; text after the last statement ("I hope it is correct") is ignored. When
the reference has several answers and the last statement is a box, the boxes right before it (gaps of at
most :data:`RUN_GAP` characters, no blank line) are read with it, joined by ``", "``. Without any
statement the caller falls back: the last number (gsm8k), math-verify's own extraction (math).

Every scan is linear in the text: boxes are looked up from the end (at most :data:`MAX_BOX_TRIES`
unbalanced ones, :data:`MAX_RUN` in a run), sentences are read in a window of :data:`SENTENCE_WINDOW`
characters, at most :data:`MAX_SENTENCE_TRIES` of them. Nothing is evaluated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from oblr.grading.numbers import Reading, last_value, read_value

_BOX_CMDS = ("\\boxed", "\\fbox")
MAX_BOX_TRIES = 4  # unbalanced boxes skipped from the end before giving up
MAX_RUN = 16  # boxes read together for a multiple-answer reference
RUN_GAP = 40  # most characters between two boxes of one run
SENTENCE_WINDOW = 400
MAX_SENTENCE_TRIES = 8

_ANCHOR_RE = re.compile(
    r"\banswers?\**\s+(?:is|are)\b"  # "the (final) answer is", "the answers are"
    r"|(?:\b(?:final|the)\s+answers?|(?:^|\n)[ \t#*>]*answers?)\**\s*[:=]"  # "Final Answer:", "Answer:"
    r"|(?:^|\n)[ \t]*A[ \t]*:|(?P<hash>####)", re.IGNORECASE)
_FILLER_RE = re.compile(r"(?:(?:therefore|thus|hence|so|then|indeed|actually|simply|just|now|clearly|exactly|"
                        r"still|equal to|equals|given by)\b[\s,:]*)*", re.IGNORECASE)
_ANSWER_LIKE_RE = re.compile(r"\$|\\[(\[a-zA-Z]|[-−+]?\s?(?:\\\$|€|£)?\s?\.?\d|[(\[{]"
                             r"|[A-Za-z]\w{0,3}(?:\(\w{1,3}\))?\s{0,2}=|[A-Z]$")
# "The largest $n$ is 34": a named quantity before the value; the value after its first "is"/"="
_NAMED_RE = re.compile(r"(?:the|our|my)\s+(?:[^\s.,;:=]+\s+){1,6}?(?:is|are|equals|=)\s+", re.IGNORECASE)
_HOPE_RE = re.compile(r"\s*[,.(]?\s*I hope it is correct", re.IGNORECASE)
# a remark after the answer: ", which ...", ", since ...", " (note ..."
_REMARK_RE = re.compile(r",\s+(?!(?:and|or)\b)[a-z]{2,}\b(?!\s*[=(])| \((?=[a-z]{3,}\s)")
_HYPOTHETICAL_RE = re.compile(r"\b(?:if|whether|suppose|assume|assuming|unless)\s+(?:\S+\s+){0,3}\Z",
                              re.IGNORECASE)
_PARAGRAPH_RE = re.compile(r"\n\s*\n|\.\s+[A-Z]")


@dataclass(frozen=True)
class Answer:
    """The final answer found in a text: its ``text`` (box contents joined by ``", "`` for a run),
    ``source`` ("boxed", "sentence" or "####") and where its statement ``start``\\ s."""

    text: str
    source: str
    start: int


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


def boxes_from_end(text: str, limit: int = 1) -> list[tuple[int, int, str]]:
    """Up to ``limit`` boxes ``(start, end, content)``, the last first (``\\boxed{...}``, ``\\fbox{...}``,
    ``\\boxed 5``). An unbalanced box (``\\boxed{1+{2}``) is skipped, at most :data:`MAX_BOX_TRIES` of
    them."""
    out: list[tuple[int, int, str]] = []
    end, failures = len(text), 0
    while len(out) < limit and failures < MAX_BOX_TRIES:
        pos = max(text.rfind(cmd, 0, end) for cmd in _BOX_CMDS)
        if pos < 0:
            break
        end = pos
        cmd_len = len("\\boxed") if text.startswith("\\boxed", pos) else len("\\fbox")
        j = pos + cmd_len
        if j < len(text) and text[j].isalpha():  # e.g. \boxedfoo: not our command
            continue
        while j < len(text) and text[j] == " ":
            j += 1
        if j < len(text) and text[j] == "{":
            close = _match_braces(text, j)
            if close is not None:
                out.append((pos, close, text[j + 1:close - 1].strip()))
                continue
        elif j > pos + cmd_len:  # "\boxed 5": one token
            m = re.match(r"[^\s$]+", text[j:j + 200])
            if m:
                out.append((pos, j + m.end(), m.group(0).rstrip(".")))
                continue
        failures += 1
    return out


def last_boxed(text: str) -> str | None:
    """Content of the last box (see :func:`boxes_from_end`); None if there is none."""
    boxes = boxes_from_end(text)
    return boxes[0][2] if boxes else None


def _box_run(text: str, boxes: list[tuple[int, int, str]]) -> str:
    """The last box and the boxes right before it (see the module docstring), in reading order."""
    run = [boxes[0]]
    for b in boxes[1:]:
        gap = text[b[1]:run[-1][0]]
        if b[1] > run[-1][0] or len(gap) > RUN_GAP or _PARAGRAPH_RE.search(gap):
            break
        run.append(b)
    return ", ".join(b[2] for b in reversed(run) if b[2])


def _sentence(text: str, start: int) -> str:
    """The content of the answer sentence whose anchor ends at ``start`` (see the module docstring)."""
    w = text[start:start + SENTENCE_WINDOW]
    i = 0
    while i < len(w) and w[i] in " \t\r\n:*":
        i += 1
    i = _FILLER_RE.match(w, i).end()
    depth, math, j = 0, "", i
    while j < len(w):
        c = w[j]
        if c == "\\" and w.startswith(("\\[", "\\]"), j):
            math = "" if w[j + 1] == "]" else "\\["
            j += 2
            continue
        if c == "\\":
            j += 2
            continue
        if c == "$":
            dd = w.startswith("$$", j)
            math = "" if math else ("$$" if dd else "$")
            j += 2 if dd else 1
            continue
        if c in "{(":
            depth += 1
        elif c in "})":
            depth = max(depth - 1, 0)
        elif c == "\n" and not math.startswith(("$$", "\\[")) and depth == 0:
            break
        elif c in ".?!" and not math and depth == 0 and (j + 1 == len(w) or w[j + 1].isspace()):
            if c == "?":  # "what if the answer is 5?": a question states nothing
                return ""
            break
        elif c in ", " and not math and depth == 0 and _REMARK_RE.match(w, j):
            break
        j += 1
    content = w[i:j]
    if m := _HOPE_RE.search(content):
        content = content[:m.start()]
    return content.strip().rstrip(" .,;:!*").strip()


def _sentences_from_end(text: str, after: int):
    """Answer sentences that start at or after ``after``, the last first: ``(start, content, source)``."""
    anchors = list(_ANCHOR_RE.finditer(text))
    for m in anchors[::-1][:MAX_SENTENCE_TRIES]:
        if m.start() < after:
            return
        source = "####" if m.group("hash") else "sentence"
        if source == "sentence" and _HYPOTHETICAL_RE.search(text[max(m.start() - 40, 0):m.start()]):
            continue
        content = _sentence(text, m.end())
        named = _NAMED_RE.match(content) if content and not _ANSWER_LIKE_RE.match(content) else None
        if named:
            content = content[named.end():]
        if content and _ANSWER_LIKE_RE.match(content):
            yield m.start(), content, source


def final_answer(text: str, *, several: bool = False) -> Answer | None:
    """The final answer of ``text`` by the precedence rule of the module docstring; None when there is no
    answer statement. ``several``: the reference has several answers (read a run of boxes)."""
    boxes = [b for b in boxes_from_end(text, MAX_RUN if several else 2) if b[2]]
    for start, content, source in _sentences_from_end(text, boxes[0][1] if boxes else 0):
        return Answer(content, source, start)  # a sentence after the last box (not one holding it)
    if boxes:
        return Answer(_box_run(text, boxes) if several else boxes[0][2], "boxed", boxes[0][0])
    return None


_SOURCE_NAMES = {"boxed": "boxed", "sentence": "anchor", "####": "####"}


def read_gsm8k(text: str) -> tuple[Reading | None, str, str]:
    """The numeric final answer of GSM8K-style text: ``(reading, source, answer text)``. The answer is the
    last statement (:func:`final_answer`), read whole by :func:`oblr.grading.numbers.read_value`; without a
    statement, the last numeric expression of the text. ``source``: ``"####"``, ``"boxed"``, ``"anchor"``,
    ``"last_number"`` or ``"none"``."""
    ans = final_answer(text)
    if ans is not None:
        return read_value(ans.text), _SOURCE_NAMES[ans.source], ans.text
    r = last_value(text)
    if r is None:
        return None, "none", ""
    return r, "last_number", text[r.start:r.end]


def extract_gsm8k_number(text: str) -> tuple[Fraction | None, str]:
    """``(value, source)`` of :func:`read_gsm8k`; value None when nothing states a single number."""
    r, source, _ = read_gsm8k(text)
    return (r.value if r is not None else None), source
