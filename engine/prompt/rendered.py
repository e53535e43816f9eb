"""A conversation rendered once per turn, and the prefixes a turn's checkpoints need from it.

`PromptRenderer.render` cuts the conversation into segments (`segments.py`) and tokenizes them
(`tokens.py`); it remembers the last rendering, so the preview before a turn and the turn itself
render the conversation once. Two prefixes need more than that rendering:

- the stable prefix (`checkpoints/save_points.py`): how much of the prompt every continuation
  keeps, found by rendering the conversation followed by placeholder continuations;
- the follow-up boundary after the reply: the tokens every follow-up starts with, up to where
  the next user message's text begins. It is cut from the segments of one rendering with the
  reply and a placeholder question: the tokens before a message's text do not depend on that
  text (`tokens.py`), so they end where that question's segment starts. When the segmenter
  could not locate message text (its fallback), two follow-ups that differ only in that text
  are rendered and their common prefix taken, as `follow_up_prefix` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .chat_template import ChatMessage, ChatTemplate
from .segments import Segment
from .tokens import common_prefix

TokenizeSegments = Callable[[Sequence[Segment]], list[int]]
TokensFor = Callable[[Sequence[ChatMessage], Mapping[str, Any] | None], list[int]]

FOLLOW_UP_QUESTIONS = ("A", "B")
"""Placeholder next questions: the follow-up boundary is where their text begins."""


@dataclass(frozen=True)
class RenderedPrompt:
    """One conversation as a turn prompts with it."""

    messages: tuple[ChatMessage, ...]
    variables: Mapping[str, Any] = field(default_factory=dict)  # extra template variables
    segments: tuple[Segment, ...] = ()
    tokens: tuple[int, ...] = ()

    @property
    def generation_prompt(self) -> str:
        """The template's text after the last message's (it may open a reasoning block)."""
        last_plain = max((i for i, s in enumerate(self.segments) if s.plain), default=-1)
        return "".join(s.text for s in self.segments[last_plain + 1 :])


class PromptRenderer:
    """Renders conversations with one model's chat template (`template` is called when first
    needed: a model without one raises `ChatTemplateError` there)."""

    def __init__(self, template: Callable[[], ChatTemplate], tokenize: TokenizeSegments) -> None:
        self._template = template
        self._tokenize = tokenize
        self._last: RenderedPrompt | None = None
        self.renders = 0  # conversations rendered (`ChatTemplate.segments` calls)

    def render(
        self, messages: Sequence[ChatMessage], variables: Mapping[str, Any] | None = None
    ) -> RenderedPrompt:
        """The conversation's segments and tokens; the same conversation with the same
        variables as the last call is not rendered again."""
        messages, variables = tuple(messages), dict(variables or {})
        last = self._last
        if last is not None and last.messages == messages and last.variables == variables:
            return last
        segments = tuple(self._segments(messages, variables))
        self._last = RenderedPrompt(messages, variables, segments, tuple(self._tokenize(segments)))
        return self._last

    def tokens(
        self, messages: Sequence[ChatMessage], variables: Mapping[str, Any] | None = None
    ) -> list[int]:
        """The prompt tokens of a conversation (not remembered: continuations and follow-ups)."""
        return self._tokenize(self._segments(messages, variables))

    def follow_up_prefix(self, prompt: RenderedPrompt, reply: str, reasoning: str = "") -> list[int]:
        """The tokens every follow-up to `reply` (its answer, and its reasoning as
        `reasoning_content`) starts with: the conversation with the reply in its history, up
        to where the next user message's text begins. The template's own closing and opening
        tokens ("<|im_end|>\\n<|im_start|>user\\n") are part of it."""
        history = (*prompt.messages, ChatMessage("assistant", reply, reasoning))
        segments = self._segments([*history, ChatMessage("user", FOLLOW_UP_QUESTIONS[0])], prompt.variables)
        question = len(history)  # the index of its text (`Segment.message`)
        cut = next((k for k, s in enumerate(segments) if s.plain and s.message == question), None)
        if cut is None:  # the fallback segmentation does not say which message a text is
            return follow_up_prefix(
                self.tokens, history[:-1], reply, reasoning=reasoning, variables=prompt.variables
            )
        return self._tokenize(segments[:cut])

    def _segments(
        self, messages: Sequence[ChatMessage], variables: Mapping[str, Any] | None
    ) -> list[Segment]:
        self.renders += 1
        return self._template().segments(messages, variables=variables)


def follow_up_prefix(
    tokens_for: TokensFor,
    messages: Sequence[ChatMessage],
    reply: str,
    *,
    reasoning: str = "",
    variables: Mapping[str, Any] | None = None,
) -> list[int]:
    """`PromptRenderer.follow_up_prefix` found by difference: two follow-ups that differ only
    in the next question's text, rendered in full, and their common prefix."""
    history = [*messages, ChatMessage("assistant", reply, reasoning)]
    a, b = (tokens_for([*history, ChatMessage("user", q)], variables) for q in FOLLOW_UP_QUESTIONS)
    return a[: common_prefix(a, b)]
