"""Calls written as one JSON object: Hermes (Qwen2.5, Qwen3, QwQ, Hermes 2 Pro / 3 tool_use)

    <tool_call>
    {"name": "NAME", "arguments": {...}}
    </tool_call>

and Llama 3.1 / 3.2 / 3.3 with custom tools, where the whole reply is the call:

    {"name": "NAME", "parameters": {...}}

The object is written as the templates write it: `{"name": "` + name + `", "arguments": ` +
`arguments|tojson` + `}`. Parsing is lenient where it costs nothing: either key for the
arguments, arguments given as a JSON string, a missing `</tool_call>` after a complete object,
Llama's `<|python_tag|>` before the object.
"""

from __future__ import annotations

from collections.abc import Sequence

from .fmt_common import (
    CUT_OFF,
    BaseFormat,
    Found,
    arguments_of,
    is_prefix_of_any,
    read_json,
    trigger,
)
from .fmt_gbnf import Rules, json_text, literal
from .types import ToolCall, ToolSpec

_WS = " \t\r\n"


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _call_object(value: object, key: str) -> Found | str:
    """The name and arguments of a parsed call object, or why it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return 'the call is not a JSON object with a "name"'
    raw = value.get(key, value.get("arguments", value.get("parameters")))
    arguments, error = arguments_of(raw)
    return Found(0, 0, value["name"], arguments, error=error)


def _json_call_rules(tools: Sequence[ToolSpec], key: str) -> tuple[Rules, list[str]]:
    """The rules of `NAME", "KEY": {arguments}` for each tool (what follows `{"name": "`)."""
    rules = Rules()
    alternatives = []
    for i, tool in enumerate(tools):
        args = rules.json_object(tool.parameters, f"t{i}-args")
        head = literal(tool.name + '", "' + key + '": ')
        alternatives.append(rules.add(f"t{i}-{tool.name}", f"{head} {args}"))
    return rules, alternatives


class HermesFormat(BaseFormat):
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def render(self, call: ToolCall) -> str:
        body = f'{{"name": "{call.name}", "arguments": {json_text(dict(call.arguments))}}}'
        return f"{self.OPEN}\n{body}\n{self.CLOSE}"

    def triggers(self, tools: Sequence[ToolSpec] = ()) -> list[str]:
        conts = [f'\n{{"name": "{t.name}", "arguments": ' for t in tools] or ['\n{"name": "']
        return [trigger(self.OPEN, conts)]

    def grammar(self, tools: Sequence[ToolSpec]) -> str:
        rules, alternatives = _json_call_rules(tools, "arguments")
        opening, closing = literal(f'{self.OPEN}\n{{"name": "'), literal(f"}}\n{self.CLOSE}")
        rules.define("call", f"{opening} ({' | '.join(alternatives)}) {closing}")
        return rules.text()

    def scan(self, text: str, tools: Sequence[ToolSpec]) -> list[Found]:
        out: list[Found] = []
        pos = 0
        while (start := text.find(self.OPEN, pos)) >= 0:
            found = self._read(text, start)
            if found is None:
                pos = start + len(self.OPEN)
                continue
            out.append(found)
            pos = found.end
        return out

    def _read(self, text: str, start: int) -> Found | None:
        i = _skip(text, start + len(self.OPEN))
        if i >= len(text):
            return Found(start, len(text), error=CUT_OFF)
        if text[i] != "{":
            close = text.find(self.CLOSE, i)
            if close < 0:
                return None  # a mention of the tag, not a call
            return Found(start, close + len(self.CLOSE), error="the call is not a JSON object")
        value, end, error = read_json(text, i)
        if error == CUT_OFF:
            return Found(start, len(text), error=CUT_OFF)
        j = _skip(text, end)
        if text.startswith(self.CLOSE, j):
            end = j + len(self.CLOSE)
        elif j >= len(text) or self.CLOSE.startswith(text[j:]):
            return Found(start, len(text), error=CUT_OFF)
        if error:
            close = text.find(self.CLOSE, i)
            return Found(start, close + len(self.CLOSE) if close >= 0 else end, error=error)
        call = _call_object(value, "arguments")
        if isinstance(call, str):
            return Found(start, end, error=call)
        return Found(start, end, call.name, call.arguments, error=call.error)


class Llama3Format(BaseFormat):
    name = "llama3-json"
    TAG = "<|python_tag|>"

    def render(self, call: ToolCall) -> str:
        return f'{{"name": "{call.name}", "parameters": {json_text(dict(call.arguments))}}}'

    def triggers(self, tools: Sequence[ToolSpec] = ()) -> list[str]:
        conts = [f'"name": "{t.name}", "parameters": ' for t in tools] or ['"name": "']
        return [trigger("{", conts, before=r"^\s*(?:<\|python_tag\|>)?")]

    def grammar(self, tools: Sequence[ToolSpec]) -> str:
        rules, alternatives = _json_call_rules(tools, "parameters")
        opening = literal('{"name": "')
        rules.define("call", f"{opening} ({' | '.join(alternatives)}) {literal('}')}")
        return rules.text()

    def scan(self, text: str, tools: Sequence[ToolSpec]) -> list[Found]:
        """One call, at the start of the reply (Llama's templates hold one call per message)."""
        start = _skip(text, 0)
        i = _skip(text, start + len(self.TAG)) if text.startswith(self.TAG, start) else start
        if i >= len(text) or text[i] != "{":
            return [Found(start, len(text), error=CUT_OFF)] if i >= len(text) and i > start else []
        value, end, error = read_json(text, i)
        if error == CUT_OFF:
            head = text[_skip(text, i + 1) :]
            return [Found(start, len(text), error=CUT_OFF)] if is_prefix_of_any(head, ['"name"']) else []
        if error:
            return [Found(start, end, error=error)] if '"name"' in text[i:end] else []
        call = _call_object(value, "parameters")
        if isinstance(call, str):
            return []  # a JSON answer, not a call
        return [Found(start, end, call.name, call.arguments, error=call.error)]
