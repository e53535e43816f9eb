"""The grammar a turn samples under when tools are offered: one call, in the model's own format,
of a declared tool with only its parameters (`formats.py` writes the `call` rule).

- `choice="auto"`: lazy. The model writes freely until the text ends with the opening of a
  call (the format's trigger patterns); from there llama.cpp keeps it to `call`, and once the
  call is complete only an end-of-generation token may follow (one call per step: the app
  runs it and starts the next step).
- `choice="required"`: `call` from the first token.
- `after` (a required call in a turn that opens inside a reasoning block, e.g. "</think>"):
  lazy; the reasoning runs free, and its closing marker starts `after`, up to 4 blanks, then
  the call. A call the model opens inside the reasoning (Qwen does) triggers `call` as under
  "auto" and satisfies the turn too.

The grammar's text is built to be what the template writes (`fmt_gbnf.py`), so a constrained
call re-renders token for token in the next step's prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .fmt_common import regex_escape
from .fmt_gbnf import literal
from .types import ToolSpec

if TYPE_CHECKING:
    from .formats import ToolFormat

CHOICES = ("none", "auto", "required")
REASONING_GAP = "[ \\t\\n]{0,4}"  # between the reasoning's closing marker and the call


@dataclass(frozen=True)
class Grammar:
    """A grammar for llama.cpp's grammar sampler (`Sampler(grammar=...)`)."""

    gbnf: str
    """The full grammar, with its `root` rule."""
    triggers: tuple[str, ...] = ()
    """Lazy grammar: regex patterns (llama.cpp's std::regex, ECMAScript) that start the
    constraint where their first capture group starts; () = constrained from the first token."""

    @property
    def lazy(self) -> bool:
        return bool(self.triggers)


def tool_grammar(
    fmt: ToolFormat, tools: Sequence[ToolSpec], choice: str, *, after: str = ""
) -> Grammar | None:
    """The grammar for a step where `tools` are offered in `fmt` under `choice` ("none",
    "auto", "required"); None when nothing is constrained ("none", or no tools)."""
    if choice not in CHOICES:
        raise ValueError(f"tool choice must be one of {', '.join(CHOICES)}, not {choice!r}")
    if choice == "none" or not tools:
        return None
    rules = fmt.grammar(tools)
    if choice == "auto":
        return Grammar(f"root ::= call\n{rules}", tuple(fmt.triggers(tools)))
    if not after:
        return Grammar(f"root ::= call\n{rules}")
    root = f"root ::= {literal(after)} reasoning-gap call | call\nreasoning-gap ::= {REASONING_GAP}\n"
    closing = f"({regex_escape(after)}){REASONING_GAP}$"  # the same text reads as a regex
    return Grammar(root + rules, (closing, *fmt.triggers(tools)))


def check_patterns(patterns: Sequence[str]) -> None:
    """Raise ValueError for a pattern that does not compile. llama.cpp compiles them with
    std::regex, whose error is an exception it does not catch (the process aborts); the
    patterns velo-chat writes use only what Python's `re` and ECMAScript read alike, so
    Python's compiler stands in for it."""
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"grammar trigger pattern {pattern!r} does not compile: {exc}") from None
