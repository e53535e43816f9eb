"""Pure text helpers for the transcript: code blocks (a reply's reasoning arrives apart from its
answer, split by the engine: `engine/prompt/thinking.py`)."""

from __future__ import annotations

from markdown_it import MarkdownIt


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced and indented code blocks, in order."""
    tokens = MarkdownIt("commonmark").parse(markdown)
    return [t.content for t in tokens if t.type in ("fence", "code_block")]
