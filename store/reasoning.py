"""Reasoning written inline in a reply, as velo-chat stored it before it kept reasoning apart.

A thinking model's reply used to be stored whole, `<think>...</think>` block and answer in one
text; now the engine hands over the two apart and the store keeps them in two columns. This
splits an old reply (the schema migration, a version 1 session file) the way the transcript
used to show it: a block only at the very start, the answer after its first `</think>`, and
the newlines around both dropped (as chat templates split a reply: `strip('\\n')`).
"""

from __future__ import annotations

from typing import Final

INLINE_OPEN: Final = "<think>"
INLINE_CLOSE: Final = "</think>"


def split_inline(text: str) -> tuple[str | None, str]:
    """(reasoning, answer); reasoning is None when the text does not start with a block. A
    block that never closes (an interrupted reply) is all reasoning."""
    stripped = text.lstrip()
    if not stripped.startswith(INLINE_OPEN):
        return None, text
    body = stripped[len(INLINE_OPEN) :]
    end = body.find(INLINE_CLOSE)
    if end < 0:
        return body.strip("\n"), ""
    return body[:end].strip("\n"), body[end + len(INLINE_CLOSE) :].lstrip("\n")
