"""Tool calling in the model's own format: definitions, calls, parsers and grammars per format
family (`formats.py`)."""

from .types import ParsedReply, ToolCall, ToolSpec

__all__ = ["ParsedReply", "ToolCall", "ToolSpec"]
