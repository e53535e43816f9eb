"""GBNF building blocks for the tool-call grammars: literals, canonical JSON from a JSON schema,
and text that stops short of a closing marker.

The JSON is the text chat templates write with `tojson` (`json.dumps` with `", "` and `": "`
separators, no other whitespace, `ensure_ascii=False`), not JSON in general: a call written
under the grammar parses to arguments that the template writes back character for character,
so the tokens of the call are the tokens the next turn's prompt holds. Properties come in the
schema's order, the required ones always, the others optional. `json_schema_to_gbnf` from
llama-cpp-python allows free whitespace between tokens, which would break that round trip.

Rule names are letters, digits and '-' only (llama.cpp's grammar parser takes nothing else).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_LITERAL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}

# json.dumps(ensure_ascii=False): every character but '"', '\\' and the C0 controls is written
# as itself; those are escaped (\n \r \t \b \f, or \u00XX with lowercase hex).
_JSON_PRIMITIVES = {
    "json-char": r'[^"\\\x00-\x1F] | "\\" ["\\nrtbf] | "\\u00" [01] [0-9a-f]',
    "json-string": '"\\"" json-char* "\\""',
    "json-int": '"-"? ("0" | [1-9] [0-9]{0,17})',
    # a float as Python's repr writes it: no trailing zeros after the point but one ("1.0")
    "json-number": 'json-int ("." ("0" | [0-9]* [1-9]))?',
    "json-bool": '"true" | "false"',
    "json-null": '"null"',
    "json-value": "json-object | json-array | json-string | json-number | json-bool | json-null",
    "json-object": '"{" (json-string ": " json-value (", " json-string ": " json-value)*)? "}"',
    "json-array": '"[" (json-value (", " json-value)*)? "]"',
}
_TYPE_RULES = {
    "string": "json-string",
    "integer": "json-int",
    "number": "json-number",
    "boolean": "json-bool",
    "null": "json-null",
}


def literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    out = []
    for ch in text:
        if ch in _LITERAL_ESCAPES:
            out.append(_LITERAL_ESCAPES[ch])
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _class_char(ch: str) -> str:
    """One character inside a GBNF character class."""
    if ch in "\\]^-[":
        return "\\x" + f"{ord(ch):02X}"
    if ch in _LITERAL_ESCAPES:
        return _LITERAL_ESCAPES[ch]
    if ord(ch) < 0x20:
        return f"\\x{ord(ch):02X}"
    return ch


def json_text(value: Any) -> str:
    """A value as templates write it with `tojson`."""
    return json.dumps(value, ensure_ascii=False)


class Rules:
    """The rules of one grammar, added as the calls' shapes need them; `text()` writes them."""

    def __init__(self) -> None:
        self._rules: dict[str, str] = {}
        self._by_body: dict[str, str] = {}
        self._until: dict[str, str] = {}

    def add(self, hint: str, body: str) -> str:
        """A rule with this body (the same body twice gives the same rule); returns its name."""
        if body in self._by_body:
            return self._by_body[body]
        base = re.sub(r"[^A-Za-z0-9-]+", "-", hint).strip("-").lower() or "r"
        name, n = base, 1
        while name in self._rules:
            n += 1
            name = f"{base}-{n}"
        self._rules[name] = body
        self._by_body[body] = name
        return name

    def define(self, name: str, body: str) -> None:
        """A rule with a fixed name (`call`, `root`)."""
        if name in self._rules:
            raise ValueError(f"grammar rule {name!r} is defined twice")
        self._rules[name] = body

    def text(self) -> str:
        return "".join(f"{name} ::= {body}\n" for name, body in self._rules.items())

    # -- JSON ---------------------------------------------------------------------------------

    def _primitive(self, name: str) -> str:
        """One of the fixed JSON rules, with the rules it uses."""
        if name not in self._rules:
            body = _JSON_PRIMITIVES[name]
            self._rules[name] = body
            for dep in re.findall(r"json-[a-z]+", body):
                if dep in _JSON_PRIMITIVES:
                    self._primitive(dep)
        return name

    def json_value(self, schema: Any, hint: str) -> str:
        """A GBNF expression for one JSON value of `schema` (anything JSON when the schema says
        nothing this converter knows: `$ref`, `not`, ...)."""
        if not isinstance(schema, Mapping):
            return self._primitive("json-value")
        if "const" in schema:
            return literal(json_text(schema["const"]))
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return "(" + " | ".join(literal(json_text(v)) for v in schema["enum"]) + ")"
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                parts = [self.json_value(o, f"{hint}-{i}") for i, o in enumerate(options)]
                return "(" + " | ".join(parts) + ")"
        kind = schema.get("type")
        if isinstance(kind, list) and kind:
            parts = [self.json_value({**schema, "type": k}, f"{hint}-{k}") for k in kind]
            return "(" + " | ".join(parts) + ")"
        if kind in _TYPE_RULES:
            return self._primitive(_TYPE_RULES[kind])
        if kind == "array":
            item = self.json_value(schema.get("items"), f"{hint}-item")
            return self.add(f"{hint}-array", f'"[" ({item} (", " {item})*)? "]"')
        if kind == "object" or "properties" in schema:
            return self.json_object(schema, hint)
        return self._primitive("json-value")

    def json_object(self, schema: Mapping[str, Any], hint: str) -> str:
        """An object of `schema`'s properties in their order (required ones present, no others);
        any object when the schema lists no properties but allows some."""
        props = schema.get("properties")
        if isinstance(props, Mapping) and not props:
            return literal("{}")  # a tool that takes no arguments
        if not isinstance(props, Mapping):
            extra = schema.get("additionalProperties", True)
            if extra is False:
                return literal("{}")
            if isinstance(extra, Mapping) and extra:
                value = self.json_value(extra, f"{hint}-value")
                key = self._primitive("json-string")
                return self.add(f"{hint}-map", f'"{{" ({key} ": " {value} (", " {key} ": " {value})*)? "}}"')
            return self._primitive("json-object")
        required = set(schema.get("required") or ())
        members = [
            (literal(json_text(name) + ": ") + " " + self.json_value(sub, f"{hint}-{name}"), name in required)
            for name, sub in props.items()
        ]
        return self.add(f"{hint}-obj", f'"{{" {self.members(members, f"{hint}-kv", ", ")} "}}"')

    def members(self, members: Sequence[tuple[str, bool]], hint: str, separator: str) -> str:
        """A sequence of `(expression, required)` in order, the optional ones may be left out,
        `separator` between those present. Returns an expression (maybe empty: `""`)."""
        if not members:
            return '""'
        sep = literal(separator) if separator else ""
        # rest[i]: members i.. each preceded by the separator (something came before them)
        rest: list[str] = [""] * (len(members) + 1)
        for i in range(len(members) - 1, -1, -1):
            expr, required = members[i]
            item = f"{sep} {expr}".strip()
            tail = rest[i + 1]
            body = f"{item} {tail}".strip() if required else f"({item})? {tail}".strip()
            rest[i] = self.add(f"{hint}-rest", body)
        # first[i]: members i.., the first present one without a separator
        first: list[str] = [""] * (len(members) + 1)
        first[len(members)] = '""'
        for i in range(len(members) - 1, -1, -1):
            expr, required = members[i]
            here = f"{expr} {rest[i + 1]}"
            if required:
                first[i] = self.add(f"{hint}-first", here)
            else:
                first[i] = self.add(f"{hint}-first", f"{here} | {first[i + 1]}")
        return first[0]

    # -- raw text ------------------------------------------------------------------------------

    def text_until(self, stop: str, hint: str) -> str:
        """Any text that does not contain `stop` (so the first `stop` after it closes it); a
        small automaton over how much of `stop` the text ends with (Knuth-Morris-Pratt)."""
        if stop in self._until:
            return self._until[stop]
        m = len(stop)
        fail = [0] * (m + 1)
        for i in range(1, m):
            k = fail[i]
            while k and stop[i] != stop[k]:
                k = fail[k]
            fail[i + 1] = k + 1 if stop[i] == stop[k] else 0

        def step(state: int, ch: str) -> int:
            while state and stop[state] != ch:
                state = fail[state]
            return state + 1 if stop[state] == ch else 0

        names = [f"{hint}-s{k}" for k in range(m)]
        alphabet = sorted(set(stop))
        for k in range(m):
            moves, excluded = [], []
            for ch in alphabet:
                nxt = step(k, ch)
                if nxt == m:
                    excluded.append(ch)
                elif nxt > 0:
                    moves.append(f"{literal(ch)} {names[nxt]}")
                    excluded.append(ch)
            other = "[^" + "".join(_class_char(c) for c in excluded) + f"] {names[0]}"
            self.define(names[k], "(" + " | ".join([*moves, other]) + ")?")
        self._until[stop] = names[0]
        return names[0]
