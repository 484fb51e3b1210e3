"""Generated sections of a markdown document: :func:`splice` puts a block between a begin and an end marker.

The results scripts (``lr_sensitivity.py``, ``task_claims.py``, ``paper_regime.py``) each write one section
of ``docs/results.md`` this way: the block replaces the text between its markers when they are there, and
the first time it goes before the document's ``## Reading`` heading (or at its end). The rest of the document
is left byte for byte as it was.
"""

from __future__ import annotations

from pathlib import Path


def splice(doc: Path, begin: str, end: str, body: str) -> None:
    """Write ``begin``, ``body`` and ``end`` into ``doc`` (module docstring)."""
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = doc.read_text(encoding="utf-8")
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    elif "\n## Reading\n" in text:
        i = text.index("\n## Reading\n") + 1
        text = text[:i] + block + "\n\n" + text[i:]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text, encoding="utf-8")
