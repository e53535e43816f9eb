"""Revising a stored message: which message a revision replaces and with what.

A revision (the TUI's `e` on your message or `r` on a reply, Ctrl+R; `ask --edit N`,
`--regenerate [N]`, `--edit-last`) never changes the session: `start_turn` runs it in a fork
holding the messages before the revised one (`revise_at`), so the session and every checkpoint
saved for it stay as they were, and the fork resumes from them (docs/coding-sessions.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from velo_chat.store import Attachment, Message

from .errors import UserError


def last_user_message(messages: Sequence[Message]) -> Message | None:
    """The last user message (regenerate and edit-last-message restart from it)."""
    return next((m for m in reversed(messages) if m.role == "user"), None)


@dataclass(frozen=True)
class Revision:
    """A turn that revises the session at a user message: it runs in a fork holding the
    messages before `position`, with the revised (or, to regenerate, the same) question.
    The session itself is never changed (its checkpoints stay valid)."""

    position: int  # the user message replaced in the fork
    text: str  # its text as stored (a regenerate sends it again)
    attachments: tuple[Attachment, ...]  # its files as stored


def revision_at(messages: Sequence[Message], position: int, *, regenerate: bool) -> Revision:
    """The revision of message `position` (the CLI's `--edit N` / `--regenerate N`, the TUI's
    keys on a focused message). `regenerate`: `position` names a reply, answered again from the
    question before it; else it names the user's message to revise. A position that names no
    such message raises `UserError`."""
    by_position = {m.position: m for m in messages}
    message = by_position.get(position)
    if message is None:
        last = messages[-1].position if messages else -1
        raise UserError(f"the session has no message {position} (its messages are 0 to {last})")
    if regenerate:
        if message.role != "assistant":
            raise UserError(
                f"message {position} is not a reply (--edit {position} revises a message of yours)"
            )
        question = by_position.get(position - 1)
        if question is None or question.role != "user":
            raise UserError(f"reply {position} does not follow a message of yours")
        message = question
    elif message.role != "user":
        raise UserError(f"message {position} is not yours (--regenerate {position} answers it again)")
    return Revision(message.position, message.content, message.attachments)


def last_revision(messages: Sequence[Message]) -> Revision:
    """The revision of the last user message (regenerate the last reply, edit the last
    question); `UserError` when there is none."""
    last = last_user_message(messages)
    if last is None:
        raise UserError("the session has no user message to regenerate or edit")
    return Revision(last.position, last.content, last.attachments)
