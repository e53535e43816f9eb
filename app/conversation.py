"""A turn in a stored session: the glue between the session store and the engine, with no UI.

The CLI (`velo-chat ask`) and the TUI's generation worker both use it, so a conversation is
built and persisted the same way everywhere:

1. the user's message is written first (a crash later never loses it);
2. an assistant row is written at once with status "interrupted", and its text is flushed as it
   streams (at most every `flush_s`), so a killed process leaves the partial reply;
3. at the end the row becomes "complete" (or stays "interrupted" on cancel, or "error") with the
   turn's stats.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from velo_chat.engine.chat_template import ChatMessage
from velo_chat.engine.events import EngineEvent, TokenDelta, TurnDone, TurnFailed
from velo_chat.engine.profile_schema import Profile
from velo_chat.store import Message, Session, SessionStore

from .errors import UserError


def engine_messages(system_prompt: str, messages: Sequence[Message]) -> list[ChatMessage]:
    """The conversation the model sees: the session's system prompt, then every message that
    has text (failed replies with no text are left out)."""
    out = [ChatMessage("system", system_prompt)] if system_prompt else []
    for m in messages:
        if m.role == "system" or (m.status == "error" and not m.content):
            continue
        out.append(ChatMessage(m.role, m.content))
    return out


@dataclass
class RecordedTurn:
    """Writes one turn's reply to the store as it streams."""

    store: SessionStore
    session: Session
    reply: Message
    flush_s: float = 1.0
    text: list[str] = field(default_factory=list)
    _last_flush: float = field(default_factory=time.monotonic)

    def feed(self, event: EngineEvent) -> None:
        if isinstance(event, TokenDelta):
            if event.text:
                self.text.append(event.text)
            now = time.monotonic()
            if now - self._last_flush >= self.flush_s:
                self.store.update_message(self.reply.id, content="".join(self.text))
                self._last_flush = now
        elif isinstance(event, TurnDone):
            status = "interrupted" if event.stats.finish_reason == "cancelled" else "complete"
            self.reply = self.store.update_message(
                self.reply.id, content=event.text, status=status,
                prompt_tokens=event.stats.prompt_tokens,
                completion_tokens=event.stats.decode_tokens, stats=event.stats.to_json(),
            )
        elif isinstance(event, TurnFailed):
            self.reply = self.store.update_message(
                self.reply.id, content=event.text or "".join(self.text), status="error",
                stats={"error": event.reason},
            )

    def interrupted(self) -> None:
        """The turn stopped without a final event (Ctrl-C, an exception): keep what streamed."""
        self.reply = self.store.update_message(
            self.reply.id, content="".join(self.text), status="interrupted"
        )


def last_user_message(messages: Sequence[Message]) -> Message | None:
    """The last user message (regenerate and edit-last-message restart from it)."""
    return next((m for m in reversed(messages) if m.role == "user"), None)


@dataclass(frozen=True)
class StartedTurn:
    session: Session
    created: bool  # a new session was made for this turn
    events: Iterator[EngineEvent]
    recorded: RecordedTurn


def start_turn(store: SessionStore, engine: Any, *, session: Session | None, profile: Profile,
               text: str, rewind: bool = False, **turn_kwargs: Any) -> StartedTurn:
    """Build the conversation, have the engine accept the turn, then write it.

    The engine sees the prompt first, so a user error (a prompt that does not fit, no chat
    template) raises before anything is stored. `rewind` replaces the last user message and
    everything after it (regenerate: the same text; edit-last-message: a new one) — deleted only
    once the engine has accepted the new turn."""
    system_prompt = session.system_prompt if session else profile.system_prompt
    stored = store.messages(session.id) if session else []
    cut = None
    if rewind:
        last = last_user_message(stored)
        if session is None or last is None:
            raise UserError("the session has no user message to regenerate or edit")
        cut = last.position
        stored = [m for m in stored if m.position < cut]
    messages = engine_messages(system_prompt, stored) + [ChatMessage("user", text)]
    events = engine.turn(messages, **turn_kwargs)
    created = session is None
    if session is None:
        session = store.create_session(profile.name, system_prompt=system_prompt,
                                       model_fingerprint=engine.model.fingerprint)
    elif cut is not None:
        store.delete_messages_after(session.id, cut - 1)
    return StartedTurn(session, created, events, begin_turn(store, session, text))


def begin_turn(store: SessionStore, session: Session, user_text: str) -> RecordedTurn:
    """Persist the user's message and a placeholder reply (call it once the engine accepted the
    turn, so a rejected prompt writes nothing)."""
    store.add_message(session.id, "user", user_text)
    reply = store.add_message(session.id, "assistant", "", status="interrupted")
    return RecordedTurn(store, session, reply)


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
