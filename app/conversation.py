"""A turn in a stored session: the glue between the session store and the engine, with no UI.

The CLI (`velo-chat ask`) and the TUI's generation worker both use it, so a conversation is
built and persisted the same way everywhere: `turn_messages` is the one place a turn's messages
are built from the store (turns, the resume-cost preview, regenerate, edit-last-message), and
the engine's `Reply` the one place a reply's text is accumulated as it streams. A turn:

1. the user's message and an assistant row with status "interrupted" are written in one
   transaction once the engine accepted the turn (a crash later never loses the message, and a
   failed write leaves nothing half-done: the caller gives the text back to the user);
2. the reply's text is flushed as it streams (at most every `flush_s`), so a killed process
   leaves the partial reply;
3. at the end the row becomes "complete" (or stays "interrupted" on cancel, or "error") with the
   turn's stats.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from velo_chat.engine import (
    ChatMessage,
    EngineAPI,
    EngineEvent,
    Reply,
    TokenDelta,
    TurnDone,
    TurnFailed,
    TurnHandle,
)
from velo_chat.engine.config import Profile
from velo_chat.store import Message, Session, SessionStore, StoreError

from .errors import UserError

log = logging.getLogger(__name__)


def engine_messages(system_prompt: str, messages: Sequence[Message]) -> list[ChatMessage]:
    """The conversation the model sees: the session's system prompt, then every message that
    has text (failed replies with no text are left out). A reply's reasoning goes to the
    template as `reasoning_content`: the template decides where it shows (Qwen3 keeps only the
    last reply's) and whether at all."""
    out = [ChatMessage("system", system_prompt)] if system_prompt else []
    for m in messages:
        if m.role == "system" or (m.status == "error" and not m.content and not m.reasoning):
            continue
        out.append(ChatMessage(m.role, m.content, m.reasoning if m.role == "assistant" else ""))
    return out


def last_user_message(messages: Sequence[Message]) -> Message | None:
    """The last user message (regenerate and edit-last-message restart from it)."""
    return next((m for m in reversed(messages) if m.role == "user"), None)


@dataclass(frozen=True)
class TurnMessages:
    """What a turn that sends `text` now gives the engine, and where it goes in the store."""

    messages: list[ChatMessage]  # the session's system prompt, its history, then `text`
    text: str  # the user's message
    system_prompt: str  # the session's, or the profile's for a new session
    replace_after: int | None = None  # rewind: the stored messages after this position go


def turn_messages(
    store: SessionStore,
    session: Session | None,
    profile: Profile,
    text: str | None,
    *,
    rewind: bool = False,
) -> TurnMessages:
    """The one place a turn's messages are built from the store: for a turn (the TUI and
    `velo-chat ask`), the resume-cost preview, regenerate and edit-last-message.

    `rewind` replaces the last user message and everything after it: regenerate with the same
    text (`text` None: the stored question's), edit-last-message with a new one. A session
    with no user message raises `UserError`."""
    system_prompt = session.system_prompt if session else profile.system_prompt
    stored = store.messages(session.id) if session else []
    replace_after = None
    if rewind:
        last = last_user_message(stored)
        if session is None or last is None:
            raise UserError("the session has no user message to regenerate or edit")
        replace_after = last.position - 1
        stored = [m for m in stored if m.position < last.position]
        text = last.content if text is None else text
    if text is None:
        raise ValueError("a turn needs a text unless it asks the last question again")
    messages = engine_messages(system_prompt, stored) + [ChatMessage("user", text)]
    return TurnMessages(messages, text, system_prompt, replace_after)


@dataclass
class RecordedTurn:
    """Writes one turn's reply to the store as it streams.

    A store error (a locked or full disk) never stops the reply: the text keeps streaming and
    is kept here, the next flush tries again, and `saved`/`save_error` tell the caller whether
    the final row made it, so it can show the text and say it was not saved."""

    store: SessionStore
    session: Session
    user: Message
    reply: Message
    flush_s: float = 1.0
    streamed: Reply = field(default_factory=Reply)  # the reply so far
    saved: bool = True
    save_error: str | None = None
    _last_flush: float = field(default_factory=time.monotonic)

    def _update(self, **changes: Any) -> bool:
        try:
            self.reply = self.store.update_message(self.reply.id, **changes)
        except StoreError as exc:
            log.warning("could not save the reply: %s", exc)
            self.saved, self.save_error = False, str(exc)
            return False
        self.saved, self.save_error = True, None
        return True

    def feed(self, event: EngineEvent) -> None:
        self.streamed.feed(event)
        if isinstance(event, TokenDelta):
            now = time.monotonic()
            if now - self._last_flush >= self.flush_s:
                self._update(content=self.streamed.text, reasoning=self.streamed.reasoning)
                self._last_flush = now
        elif isinstance(event, TurnDone):
            # cancelled by the user, or cut by a remote server: what came is kept, marked so
            cut = event.stats.finish_reason in ("cancelled", "interrupted")
            status = "interrupted" if cut else "complete"
            self._update(
                content=event.text,
                reasoning=event.reasoning,
                status=status,
                prompt_tokens=event.stats.prompt_tokens,
                completion_tokens=event.stats.decode_tokens,
                stats=event.stats.to_json(),
            )
        elif isinstance(event, TurnFailed):
            self._update(
                content=event.text or self.streamed.text,
                reasoning=event.reasoning or self.streamed.reasoning,
                status="error",
                stats={"error": event.reason},
            )

    def interrupted(self) -> None:
        """The turn stopped without a final event (Ctrl-C, an exception): keep what streamed."""
        self._update(content=self.streamed.text, reasoning=self.streamed.reasoning, status="interrupted")


@dataclass(frozen=True)
class StartedTurn:
    session: Session
    created: bool  # a new session was made for this turn
    events: TurnHandle
    recorded: RecordedTurn


def start_turn(
    store: SessionStore,
    engine: EngineAPI,
    *,
    session: Session | None,
    profile: Profile,
    text: str,
    rewind: bool = False,
    **turn_kwargs: Any,
) -> StartedTurn:
    """Build the conversation, have the engine accept the turn, then write it.

    The engine sees the prompt first, so a user error (a prompt that does not fit, no chat
    template) raises before anything is stored. `rewind` replaces the last user message and
    everything after it (regenerate: the same text; edit-last-message: a new one) — deleted only
    once the engine has accepted the new turn."""
    planned = turn_messages(store, session, profile, text, rewind=rewind)
    events = engine.turn(planned.messages, **turn_kwargs)
    try:
        created = session is None
        if session is None:
            session = store.create_session(
                profile.name,
                system_prompt=planned.system_prompt,
                model_fingerprint=engine.info.fingerprint if engine.info else "",
            )
        try:
            user, reply = store.add_exchange(session.id, text, replace_after=planned.replace_after)
        except BaseException:
            if created:  # leave no empty session behind
                _delete_quietly(store, session.id)
            raise
    except BaseException:
        events.close()  # the engine's turn never started: release it
        raise
    session = store.get_session(session.id)  # its title and time changed with the message
    return StartedTurn(session, created, events, RecordedTurn(store, session, user, reply))


def _delete_quietly(store: SessionStore, session_id: str) -> None:
    try:
        store.delete(session_id)
    except StoreError:
        log.warning("could not remove the empty session %s", session_id, exc_info=True)


def record(events: Iterator[EngineEvent], turn: RecordedTurn) -> Iterator[EngineEvent]:
    """Pass events through while recording them; an early stop marks the reply interrupted."""
    finished = False
    try:
        for event in events:
            turn.feed(event)
            finished = finished or isinstance(event, (TurnDone, TurnFailed))
            yield event
    finally:
        if not finished:
            turn.interrupted()
