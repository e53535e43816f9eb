"""What every tool-call format shares: checking arguments against a tool's schema, call ids,
lazy-grammar trigger patterns, and turning the calls found in a reply into a `ParsedReply`.

Parsing never raises: a call that names no declared tool, or whose arguments do not fit the
schema (a required one missing, a wrong type, one the tool does not take), comes back with
`error` set, and the app tells the model that error instead of running anything. A call that
was opened and never closed (the reply hit its token limit inside it) comes back with the
error `CUT_OFF`, so the model hears why nothing ran, rather than leaving half a call in the
reply's text; an opening marker that is not followed by what a call starts with ("<tool_call>
tags are...") is only text and stays in the content.

Ids: formats whose calls carry no id get `call_1`, `call_2`, ... in reply order (an id only has
to pair a result with its call within one reply); Mistral's templates need 9 alphanumerics,
which its models write themselves (`fmt_mistral.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .types import ParsedReply, ToolCall, ToolSpec

CUT_OFF = "the call was cut off before it closed"

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def sequential_id(index: int) -> str:
    """The id of the `index`-th call (0-based) of a reply, for formats that write none."""
    return f"call_{index + 1}"


@dataclass(frozen=True)
class Found:
    """A call located in a reply: its span and what was read from it."""

    start: int
    end: int
    name: str = ""
    arguments: Mapping[str, Any] | None = None
    id: str = ""
    error: str = ""  # a structural error ("not valid JSON", CUT_OFF); schema errors come later


def assemble(text: str, found: Sequence[Found], tools: Sequence[ToolSpec]) -> ParsedReply:
    """The reply with the found calls taken out (the text around them, stripped: templates
    write their own separator before a call) and the calls checked against `tools`."""
    if not found:
        return ParsedReply(text)
    pieces, pos, calls = [], 0, []
    for i, f in enumerate(found):
        pieces.append(text[pos : f.start])
        pos = f.end
        arguments = dict(f.arguments or {})
        error = f.error or check_call(f.name, arguments, tools)
        calls.append(ToolCall(f.name, arguments, f.id or sequential_id(i), text[f.start : f.end], error))
    pieces.append(text[pos:])
    return ParsedReply("".join(pieces).strip(), tuple(calls))


# -- arguments --------------------------------------------------------------------------------


def check_call(name: str, arguments: Mapping[str, Any], tools: Sequence[ToolSpec]) -> str:
    """Why this is not a valid call of one of `tools` ("" when it is)."""
    tool = next((t for t in tools if t.name == name), None)
    if tool is None:
        offered = ", ".join(t.name for t in tools) or "none"
        return f"there is no tool named {name!r} (the tools are: {offered})"
    return _check(arguments, tool.parameters, f"{name}'s arguments")


def _type_name(value: Any) -> str:
    for name, types in (("boolean", (bool,)), *_PY_TYPES.items()):
        if isinstance(value, types):
            return name
    return "null" if value is None else type(value).__name__


def _fits_type(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if isinstance(value, bool) and kind != "boolean":
        return False
    return isinstance(value, _PY_TYPES.get(kind, (object,)))


def _check(value: Any, schema: Any, where: str) -> str:
    """Why `value` does not fit `schema` ("" when it does): the parts of JSON schema that tool
    definitions use (type, enum, const, anyOf/oneOf, properties, required, items)."""
    if not isinstance(schema, Mapping):
        return ""
    if "const" in schema and value != schema["const"]:
        return f"{where} must be {json.dumps(schema['const'])}"
    if isinstance(schema.get("enum"), list) and value not in schema["enum"]:
        options = ", ".join(json.dumps(v) for v in schema["enum"])
        return f"{where} must be one of {options}, not {json.dumps(value)}"
    for key in ("anyOf", "oneOf"):
        shapes = schema.get(key)
        if isinstance(shapes, list) and shapes and all(_check(value, o, where) for o in shapes):
            return f"{where} fits none of the allowed shapes"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else []
    if kinds and not any(_fits_type(value, k) for k in kinds):
        return f"{where} should be {' or '.join(kinds)}, not {_type_name(value)}"
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            error = _check(item, schema["items"], f"{where}[{i}]")
            if error:
                return error
    if isinstance(value, dict) and (kind == "object" or "properties" in schema):
        return _check_object(value, schema, where)
    return ""


def _check_object(value: Mapping[str, Any], schema: Mapping[str, Any], where: str) -> str:
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    for name in schema.get("required") or ():
        if name not in value:
            return f"{where}: the required argument {name!r} is missing"
    extra = schema.get("additionalProperties")
    # declared properties and no say on others: only those (an empty list: no arguments)
    strict = extra is False or (extra is None and "properties" in schema)
    for name, item in value.items():
        if name in props:
            error = _check(item, props[name], f"argument {name!r}")
        elif strict:
            takes = ", ".join(props) or "no arguments"
            error = f"{where}: unknown argument {name!r} (it takes: {takes})"
        else:
            error = _check(item, extra, f"argument {name!r}")
        if error:
            return error
    return ""


def schema_of(tools: Sequence[ToolSpec], name: str, parameter: str) -> Mapping[str, Any] | None:
    """The schema of one parameter of one tool (None when either is not declared)."""
    tool = next((t for t in tools if t.name == name), None)
    props = tool.parameters.get("properties") if tool else None
    sub = props.get(parameter) if isinstance(props, Mapping) else None
    return sub if isinstance(sub, Mapping) else None


def coerce(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """A value written as raw text (XML parameters) as its schema reads it: JSON for numbers,
    booleans, arrays, objects and null; the text itself for strings and for anything that
    does not parse (the schema check then says what is wrong)."""
    if schema is None:
        return raw
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else []
    if kinds == ["string"] or (not kinds and all(isinstance(v, str) for v in schema.get("enum") or [0])):
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        if "boolean" in kinds and raw.strip() in ("True", "False"):  # Python's str() of a bool
            return raw.strip() == "True"
        return raw
    if "string" in kinds and _check(value, {**schema, "type": [k for k in kinds if k != "string"]}, "x"):
        return raw
    return value


# -- scanning ---------------------------------------------------------------------------------


def json_closings(text: str, start: int, stop: int | None = None) -> Iterator[tuple[int, int]]:
    """`(end, depth)` after each closing bracket of the JSON value that opens at `start`, by
    its brackets (strings and escapes skipped): `end` just past the bracket, `depth` what is
    still open. Stops at `stop` (the text's end by default)."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text) if stop is None else stop):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            yield i + 1, depth


def json_end(text: str, start: int) -> int | None:
    """The end of the JSON object or array that opens at `start`; None when the text ends
    first (the value was cut off)."""
    return next((end for end, depth in json_closings(text, start) if depth == 0), None)


def read_json(text: str, start: int) -> tuple[Any, int, str]:
    """`(value, end, error)` for the JSON object or array opening at `start`; when the text
    ends inside it, `end` is the end of the text and `error` is `CUT_OFF`."""
    end = json_end(text, start)
    if end is None:
        return None, len(text), CUT_OFF
    try:
        return json.loads(text[start:end]), end, ""
    except ValueError as exc:
        return None, end, f"the call's arguments are not valid JSON ({exc})"


def arguments_of(value: Any) -> tuple[Mapping[str, Any] | None, str]:
    """Arguments as a mapping, from an object or a JSON string of one (some models write
    the arguments as a string)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None, "the call's arguments are not a JSON object"
    if value is None:
        return {}, ""
    if not isinstance(value, dict):
        return None, "the call's arguments are not a JSON object"
    return value, ""


def is_prefix_of_any(text: str, starts: Sequence[str]) -> bool:
    """Whether `text` begins like one of `starts` (or is a beginning of one)."""
    return any(text.startswith(s) or s.startswith(text) for s in starts)


# -- trigger patterns -------------------------------------------------------------------------


def regex_escape(text: str) -> str:
    """`text` as an ECMAScript regex matching itself (what llama.cpp's std::regex reads)."""
    out = []
    for ch in text:
        if ch in "\\^$.|?*+()[]{}/":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        else:
            out.append(ch)
    return "".join(out)


def _prefixes(text: str) -> str:
    """A regex matching any beginning of `text` (the empty one too)."""
    out = ""
    for ch in reversed(text):
        out = f"(?:{regex_escape(ch)}{out})?"
    return out


def trigger(marker: str, continuations: Sequence[str], before: str = "") -> str:
    """A lazy-grammar trigger: `marker` (captured: the call starts there), then any beginning
    of one of `continuations`, up to the end of the text generated so far.

    Anchored at the end on purpose: llama.cpp replays the text from the capture to the end of
    the last token through the grammar, and a token that runs past what a call can say at that
    point would make the grammar reject text already accepted, which llama.cpp does not
    survive (it throws through its C API and the process aborts). Where a token runs past the
    call's fixed text, the trigger does not fire and that call is not constrained (it is still
    parsed)."""
    conts = sorted({_prefixes(c) for c in continuations if c})
    tail = f"(?:{'|'.join(conts)})" if conts else ""
    return f"{before}({regex_escape(marker)}){tail}$"


# -- the shared shape of a format -------------------------------------------------------------


class BaseFormat:
    """What the formats share; each writes `render`, `scan`, `grammar` and `triggers`."""

    name = ""

    def render(self, call: ToolCall) -> str:
        """The call's text exactly as the template writes it and the grammar's `call` rule
        generates it (the template may add its own separators and end-of-turn token)."""
        raise NotImplementedError

    def scan(self, text: str, tools: Sequence[ToolSpec]) -> list[Found]:
        """The calls in `text`, in order (cut-off and malformed ones included)."""
        raise NotImplementedError

    def triggers(self, tools: Sequence[ToolSpec] = ()) -> list[str]:
        raise NotImplementedError

    def grammar(self, tools: Sequence[ToolSpec]) -> str:
        raise NotImplementedError

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedReply:
        return assemble(text, self.scan(text, tools), tools)

    def open_call(self, text: str) -> bool:
        found = self.scan(text, ())
        return bool(found) and found[-1].error == CUT_OFF

    def template_id(self, call_id: str) -> str:
        """The id as the template needs it (Mistral: 9 alphanumerics)."""
        return call_id

    def template_arguments(self, arguments: Mapping[str, Any]) -> Any:
        """The arguments as the template reads them (a mapping: templates apply `tojson`)."""
        return dict(arguments)

    def call_dict(self, call: ToolCall) -> dict[str, Any]:
        """OpenAI's shape, as HF templates read `tool_calls` (the function's keys in the order
        name, arguments: a template that writes `function|tojson` depends on it)."""
        return {
            "id": self.template_id(call.id),
            "type": "function",
            "function": {"name": call.name, "arguments": self.template_arguments(call.arguments)},
        }
