"""The tools a turn offers, as the engine carries them through the turn: the definitions (the
template's `tools` variable), the model's call format, and the grammar that constrains a call.

Built once per turn by `Engine.turn` (`tool_offer`); the turn runner reads it to sample under the
grammar, to hold the thinking budget while a call is open, and to parse the calls at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..errors import ChatTemplateError
from .formats import ToolFormat, detect_format
from .grammar import Grammar, tool_grammar
from .types import ParsedReply, ToolCall, ToolSpec

CHOICES: Final = ("auto", "required", "none")


@dataclass(frozen=True)
class ToolOffer:
    """What one turn offers the model."""

    specs: tuple[ToolSpec, ...]
    format: ToolFormat
    choice: str  # "auto", "required" or "none" (profile `tools.choice`)
    grammar: Grammar | None  # None: unconstrained (choice "none")

    def variables(self) -> dict[str, Any]:
        """The template variables that put the definitions into the prompt."""
        return {"tools": tool_variable(self.specs)}

    def open_call(self, text: str) -> bool:
        """Whether the reply so far (`text`, special tokens as text) is inside an open call."""
        return self.choice != "none" and self.format.open_call(text)

    def parse(self, raw: str, answer: str, reasoning: str) -> tuple[str, str, tuple[ToolCall, ...]]:
        """The reply's answer and reasoning with the calls taken out, and the calls (found in the
        raw text, so a call a model opened inside its reasoning counts). No calls: the answer and
        the reasoning as they were."""
        if self.choice == "none":
            return answer, reasoning, ()
        calls = self.format.parse(raw, self.specs).calls
        if not calls:
            return answer, reasoning, ()
        return (
            _without_calls(self.format.parse(answer, self.specs)),
            _without_calls(self.format.parse(reasoning, self.specs)),
            calls,
        )


def _without_calls(parsed: ParsedReply) -> str:
    return parsed.content


def tool_variable(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [s.template_dict() for s in specs]


def tool_offer(
    template_source: str | None,
    specs: Sequence[ToolSpec],
    choice: str,
    *,
    model_name: str,
    reasoning_close: str = "",
) -> ToolOffer | None:
    """The offer for a turn with `specs` (None when there are none). A template that renders no
    tools refuses them in one line (`ChatTemplateError`), rather than the model never seeing them.
    `reasoning_close`: the reasoning block's closing marker when the turn opens inside one (a
    required call is constrained from where the reasoning ends)."""
    if not specs:
        return None
    if choice not in CHOICES:
        raise ValueError(f"tools.choice must be one of {', '.join(CHOICES)}, not {choice!r}")
    fmt = detect_format(template_source or "")
    if fmt is None:
        raise ChatTemplateError(
            f"{model_name}: its chat template has no tool support (a format velo-chat reads); "
            "turn tools off ([tools] enabled = false) or use a model whose template has tools"
        )
    specs = tuple(specs)
    grammar = tool_grammar(fmt, specs, choice, after=reasoning_close if choice == "required" else "")
    return ToolOffer(specs, fmt, choice, grammar)
