"""Tool-call formats, one per family of chat templates: how a model of that family writes a call,
how to read it back, and a grammar that admits only a well-formed call to a declared tool.

(Interface fixed first; the families are filled in by `formats/`-style classes below.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .types import ParsedReply, ToolCall, ToolSpec


class ToolFormat(Protocol):
    """One family's way of writing calls."""

    name: str
    """A short name shown to users and in stats ("qwen3-coder-xml", "hermes", "llama3-json",
    "mistral", "gpt-oss")."""

    def triggers(self) -> list[str]:
        """Regular expressions (std::regex ECMAScript, as llama.cpp's lazy grammar reads them)
        that match the text where a call opens; the first capture group marks where the call
        (the grammar's `call` rule) starts. They must match inside an unclosed think block too."""
        ...

    def grammar(self, tools: Sequence[ToolSpec]) -> str:
        """GBNF rules with a rule named `call`: exactly one complete call of one of `tools`, from
        its opening marker to its closing one, written as the template renders a call (so the
        generated text renders back token for token). Defines no `root` (the engine adds it)."""
        ...

    def open_call(self, text: str) -> bool:
        """Whether `text` (a reply so far, special tokens as text) ends inside a call that was
        opened and not yet closed."""
        ...

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedReply:
        """The calls in `text` (a whole reply, special tokens as text; calls inside a think block
        count), each with its text as generated, and the text around them. A call that names an
        unknown tool or has arguments that do not fit its schema is returned with `error` set;
        text that only looks like a call is left in the content."""
        ...

    def call_dict(self, call: ToolCall) -> dict[str, Any]:
        """The call as the template reads it in an assistant message's `tool_calls`."""
        ...


def detect_format(template_source: str) -> ToolFormat | None:
    """The format of a chat template, or None when it does not render tools (no `tools` variable
    used, or a family velo-chat does not know)."""
    raise NotImplementedError
