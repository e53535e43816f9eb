"""Render a conversation with the model's own chat template (Jinja, from GGUF metadata).

Templates are written for HuggingFace's `apply_chat_template`, so the environment is HF's
(`template_env.py`: its sandbox, extensions, filters and globals, the variables it renders with)
plus the `bos_token` / `eos_token` strings. The renderer is compiled once per model.

`segments()` is what the engine tokenizes: the rendering cut into the template's own text and
each message's text, so message text never becomes control tokens (`segments.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import nodes

from ..errors import ChatTemplateError
from . import template_env
from .segments import PromptSplitter, Segment
from .thinking import ThinkingSupport, inspect_template
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
                messages=_message_dicts(messages, texts),
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
    of the replies that have one (in message order)."""
    return [m.content for m in messages] + [m.reasoning_content for m in messages if m.reasoning_content]


def _message_dicts(messages: Sequence[ChatMessage], texts: Sequence[str]) -> list[dict[str, str]]:
    """The `messages` a template sees, with `texts` (as `_texts` orders them) for the text.
    `reasoning_content` is there only when a reply has reasoning, as in HF's chat messages."""
    reasoning = iter(texts[len(messages) :])
    out = []
    for m, content in zip(messages, texts, strict=False):
        d = {"role": m.role, "content": content}
        if m.reasoning_content:
            d["reasoning_content"] = next(reasoning)
        out.append(d)
    return out
