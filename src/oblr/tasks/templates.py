"""Prompt templates for math tasks: base-model style, chat style, or the raw question.

The instruction depends on the grading kind:

- ``math``:  "Please reason step by step, and put your final answer within \\boxed{}."
- ``gsm8k``: "Solve the problem step by step. Write the final answer as a number on the last line, in the
  form '#### <number>'."

Styles (``template=``):

- ``"base"``: plain text for a base model: ``"Question: {question}\\n{instruction}\\nAnswer:"``... (see
  :data:`BASE_FORMAT`); the model continues after "Answer:".
- ``"chat"``: one user turn ``"{question}\\n{instruction}"`` rendered by the tokenizer's chat template with
  the generation prompt (``apply_chat_template(..., add_generation_prompt=True)``). A tokenizer without a
  chat template (or no tokenizer) falls back to :data:`PLAIN_CHAT_FORMAT`, with a warning.
- ``"auto"``: ``"chat"`` if the tokenizer has a chat template, else ``"base"``.
- ``"raw"``: the question alone.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

INSTRUCTIONS = {
    "math": "Please reason step by step, and put your final answer within \\boxed{}.",
    "gsm8k": "Solve the problem step by step. Write the final answer as a number on the last line, "
             "in the form '#### <number>'.",
}
TEMPLATES = ("auto", "base", "chat", "raw")
BASE_FORMAT = "Question: {question}\n{instruction}\nAnswer:"
PLAIN_CHAT_FORMAT = "User: {content}\nAssistant:"


def has_chat_template(tokenizer: Any) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def resolve_template(template: str, tokenizer: Any = None) -> str:
    """``"auto"`` -> ``"chat"`` or ``"base"``; other names checked and returned."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; known: {', '.join(TEMPLATES)}")
    if template == "auto":
        return "chat" if has_chat_template(tokenizer) else "base"
    return template


_warned_no_chat = False
_quiet_fallback = 0


@contextmanager
def no_fallback_warning() -> Iterator[None]:
    """Inside, a chat prompt rendered without a chat template gives no warning and does not count as warned:
    for prompts that are thrown away, like the trainer's data check before the model's tokenizer loads."""
    global _quiet_fallback
    _quiet_fallback += 1
    try:
        yield
    finally:
        _quiet_fallback -= 1


def render_prompt(question: str, *, kind: str = "math", template: str = "auto", tokenizer: Any = None,
                  system: str | None = None) -> str:
    """The exact text fed to the model for ``question``.

    ``kind``: ``"math"`` or ``"gsm8k"`` (picks the instruction). ``system``: an optional system message
    (chat style only).
    """
    if kind not in INSTRUCTIONS:
        raise ValueError(f"unknown prompt kind {kind!r}; known: {', '.join(INSTRUCTIONS)}")
    style = resolve_template(template, tokenizer)
    instruction = INSTRUCTIONS[kind]
    if style == "raw":
        return question
    if style == "base":
        return BASE_FORMAT.format(question=question, instruction=instruction)
    return chat_prompt(f"{question}\n{instruction}", tokenizer=tokenizer, system=system)


def chat_prompt(content: str, *, tokenizer: Any = None, system: str | None = None) -> str:
    """One user turn ``content`` (after an optional ``system`` message) rendered by the tokenizer's chat template
    with the generation prompt; a tokenizer without a chat template (or none) gives :data:`PLAIN_CHAT_FORMAT`,
    with a warning (once per process)."""
    global _warned_no_chat
    if not has_chat_template(tokenizer):
        if not _warned_no_chat and not _quiet_fallback:
            warnings.warn("template 'chat' asked but the tokenizer has no chat template; using the plain "
                          f"format {PLAIN_CHAT_FORMAT!r}", RuntimeWarning, stacklevel=3)
            _warned_no_chat = True
        text = PLAIN_CHAT_FORMAT.format(content=content)
        return f"{system}\n{text}" if system else text
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    out = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(out, str):
        raise TypeError(f"tokenizer.apply_chat_template returned {type(out).__name__}, expected str")
    return out
