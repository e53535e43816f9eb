"""Qwen3-Coder's XML calls (Qwen3-Coder, Qwen3.5 and the templates that copied them):

    <tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    </function>
    </tool_call>

A string value is written raw, anything else as JSON (`parameter|string` in the template,
`tojson` for mappings and lists). The template writes a boolean with Python's `str` ("True"),
so `call_dict` hands the template every value that is not a string as its JSON text already:
the template then writes what the grammar generates ("true"), and `parse` reads values back
by their schema (JSON for numbers, booleans, arrays, objects; the raw text for strings).
A value runs to the first "\\n</parameter>", in the template, the grammar and the parser alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .fmt_common import CUT_OFF, BaseFormat, Found, coerce, is_prefix_of_any, schema_of, trigger
from .fmt_gbnf import Rules, json_text, literal
from .types import ToolCall, ToolSpec

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, END_FUNCTION = "<function=", "</function>"
PARAMETER, END_VALUE = "<parameter=", "\n</parameter>"
_WS = " \t\r\n"


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json_text(value)


class XmlFormat(BaseFormat):
    name = "qwen3-coder-xml"

    def render(self, call: ToolCall) -> str:
        params = "".join(f"{PARAMETER}{k}>\n{_value_text(v)}{END_VALUE}\n" for k, v in call.arguments.items())
        return f"{OPEN}\n{FUNCTION}{call.name}>\n{params}{END_FUNCTION}\n{CLOSE}"

    def template_arguments(self, arguments: Mapping[str, Any]) -> Any:
        return {k: _value_text(v) for k, v in arguments.items()}

    def triggers(self, tools: Sequence[ToolSpec] = ()) -> list[str]:
        return [trigger(OPEN, [f"\n{FUNCTION}{t.name}>\n" for t in tools] or [f"\n{FUNCTION}"])]

    def grammar(self, tools: Sequence[ToolSpec]) -> str:
        rules = Rules()
        alternatives = []
        for i, tool in enumerate(tools):
            props = tool.parameters.get("properties")
            props = props if isinstance(props, Mapping) else {}
            required = set(tool.parameters.get("required") or ())
            members = []
            for pname, sub in props.items():
                value = self._value(rules, sub, f"t{i}-{pname}")
                expr = f"{literal(f'{PARAMETER}{pname}>' + chr(10))} {value} {literal(END_VALUE + chr(10))}"
                members.append((expr, pname in required))
            body = f"{literal(tool.name + '>' + chr(10))} {rules.members(members, f't{i}-param', '')}"
            alternatives.append(rules.add(f"t{i}-{tool.name}", body))
        opening, closing = literal(f"{OPEN}\n{FUNCTION}"), literal(f"{END_FUNCTION}\n{CLOSE}")
        rules.define("call", f"{opening} ({' | '.join(alternatives)}) {closing}")
        return rules.text()

    @staticmethod
    def _value(rules: Rules, schema: Any, hint: str) -> str:
        """A parameter's value: raw text for a string, JSON for anything else."""
        if not isinstance(schema, Mapping):
            return rules.text_until(END_VALUE, "xml-text")
        kind = schema.get("type")
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            return "(" + " | ".join(literal(v) for v in enum) + ")"
        if kind == "string" or kind is None or (isinstance(kind, list) and "string" in kind):
            return rules.text_until(END_VALUE, "xml-text")
        return rules.json_value(schema, hint)

    def scan(self, text: str, tools: Sequence[ToolSpec]) -> list[Found]:
        out: list[Found] = []
        pos = 0
        while (start := text.find(OPEN, pos)) >= 0:
            found = self._read(text, start, tools)
            if found is None:
                pos = start + len(OPEN)
                continue
            out.append(found)
            pos = found.end
        return out

    def _read(self, text: str, start: int, tools: Sequence[ToolSpec]) -> Found | None:
        i = _skip(text, start + len(OPEN))
        rest = text[i:]
        if not rest.startswith(FUNCTION):
            if FUNCTION.startswith(rest):
                return Found(start, len(text), error=CUT_OFF)
            close = text.find(CLOSE, i)
            if close < 0:
                return None  # a mention of the tag, not a call
            return Found(
                start,
                close + len(CLOSE),
                error=f"the call is not in this model's format ({FUNCTION}NAME> expected)",
            )
        j = text.find(">", i)
        if j < 0:
            return Found(start, len(text), error=CUT_OFF)
        name = text[i + len(FUNCTION) : j].strip()
        arguments: dict[str, Any] = {}
        k = j + 1
        while True:
            k = _skip(text, k)
            rest = text[k:]
            if rest.startswith(PARAMETER):
                pj = text.find(">", k)
                ve = text.find(END_VALUE, pj + 1) if pj >= 0 else -1
                if ve < 0:
                    ve = text.find("</parameter>", pj + 1) if pj >= 0 else -1
                    if ve < 0:
                        return Found(start, len(text), name, arguments, error=CUT_OFF)
                    end_value = ve + len("</parameter>")
                else:
                    end_value = ve + len(END_VALUE)
                pname = text[k + len(PARAMETER) : pj].strip()
                raw = text[pj + 1 : ve]
                raw = raw[1:] if raw.startswith("\n") else raw
                arguments[pname] = coerce(raw, schema_of(tools, name, pname))
                k = end_value
            elif rest.startswith(END_FUNCTION) or rest.startswith(CLOSE):
                if rest.startswith(END_FUNCTION):
                    k = _skip(text, k + len(END_FUNCTION))
                if text.startswith(CLOSE, k):
                    return Found(start, k + len(CLOSE), name, arguments)
                if CLOSE.startswith(text[k:]):
                    return Found(start, len(text), name, arguments, error=CUT_OFF)
                return self._broken(text, start, k, name, arguments)
            elif is_prefix_of_any(rest, (PARAMETER, END_FUNCTION, CLOSE)):
                return Found(start, len(text), name, arguments, error=CUT_OFF)
            else:
                return self._broken(text, start, k, name, arguments)

    @staticmethod
    def _broken(text: str, start: int, at: int, name: str, arguments: dict[str, Any]) -> Found:
        close = text.find(CLOSE, at)
        if close < 0:
            return Found(start, len(text), name, arguments, error=CUT_OFF)
        return Found(
            start,
            close + len(CLOSE),
            name,
            arguments,
            error=f"the call is malformed: {PARAMETER}NAME>, {END_FUNCTION} or {CLOSE} expected",
        )


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i
