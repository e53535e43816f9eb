"""A real engine whose tool turns make scripted calls: each `turn` that offers tools is forced to
write the next call of a script, exactly as the chat template writes it (`Diagnostics.turn` with
`forced_call`: a grammar whose root is the call's text), then end. Everything else (the model,
the prompt, the checkpoints, the resume, the parsing) is the engine's own, so a loop test that
needs particular calls (an edit to approve, a command to refuse) runs the real path on any model,
random weights included, with no dependence on what a random model happens to sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from velo_chat.engine import ToolCall
from velo_chat.engine.diagnostics import diagnostics
from velo_chat.engine.engine import Engine


class ScriptedCalls:
    """Wraps `engine`; turns with tools pop the next call of `calls` (a turn after the script
    ran out writes no call: the tools are offered with `tool_choice` "none")."""

    def __init__(self, engine: Engine, calls: Sequence[ToolCall]) -> None:
        self.engine = engine
        self.calls = list(calls)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def turn(self, messages, *, tools=(), tool_choice="auto", **kwargs):  # noqa: ANN001, ANN003
        if tools and self.calls:
            return diagnostics(self.engine).turn(
                messages, tools=tools, forced_call=self.calls.pop(0), **kwargs
            )
        return self.engine.turn(messages, tools=tools, tool_choice="none" if tools else tool_choice, **kwargs)
