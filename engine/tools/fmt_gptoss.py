"""gpt-oss's harmony calls: a message to `functions.NAME` on the commentary channel.

The template writes a past call with the recipient in the message's header

    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>

and the model, trained on both, usually writes it after the channel

    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>

The grammar's `call` admits both, from ` to=functions.` (the template's shape: what follows
the generation prompt `<|start|>assistant`) or from `<|channel|>commentary to=functions.`;
only the first renders back token for token. `<|call|>` ends the call: an end-of-generation
token of gpt-oss's vocabulary, so the grammar leaves it to the model once the arguments'
JSON closes (llama.cpp's grammar matches an end-of-generation token only where the grammar
is complete). The parser reads either shape, with or without `<|call|>`, and takes the
`<|start|>assistant` and `<|channel|>commentary` before the recipient into the call's text.
"""

from __future__ import annotations

from collections.abc import Sequence

from .fmt_common import CUT_OFF, BaseFormat, Found, arguments_of, read_json, trigger
from .fmt_gbnf import Rules, json_text, literal
from .types import ToolCall, ToolSpec

RECIPIENT = " to=functions."
HEADER_TAIL = "<|channel|>commentary json<|message|>"  # the template's shape
CHANNEL = "<|channel|>commentary"
CONSTRAIN_TAIL = " <|constrain|>json<|message|>"  # the model's usual shape
START = "<|start|>assistant"
MESSAGE, CALL = "<|message|>", "<|call|>"


class GptOssFormat(BaseFormat):
    name = "gpt-oss"

    def render(self, call: ToolCall) -> str:
        return f"{RECIPIENT}{call.name}{HEADER_TAIL}{json_text(dict(call.arguments))}"

    def triggers(self, tools: Sequence[ToolSpec] = ()) -> list[str]:
        return [
            trigger(RECIPIENT, [t.name + HEADER_TAIL for t in tools], before=r"(?:^|<\|start\|>assistant)"),
            trigger(CHANNEL + RECIPIENT, [t.name + CONSTRAIN_TAIL for t in tools]),
        ]

    def grammar(self, tools: Sequence[ToolSpec]) -> str:
        rules = Rules()
        header, channel = [], []
        for i, tool in enumerate(tools):
            args = rules.json_object(tool.parameters, f"t{i}-args")
            header.append(rules.add(f"t{i}-{tool.name}", f"{literal(tool.name + HEADER_TAIL)} {args}"))
            channel.append(rules.add(f"t{i}-{tool.name}-c", f"{literal(tool.name + CONSTRAIN_TAIL)} {args}"))
        in_header = f"{literal(RECIPIENT)} ({' | '.join(header)})"
        in_channel = f"{literal(CHANNEL + RECIPIENT)} ({' | '.join(channel)})"
        rules.define("call", f"{in_header} | {in_channel}")
        return rules.text()

    def scan(self, text: str, tools: Sequence[ToolSpec]) -> list[Found]:
        out: list[Found] = []
        pos = 0
        while (at := text.find(RECIPIENT, pos)) >= 0:
            found = self._read(text, at)
            out.append(found)
            pos = max(found.end, at + len(RECIPIENT))
        return out

    def _read(self, text: str, at: int) -> Found:
        start = at
        if text.endswith(CHANNEL, 0, start):
            start -= len(CHANNEL)
        if text.endswith(START, 0, start):
            start -= len(START)
        i = at + len(RECIPIENT)
        message = text.find(MESSAGE, i)
        name_end = i
        while name_end < len(text) and text[name_end] not in " <\n":
            name_end += 1
        name = text[i:name_end]
        if message < 0:
            return Found(start, len(text), name, error=CUT_OFF)
        j = message + len(MESSAGE)
        if j >= len(text):
            return Found(start, len(text), name, error=CUT_OFF)
        if text[j] != "{":
            stop = text.find(CALL, j)
            end = len(text) if stop < 0 else stop + len(CALL)
            return Found(start, end, name, error="the call's arguments are not a JSON object")
        value, end, error = read_json(text, j)
        if text.startswith(CALL, end):
            end += len(CALL)
        arguments, bad = arguments_of(value) if not error else (None, "")
        return Found(start, end, name, arguments, error=error or bad)
