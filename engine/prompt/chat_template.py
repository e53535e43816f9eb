"""Render a conversation with the model's own chat template (Jinja, from GGUF metadata).

Templates are written for HuggingFace's `apply_chat_template`, so the environment is HF's
(`template_env.py`: its sandbox, extensions, filters and globals, the variables it renders with)
plus the `bos_token` / `eos_token` strings. The renderer is compiled once per model.

`segments()` is what the engine tokenizes: the rendering cut into the template's own text and
each message's text, so message text never becomes control tokens (`segments.py`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import nodes

from ..errors import ChatTemplateError
from . import template_env
from .segments import PromptSplitter, Segment
from .thinking import ThinkingSupport, inspect_template
from ..tools.formats import ToolFormat, detect_format
from ..tools.types import ToolCall

_SPLIT_METHODS = {"split", "rsplit", "partition", "rpartition"}


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system", "user", "assistant" or "tool" (a tool's result)
    content: str
    reasoning_content: str = ""  # a reply's reasoning, kept apart from its answer (`content`)
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant step's calls (`content`: the text around them)
    tool_call_id: str = ""  # a tool result: the id of the call it answers
    name: str = ""  # a tool result: the tool's name


def _raise(message: str) -> None:
    raise ChatTemplateError(f"chat template: {message}")


def _split_separators(env: jinja2.Environment, source: str) -> list[str]:
    """String constants the template splits message text on, e.g. Qwen3's "</think>" (it keeps
    only the answer of earlier replies): the segmenter looks for those parts of a message."""
    found: list[str] = []
    for call in env.parse(source).find_all(nodes.Call):
        target = call.node
        if (
            isinstance(target, nodes.Getattr)
            and target.attr in _SPLIT_METHODS
            and call.args
            and isinstance(call.args[0], nodes.Const)
            and isinstance(call.args[0].value, str)
        ):
            found.append(call.args[0].value)
    return found


class ChatTemplate:
    def __init__(
        self,
        source: str | None,
        *,
        bos_token: str,
        eos_token: str,
        model_name: str = "model",
        protected: Iterable[str] = (),
    ) -> None:
        """`protected`: the texts of the tokens message text must never become (the model's
        control tokens); the engine passes them from the vocabulary."""
        if not source:
            raise ChatTemplateError(
                f"{model_name} has no chat template in its GGUF metadata "
                "(tokenizer.chat_template); velo-chat needs one to format a conversation"
            )
        env = template_env.environment()
        env.globals["raise_exception"] = _raise
        try:
            self._template = env.from_string(source)
            self._inputs = template_env.inputs(env, source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"{model_name}: cannot parse its chat template: {exc}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._env, self._source = env, source
        self._splitter = PromptSplitter(
            protected=protected,
            separators=_split_separators(env, source),
            fixed_texts=(source, bos_token, eos_token),
        )

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The conversation as one string (message text included verbatim). `variables`:
        extra template variables (`enable_thinking`, ...: `ThinkingSupport.variables`)."""
        return self._render(messages, _texts(messages), add_generation_prompt, variables)

    def segments(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        variables: Mapping[str, Any] | None = None,
    ) -> list[Segment]:
        """The rendering cut into scaffolding and message text (a reply's reasoning is message
        text too); the texts concatenate to `render(...)` (see `segments.py` for the one
        exception: a template that rewrites message text containing control-token text sees
        placeholders for it)."""
        return self._splitter.split(
            lambda texts: self._render(messages, texts, add_generation_prompt, variables), _texts(messages)
        )

    def _render(
        self,
        messages: Sequence[ChatMessage],
        texts: Sequence[str],
        add_generation_prompt: bool,
        variables: Mapping[str, Any] | None,
    ) -> str:
        try:
            return self._template.render(
                **{**self._defaults(), **(variables or {})},
                messages=_message_dicts(messages, texts, self._format_for(messages)),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except ChatTemplateError:
            raise
        except Exception as exc:  # a template can fail in any way (TypeError, ...)
            raise ChatTemplateError(f"chat template failed to render: {exc}") from None

    def _defaults(self) -> dict[str, Any]:
        """The variables every rendering gets unless told otherwise (`template_env.py`)."""
        out = template_env.defaults(self._inputs)
        if self._needs_tool_list:
            out["tools"] = []
        return out

    @functools.cached_property
    def _needs_tool_list(self) -> bool:
        probe = [{"role": "user", "content": "Hi"}]
        base = template_env.defaults(self._inputs)
        return template_env.needs_tool_list(
            lambda v: self._template.render(
                **{**base, **v},
                messages=probe,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        )

    def _format_for(self, messages: Sequence[ChatMessage]) -> ToolFormat | None:
        """The tool format, looked for only once a conversation has calls or results."""
        if any(m.tool_calls or m.role == "tool" for m in messages):
            return self.tool_format
        return None

    @functools.cached_property
    def tool_format(self) -> ToolFormat | None:
        """How this template writes tool calls (`tools/formats.py`); None: it renders none
        that velo-chat knows, and assistant messages' calls go to it in OpenAI's shape."""
        return detect_format(self._source)

    @functools.cached_property
    def thinking(self) -> ThinkingSupport:
        """The template's thinking controls and reasoning markers (`thinking.py`)."""
        probe = [ChatMessage("user", "Hi")]
        return inspect_template(
            self._env.parse(self._source),
            self._source,
            lambda variables: self.render(probe, variables=variables),
        )


def _texts(messages: Sequence[ChatMessage]) -> list[str]:
    """The message texts the segmenter looks for: every message's content, then the reasoning
    of the replies that have one (in message order), then each tool call's name and the
    strings in its arguments (nested ones too; in message, call and argument order), so text a
    model wrote into a call never becomes a control token either. Argument keys are not among
    them (the grammar keeps them to the declared parameter names)."""
    out = [m.content for m in messages] + [m.reasoning_content for m in messages if m.reasoning_content]
    for m in messages:
        for call in m.tool_calls:
            out.append(call.name)
            out.extend(_strings(call.arguments))
    return out


def _strings(value: Any) -> list[str]:
    """The strings in a JSON-like value, in order (a mapping's values, a list's items)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _with_strings(value: Any, texts: Iterator[str]) -> Any:
    """`value` with its strings replaced, in `_strings` order, by the next of `texts` (an empty
    one stays empty: see `_message_dicts`)."""
    if isinstance(value, str):
        text = next(texts)
        return text if value else ""
    if isinstance(value, Mapping):
        return {k: _with_strings(v, texts) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_with_strings(v, texts) for v in value]
    return value


def _call_dict(call: ToolCall, fmt: ToolFormat | None) -> dict[str, Any]:
    """A call as the template reads it: its format's shape, or OpenAI's when the template has
    no known format (a template that reads `tool_calls` expects that one)."""
    if fmt is not None:
        return fmt.call_dict(call)
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": dict(call.arguments)},
    }


def _message_dicts(
    messages: Sequence[ChatMessage], texts: Sequence[str], fmt: ToolFormat | None = None
) -> list[dict[str, Any]]:
    """The `messages` a template sees, with `texts` (as `_texts` orders them) for the text.
    `reasoning_content` is there only when a reply has reasoning, and `tool_calls` only when
    it made calls, as in HF's chat messages (templates test `tool_calls is defined`); a tool's
    result carries `tool_call_id` (as the format needs ids) and the tool's `name`.

    An empty text stays empty whatever `texts` holds: templates test it (`{% if message.content
    %}` before a reply's calls), so the segmenter's marker in its place would render a
    different structure and the alignment would fail."""
    n_reasoning = sum(1 for m in messages if m.reasoning_content)
    reasoning = iter(texts[len(messages) : len(messages) + n_reasoning])
    in_calls = iter(texts[len(messages) + n_reasoning :])
    out = []
    for m, content in zip(messages, texts, strict=False):
        d: dict[str, Any] = {"role": m.role, "content": content if m.content else ""}
        if m.reasoning_content:
            d["reasoning_content"] = next(reasoning)
        if m.tool_calls:
            calls = []
            for call in m.tool_calls:
                name = next(in_calls)
                name = name if call.name else ""
                arguments = _with_strings(call.arguments, in_calls)
                calls.append(_call_dict(dataclasses.replace(call, name=name, arguments=arguments), fmt))
            d["tool_calls"] = calls
        if m.role == "tool":
            d["tool_call_id"] = fmt.template_id(m.tool_call_id) if fmt is not None else m.tool_call_id
            d["name"] = m.name
        out.append(d)
    return out
