"""Pure text helpers for the transcript: reasoning blocks and code blocks.

`split_thinking` is applied to the whole reply so far on every update, so a `<think>` tag split
across two tokens is never shown half-parsed: text that could still become the opening tag is
held back until it is decided.
"""

from __future__ import annotations

from dataclasses import dataclass

from markdown_it import MarkdownIt

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Split:
    thinking: str | None  # None: the reply has no reasoning block
    answer: str
    thinking_open: bool  # still inside <think> (streaming)


def split_thinking(text: str) -> Split:
    stripped = text.lstrip()
    if not stripped:
        return Split(None, "", False)
    if not stripped.startswith(OPEN):
        if OPEN.startswith(stripped):  # "<thi": wait for the next token
            return Split(None, "", False)
        return Split(None, text, False)
    body = stripped[len(OPEN):]
    end = body.find(CLOSE)
    if end < 0:
        return Split(body.lstrip("\n"), "", True)
    return Split(body[:end].strip("\n"), body[end + len(CLOSE):].lstrip("\n"), False)


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced and indented code blocks, in order."""
    tokens = MarkdownIt("commonmark").parse(markdown)
    return [t.content for t in tokens if t.type in ("fence", "code_block")]
