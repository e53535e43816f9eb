"""Mistral's `[TOOL_CALLS]` calls, in the three shapes its templates write:

- `mistral` (Mistral Small 3.2): `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`, one after another;
- `mistral-args` (Devstral Small 2507, Ministral 3): `[TOOL_CALLS]NAME[ARGS]{...}`, no id;
- `mistral-list` (Mistral Nemo): `[TOOL_CALLS][{"name": "NAME", "arguments": {...}, "id": "ID"}]`.

A call has no closing marker: it ends with its arguments' JSON (the reply then ends with the
end-of-sequence token, which the template writes after the calls and the grammar leaves to
the model). Ids are 9 letters and digits; the model writes them (the grammar makes it), and an
id of another shape (a call stored from a model of another family) is mapped to 9 hex digits
of its SHA-256, the same way for the call and for its result, because the templates refuse
any other id. The parser reads all three shapes whatever the template.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from .fmt_common import CUT_OFF, BaseFormat, Found, arguments_of, json_closings, read_json, trigger
from .fmt_gbnf import Rules, json_text, literal
from .types import ToolCall, ToolSpec

MARKER, CALL_ID, ARGS = "[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"
_ID = re.compile(r"[A-Za-z0-9]{9}")
_NAME = re.compile(r"[\w.\-]*")  # a tool's name (empty: cut off before it)
STYLES = ("mistral", "mistral-args", "mistral-list")
_LIST_OPEN = literal(MARKER + '[{"name": "')
_ID_KEY = literal(', "id": "')
_LIST_CLOSE = literal('"}]')


def mistral_id(call_id: str) -> str:
    """`call_id` if it is 9 alphanumerics, else 9 hex digits derived from it."""
    if _ID.fullmatch(call_id):
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


class MistralFormat(BaseFormat):
    def __init__(self, style: str) -> None:
        if style not in STYLES:
            raise ValueError(f"unknown Mistral call style {style!r}")
        self.name = style

    def template_id(self, call_id: str) -> str:
        return call_id if self.name == "mistral-args" else mistral_id(call_id)

    def render(self, call: ToolCall) -> str:
        args = json_text(dict(call.arguments))
        if self.name == "mistral":
            return f"{MARKER}{call.name}{CALL_ID}{self.template_id(call.id)}{ARGS}{args}"
        if self.name == "mistral-args":
            return f"{MARKER}{call.name}{ARGS}{args}"
        head = json_text({"name": call.name, "arguments": dict(call.arguments)})[:-1]
        return f'{MARKER}[{head}, "id": "{self.template_id(call.id)}"}}]'

    def _heads(self, tools: Sequence[ToolSpec]) -> list[str]:
        """The fixed text after the marker up to each tool's arguments."""
        if self.name == "mistral":
            return [f"{t.name}{CALL_ID}" for t in tools]
        if self.name == "mistral-args":
            return [f"{t.name}{ARGS}" for t in tools]
        return [f'[{{"name": "{t.name}", "arguments": ' for t in tools] or ['[{"name": "']

    def triggers(self, tools: Sequence[ToolSpec] = ()) -> list[str]:
        return [trigger(MARKER, self._heads(tools))]

    def grammar(self, tools: Sequence[ToolSpec]) -> str:
        rules = Rules()
        call_id = rules.add("call-id", "[A-Za-z0-9]{9}")
        alternatives = []
        for i, tool in enumerate(tools):
            args = rules.json_object(tool.parameters, f"t{i}-args")
            if self.name == "mistral":
                body = f"{literal(tool.name + CALL_ID)} {call_id} {literal(ARGS)} {args}"
            elif self.name == "mistral-args":
                body = f"{literal(tool.name + ARGS)} {args}"
            else:
                head = literal(tool.name + '", "arguments": ')
                body = f"{head} {args} {_ID_KEY} {call_id}"
            alternatives.append(rules.add(f"t{i}-{tool.name}", body))
        choice = f"({' | '.join(alternatives)})"
        if self.name == "mistral-list":
            rules.define("call", f"{_LIST_OPEN} {choice} {_LIST_CLOSE}")
        else:
            rules.define("call", f"{literal(MARKER)} {choice}")
        return rules.text()

    def scan(self, text: str, tools: Sequence[ToolSpec]) -> list[Found]:
        out: list[Found] = []
        pos = 0
        while (start := text.find(MARKER, pos)) >= 0:
            i = start + len(MARKER)
            found = self._list(text, start, i) if text.startswith("[", i) else self._named(text, start, i)
            out += found
            pos = max(found[-1].end, i) if found else i
        return out

    def _named(self, text: str, start: int, i: int) -> list[Found]:
        """`NAME[CALL_ID]ID[ARGS]{...}` or `NAME[ARGS]{...}`."""
        bracket = text.find("[", i)
        if bracket < 0:  # cut off in the name, or the marker's text in prose
            return [Found(start, len(text), error=CUT_OFF)] if _NAME.fullmatch(text[i:]) else []
        name, call_id = text[i:bracket], ""
        if not _NAME.fullmatch(name):
            return []  # not a call: the marker's text followed by something else
        j = bracket
        if text.startswith(CALL_ID, j):
            k = text.find("[", j + len(CALL_ID))
            if k < 0:
                return [Found(start, len(text), name, error=CUT_OFF)]
            call_id, j = text[j + len(CALL_ID) : k].strip(), k
        if not text.startswith(ARGS, j):
            if ARGS.startswith(text[j:]) or CALL_ID.startswith(text[j:]):
                return [Found(start, len(text), name, error=CUT_OFF)]
            end = text.find(MARKER, j)
            end = len(text) if end < 0 else end
            return [
                Found(
                    start,
                    end,
                    name,
                    id=call_id,
                    error=f"the call is malformed: {ARGS} expected after the name",
                )
            ]
        j += len(ARGS)
        while j < len(text) and text[j] in " \n":
            j += 1
        if j >= len(text):
            return [Found(start, len(text), name, id=call_id, error=CUT_OFF)]
        if text[j] != "{":
            end = text.find(MARKER, j)
            end = len(text) if end < 0 else end
            return [Found(start, end, name, id=call_id, error="the call's arguments are not a JSON object")]
        value, end, error = read_json(text, j)
        arguments, bad = arguments_of(value) if not error else (None, "")
        return [Found(start, end, name, arguments, call_id, error or bad)]

    def _list(self, text: str, start: int, i: int) -> list[Found]:
        """`[{"name": ..., "arguments": ..., "id": ...}, ...]`: one call per item; their texts
        cover the whole list (the first from the marker, the last to the closing bracket)."""
        value, end, error = read_json(text, i)
        if error:
            return [Found(start, end, error=error)]
        if not isinstance(value, list) or not value:
            return [Found(start, end, error="the calls are not a list of JSON objects")]
        items: list[Found] = []
        cut = start
        bounds = _item_ends(text, i, end)
        if len(bounds) < len(value) - 1:
            return [Found(start, end, error="the calls are not a list of JSON objects")]
        for n, item in enumerate(value):
            stop = end if n == len(value) - 1 else bounds[n]
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                items.append(Found(cut, stop, error='the call is not a JSON object with a "name"'))
            else:
                arguments, bad = arguments_of(item.get("arguments"))
                call_id = item["id"] if isinstance(item.get("id"), str) else ""
                items.append(Found(cut, stop, item["name"], arguments, call_id, bad))
            cut = stop
        return items


def _item_ends(text: str, open_at: int, close_end: int) -> list[int]:
    """Where each top-level item of the JSON list at `open_at` ends (after its last bracket)."""
    return [end for end, depth in json_closings(text, open_at, close_end) if depth == 1]
