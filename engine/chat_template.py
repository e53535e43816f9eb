"""Render a conversation with the model's own chat template (Jinja, from GGUF metadata).

Templates are written for HuggingFace's `apply_chat_template`, so the environment mirrors it:
a sandbox, `trim_blocks`/`lstrip_blocks`, `raise_exception`, `strftime_now`, and the `bos_token`
/ `eos_token` strings. The renderer is compiled once per model.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The model has no usable chat template, or rendering failed."""


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system", "user" or "assistant"
    content: str


def _raise(message: str) -> None:
    raise ChatTemplateError(f"chat template: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str, eos_token: str,
                 model_name: str = "model") -> None:
        if not source:
            raise ChatTemplateError(
                f"{model_name} has no chat template in its GGUF metadata "
                "(tokenizer.chat_template); velo-chat needs one to format a conversation"
            )
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            loader=jinja2.BaseLoader())
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"{model_name}: cannot parse its chat template: {exc}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed to render: {exc}") from None
