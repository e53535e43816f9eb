"""What the engine knows of tools: their definitions, the calls a model makes, a reply parsed.

The engine speaks the model's own format (rendering the definitions through the chat template's
`tools` variable, parsing calls, constraining an opened call with a grammar: `formats.py`); the
app decides what a call does (`velo_chat.app.tools`). These types are what passes between them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolSpec:
    """One tool the model is offered: its name, what it does, and its arguments as a JSON schema
    of an object (`{"type": "object", "properties": {...}, "required": [...]}`)."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def template_dict(self) -> dict[str, Any]:
        """The definition as chat templates read it (OpenAI's function tool, as HF passes it)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: the tool's name and its arguments, with the call's text exactly as
    generated (`text`, so the session can show and store it as it was). `error` says why the
    call is not a well-formed call of a declared tool ("" when it is): the app sends that back
    to the model as the tool's error rather than running anything."""

    name: str
    arguments: Mapping[str, Any]
    id: str = ""
    text: str = ""
    error: str = ""


@dataclass(frozen=True)
class ParsedReply:
    """A reply with its tool calls taken out: `content` is the text the model wrote around them."""

    content: str
    calls: tuple[ToolCall, ...] = ()
