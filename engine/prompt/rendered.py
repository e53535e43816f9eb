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
  are rendered and their common prefix taken, as `follow_up_prefix` does;
- the shared prefix: the tokens every conversation with the same leading messages (the system
  prompt) and template variables (the thinking switch, the tools offered) starts with, up to
  where its first user message's text begins. Every new session of a profile opens with it, so
  a state saved there lets the first turn of the next one prefill only its own question
  (docs/checkpoints.md). It is cut the same way, from a rendering with a placeholder question.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..tools.types import ToolCall
from .chat_template import ChatMessage, ChatTemplate, ChatTemplateError
from .segments import Segment
from .tokens import common_prefix

TokenizeSegments = Callable[[Sequence[Segment]], list[int]]
TokensFor = Callable[[Sequence[ChatMessage], Mapping[str, Any] | None], list[int]]

FOLLOW_UP_QUESTIONS = ("A", "B")
"""Placeholder next questions: the follow-up boundary is where their text begins."""


def _first_user(messages: Sequence[ChatMessage]) -> int | None:
    return next((i for i, m in enumerate(messages) if m.role == "user"), None)


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
        # the last shared prefix: (leading messages, variables, tokens), reused while it still
        # opens the prompts asked about (`shared_prefix`)
        self._shared: tuple[tuple[ChatMessage, ...], dict[str, Any], tuple[int, ...]] | None = None
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

    def follow_up_prefix(
        self, prompt: RenderedPrompt, reply: str, reasoning: str = "", tool_calls: Sequence[ToolCall] = ()
    ) -> list[int]:
        """The tokens every follow-up to `reply` (its answer, and its reasoning as
        `reasoning_content`) starts with: the conversation with the reply in its history, up
        to where the next user message's text begins. The template's own closing and opening
        tokens ("<|im_end|>\\n<|im_start|>user\\n") are part of it. A reply that made tool
        calls is followed by their results, not by a user message: the prefix then ends where
        the first result's text begins (what the loop's next step resumes from)."""
        history = (*prompt.messages, ChatMessage("assistant", reply, reasoning, tuple(tool_calls)))
        segments = self._segments(
            [*history, next_message(tool_calls, FOLLOW_UP_QUESTIONS[0])], prompt.variables
        )
        question = len(history)  # the index of its text (`Segment.message`)
        cut = next((k for k, s in enumerate(segments) if s.plain and s.message == question), None)
        if cut is None:  # the fallback segmentation does not say which message a text is
            return follow_up_prefix(
                self.tokens,
                history[:-1],
                reply,
                reasoning=reasoning,
                variables=prompt.variables,
                tool_calls=tool_calls,
            )
        return self._tokenize(segments[:cut])

    def shared_prefix(self, prompt: RenderedPrompt) -> tuple[int, ...]:
        """The tokens every conversation that opens with `prompt`'s messages before its first
        user message (the system prompt, or nothing) and renders with its variables (the
        thinking switch, `tools`) starts with: up to where the first user message's text
        begins, the template's opening and closing tokens around the system prompt included.
        Only as much of it as `prompt` itself starts with: a template that puts something
        else before the first question (Mistral Nemo moves the system prompt into the last
        one) keeps less. Empty when the conversation has no user message or the template
        refuses the placeholder question.

        Remembered while it still opens the prompts asked about, so the preview and the turn
        render it once per system prompt; a template whose opening changes by itself (a date:
        `strftime_now` is the day's) is rendered again once it no longer does."""
        first = _first_user(prompt.messages)
        if first is None:
            return ()
        head, variables = prompt.messages[:first], dict(prompt.variables)
        memo = self._shared
        if (
            memo is None
            or memo[0] != head
            or memo[1] != variables
            or common_prefix(memo[2], prompt.tokens) < len(memo[2])
        ):
            memo = (head, variables, tuple(self._shared_tokens(head, variables)))
            self._shared = memo
        return memo[2][: common_prefix(memo[2], prompt.tokens)]

    def _shared_tokens(self, head: tuple[ChatMessage, ...], variables: Mapping[str, Any]) -> list[int]:
        """`shared_prefix` of a conversation opening with `head`, before it meets a prompt."""
        question = len(head)  # the placeholder question's index (`Segment.message`)
        try:
            segments = self._segments([*head, ChatMessage("user", FOLLOW_UP_QUESTIONS[0])], variables)
            cut = next((k for k, s in enumerate(segments) if s.plain and s.message == question), None)
            if cut is not None:
                return self._tokenize(segments[:cut])
            # the fallback segmentation does not say which message a text is: by difference
            a, b = (self.tokens([*head, ChatMessage("user", q)], variables) for q in FOLLOW_UP_QUESTIONS)
        except ChatTemplateError:
            return []
        return a[: common_prefix(a, b)]

    def _segments(
        self, messages: Sequence[ChatMessage], variables: Mapping[str, Any] | None
    ) -> list[Segment]:
        self.renders += 1
        return self._template().segments(messages, variables=variables)


def next_message(tool_calls: Sequence[ToolCall], text: str) -> ChatMessage:
    """A placeholder for what follows a reply: the first call's result, or the next question."""
    if tool_calls:
        return ChatMessage("tool", text, tool_call_id=tool_calls[0].id, name=tool_calls[0].name)
    return ChatMessage("user", text)


def follow_up_prefix(
    tokens_for: TokensFor,
    messages: Sequence[ChatMessage],
    reply: str,
    *,
    reasoning: str = "",
    variables: Mapping[str, Any] | None = None,
    tool_calls: Sequence[ToolCall] = (),
) -> list[int]:
    """`PromptRenderer.follow_up_prefix` found by difference: two follow-ups that differ only
    in the next question's text (or the first tool result's), rendered in full, and their
    common prefix."""
    history = [*messages, ChatMessage("assistant", reply, reasoning, tuple(tool_calls))]
    a, b = (tokens_for([*history, next_message(tool_calls, q)], variables) for q in FOLLOW_UP_QUESTIONS)
    return a[: common_prefix(a, b)]
