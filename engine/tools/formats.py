"""Tool-call formats, one per family of chat templates: how a model of that family writes a call,
how to read it back, and a grammar that admits only a well-formed call to a declared tool.

The families (`fmt_*.py`): Qwen3-Coder's XML (`fmt_xml.py`), Hermes' and Llama 3's JSON
(`fmt_json.py`), Mistral's `[TOOL_CALLS]` in its three shapes (`fmt_mistral.py`), gpt-oss's
harmony messages (`fmt_gptoss.py`); docs/engine.md ("Tool calls: formats") lists the templates.

`detect_format` does not trust names or keywords alone: a template is of a family when it
renders a probe call (through its own `tool_calls` handling, with a tool in `tools`) as exactly
the text that family's grammar generates, and that text parses back to the same call. A
template that writes calls some other way, or none, has no format (None): velo-chat then does
not offer it tools rather than guess.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Protocol

from .fmt_common import BaseFormat
from .fmt_gptoss import GptOssFormat
from .fmt_json import HermesFormat, Llama3Format
from .fmt_mistral import MistralFormat
from .fmt_xml import XmlFormat
from .types import ParsedReply, ToolCall, ToolSpec


class ToolFormat(Protocol):
    """One family's way of writing calls."""

    name: str
    """A short name shown to users and in stats ("qwen3-coder-xml", "hermes", "llama3-json",
    "mistral", "mistral-args", "mistral-list", "gpt-oss")."""

    def triggers(self, tools: Sequence[ToolSpec] = ()) -> list[str]:
        """Regular expressions (std::regex ECMAScript, as llama.cpp's lazy grammar reads them)
        that match the text where a call opens; the first capture group marks where the call
        (the grammar's `call` rule) starts. They match inside an unclosed think block too, and
        only where the text from the capture to the end is a beginning of a call of one of
        `tools` (see `fmt_common.trigger`: anything else would abort llama.cpp)."""
        ...

    def grammar(self, tools: Sequence[ToolSpec]) -> str:
        """GBNF rules with a rule named `call`: exactly one complete call of one of `tools`, from
        its opening marker to its closing one, written as the template renders a call (so the
        generated text renders back token for token). Defines no `root` (the engine adds it)."""
        ...

    def open_call(self, text: str) -> bool:
        """Whether `text` (a reply so far, special tokens as text) ends inside a call that was
        opened and not yet closed."""
        ...

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedReply:
        """The calls in `text` (a whole reply, special tokens as text; calls inside a think block
        count), each with its text as generated, and the text around them (stripped). A call
        that names an unknown tool or has arguments that do not fit its schema is returned with
        `error` set, as is a call cut off before it closed (`fmt_common.CUT_OFF`); text that
        only mentions a call's opening tag is left in the content. Never raises."""
        ...

    def call_dict(self, call: ToolCall) -> dict[str, Any]:
        """The call as the template reads it in an assistant message's `tool_calls`."""
        ...

    def template_id(self, call_id: str) -> str:
        """A call's id as the template needs it (in `call_dict` and in the result's
        `tool_call_id`): Mistral's templates take only 9 alphanumerics."""
        ...

    def render(self, call: ToolCall) -> str:
        """The call's text exactly as the template writes it and the grammar generates it."""
        ...


def all_formats() -> list[BaseFormat]:
    """Every known format, the most specific first (the order detection tries them in)."""
    return [
        GptOssFormat(),
        MistralFormat("mistral"),
        MistralFormat("mistral-list"),
        MistralFormat("mistral-args"),
        XmlFormat(),
        HermesFormat(),
        Llama3Format(),
    ]


# a cheap filter before the probe rendering: text the template's source must hold
_SOURCE_MARKS = {
    "gpt-oss": ("<|channel|>", "functions."),
    "mistral": ("[TOOL_CALLS]", "[CALL_ID]"),
    "mistral-list": ("[TOOL_CALLS][",),
    "mistral-args": ("[TOOL_CALLS]", "[ARGS]"),
    "qwen3-coder-xml": ("<tool_call>", "<function="),
    "hermes": ("<tool_call>",),
    "llama3-json": ('"parameters": ',),
}

PROBE_TOOL = ToolSpec(
    "probe_lookup",
    "Probe tool 7f3a: looks a word up.",
    {
        "type": "object",
        "properties": {"word": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["word"],
    },
)
PROBE_CALL = ToolCall("probe_lookup", {"word": "velo", "limit": 3}, id="a1b2c3d4e")


@functools.lru_cache(maxsize=8)
def detect_format(template_source: str) -> ToolFormat | None:
    """The format of a chat template, or None when it does not render tools (no `tools` variable
    used, or a family velo-chat does not know). Remembered per template (the formats hold no
    state): a turn asks for it each time."""
    if not template_source or "tool" not in template_source:
        return None
    for fmt in all_formats():
        marks = _SOURCE_MARKS[fmt.name]
        if all(m in template_source for m in marks) and _renders_as(template_source, fmt):
            return fmt
    return None


def _renders_as(source: str, fmt: BaseFormat) -> bool:
    """Whether the template writes the probe call as `fmt` does, after the probe tool's
    definition, and that text parses back to the probe call."""
    rendered = probe_rendering(source, fmt)
    if rendered is None:
        return False
    call_text = fmt.render(PROBE_CALL)
    defined = rendered.find(PROBE_TOOL.description)
    if defined < 0 or rendered.find(call_text, defined) < 0:
        return False
    parsed = fmt.parse(call_text, [PROBE_TOOL]).calls
    return (
        len(parsed) == 1 and parsed[0].name == PROBE_CALL.name and parsed[0].arguments == PROBE_CALL.arguments
    )


def probe_rendering(source: str, fmt: BaseFormat) -> str | None:
    """The template's rendering of a question, the probe call (as `fmt` hands it over) and
    its result, with the probe tool offered; None when the template cannot render it."""
    from ..prompt import template_env

    def fail(message: str) -> None:
        raise ValueError(message)

    env = template_env.environment()
    env.globals["raise_exception"] = fail
    try:
        template = env.from_string(source)
        variables = {
            **template_env.defaults(template_env.inputs(env, source)),
            "tools": [PROBE_TOOL.template_dict()],
        }
        return template.render(
            **variables,
            messages=[
                {"role": "user", "content": "Look up velo."},
                {"role": "assistant", "content": "", "tool_calls": [fmt.call_dict(PROBE_CALL)]},
                {
                    "role": "tool",
                    "content": "velo: a bicycle",
                    "tool_call_id": fmt.template_id(PROBE_CALL.id),
                    "name": PROBE_CALL.name,
                },
            ],
            add_generation_prompt=True,
            bos_token="",
            eos_token="",
        )
    except Exception:  # a template can fail in any way: it is not of this family
        return None
