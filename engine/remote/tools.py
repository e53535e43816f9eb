"""Tools over the OpenAI chat API: the request's `tools`, `tool_choice` and messages, and the
calls a streamed reply makes.

A server speaks tools in the API's own shape, not the model's: it renders the definitions
through its chat template and parses the model's calls itself (llama-server with `--jinja`,
vLLM with a tool-call parser). So nothing here knows a model's format; a call arrives as
`delta.tool_calls` fragments, keyed by `index`, whose `function.arguments` is a JSON string
cut anywhere. A server that leaves a call in the content (no parser for the model) gives text,
which stays text: reading a model's own format is the in-process engine's job.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..prompt.chat_template import ChatMessage
from ..tools.types import ToolCall, ToolSpec

TOOL_CHOICES: Final = ("auto", "required", "none")
CUT: Final = "the reply stopped before this call was complete"


def tool_fields(tools: Sequence[ToolSpec], choice: str) -> dict[str, Any]:
    """The request's `tools` and `tool_choice` (nothing when no tools are offered, so a server
    without tool support sees the request it always saw)."""
    if not tools:
        return {}
    if choice not in TOOL_CHOICES:
        raise ValueError(f"tools.choice must be one of {', '.join(TOOL_CHOICES)}, not {choice!r}")
    return {"tools": [spec.template_dict() for spec in tools], "tool_choice": choice}


def message_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The conversation as chat-completions messages. An assistant step's calls go as
    `tool_calls` with its text (possibly "") as `content`: llama-server refuses a null content,
    and "" is what every server accepts. A tool result goes as role "tool" with the id of the
    call it answers. Calls stored without an id (a model whose format has none) get one made up
    from their place, and the results after them take those ids in order, so the server can
    pair them."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # ids of the last assistant step's calls not yet answered
    for i, m in enumerate(messages):
        entry: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.role == "assistant":
            if m.reasoning_content:
                entry["reasoning_content"] = m.reasoning_content
            if m.tool_calls:
                ids = [call.id or f"call_{i}_{k}" for k, call in enumerate(m.tool_calls)]
                entry["tool_calls"] = [
                    _call_dict(call, id_) for call, id_ in zip(m.tool_calls, ids, strict=True)
                ]
                pending = ids
            else:
                pending = []
        elif m.role == "tool":
            call_id = m.tool_call_id or (pending[0] if pending else "")
            if call_id in pending:
                pending.remove(call_id)
            entry["tool_call_id"] = call_id
            if m.name:
                entry["name"] = m.name
        out.append(entry)
    return out


def _call_dict(call: ToolCall, call_id: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments_json(call)},
    }


def arguments_json(call: ToolCall) -> str:
    """The call's arguments as the JSON string the API carries: its text as the model wrote it
    when that is those arguments (a call that came from a server), so the server renders the
    step back as it was generated and its prompt cache still matches; else compact JSON."""
    if call.text:
        try:
            if json.loads(call.text) == dict(call.arguments):
                return call.text
        except ValueError:
            pass
    return json.dumps(dict(call.arguments), ensure_ascii=False, separators=(",", ":"))


@dataclass
class _Slot:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ToolCallStream:
    """The calls of a streamed reply, put together from their `delta.tool_calls` fragments."""

    def __init__(self) -> None:
        self._slots: dict[int, _Slot] = {}
        self.n_fragments = 0
        self.t_first: float | None = None  # when the first fragment came
        self.t_last: float | None = None

    def feed(self, fragments: Any, now: float | None = None) -> None:
        """One delta's `tool_calls`. A fragment without an `index` (some servers send each call
        whole) continues the last call unless it brings a new id."""
        if not isinstance(fragments, Sequence) or isinstance(fragments, (str, bytes)):
            return
        now = time.perf_counter() if now is None else now
        for frag in fragments:
            if not isinstance(frag, Mapping):
                continue
            index = frag.get("index")
            if not isinstance(index, int):
                known = {s.id for s in self._slots.values()}
                fresh = bool(frag.get("id")) and frag.get("id") not in known
                index = len(self._slots) if fresh or not self._slots else max(self._slots)
            slot = self._slots.setdefault(index, _Slot())
            if frag.get("id"):
                slot.id = str(frag["id"])
            function = frag.get("function") or {}
            if isinstance(function, Mapping):
                name = str(function.get("name") or "")
                if name and name != slot.name:  # sent once; a server that repeats it adds nothing
                    slot.name += name
                piece = function.get("arguments")
                if isinstance(piece, Mapping):  # a server that sends the object, not its JSON
                    piece = json.dumps(piece, ensure_ascii=False, separators=(",", ":"))
                if isinstance(piece, str) and piece:
                    slot.arguments.append(piece)
            self.n_fragments += 1
            self.t_first = now if self.t_first is None else self.t_first
            self.t_last = now

    def __bool__(self) -> bool:
        return bool(self._slots)

    def calls(self, offered: Sequence[ToolSpec] = (), *, complete: bool = True) -> tuple[ToolCall, ...]:
        """The calls in their order. `error` says why one cannot run: no name, a tool that was
        not offered, arguments that are not a JSON object, or (`complete` false: the stream was
        cut or cancelled before the server said it finished) a call that may be missing its end."""
        names = {spec.name for spec in offered}
        out = []
        for _index, slot in sorted(self._slots.items()):
            text = "".join(slot.arguments)
            arguments, error = _parse_arguments(text)
            if not slot.name:
                error = "the call names no tool"
            elif slot.name not in names:
                error = f"no tool named {slot.name!r} was offered"
            if not complete:
                error = CUT
            out.append(ToolCall(slot.name, arguments, id=slot.id, text=text, error=error))
        return tuple(out)


def _parse_arguments(text: str) -> tuple[dict[str, Any], str]:
    """The arguments and "" (or {} and why not). No text at all is no arguments: a tool that
    takes none, as some servers stream it."""
    if not text.strip():
        return {}, ""
    try:
        value = json.loads(text)
    except ValueError as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        return {}, f"the arguments are not valid JSON: {reason}"
    if not isinstance(value, dict):
        return {}, f"the arguments are not a JSON object (got {type(value).__name__})"
    return value, ""
