"""A turn in a stored session: the glue between the session store and the engine, with no UI.

The CLI (`velo-chat ask`) and the TUI's generation worker both use it, so a conversation is
built and persisted the same way everywhere: `turn_messages` is the one place a turn's messages
are built from the store (turns, the resume-cost preview, revisions), and the engine's `Reply`
the one place a reply's text is accumulated as it streams.

History is never rewritten: revising a message or answering one again (`revisions.py`) runs the
turn in a fork that holds the messages before it, so the session, and every checkpoint saved
for it, stay as they were; the fork's prefix is the session's, so it resumes from those
checkpoints. A turn:

0. it takes the session's writer lock (`SessionStore.writer`), so a second process (another
   `ask`, the TUI) waits instead of interleaving its turn, and reads the history under it;
1. the user's message and an assistant row with status "interrupted" are written in one
   transaction once the engine accepted the turn (a crash later never loses the message, and a
   failed write leaves nothing half-done: the caller gives the text back to the user);
2. the reply's text is flushed as it streams (at most every `flush_s`), so a killed process
   leaves the partial reply;
3. at the end the row becomes "complete" (or stays "interrupted" on cancel, or "error") with the
   turn's stats.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from velo_chat.engine import (
    ChatMessage,
    EngineAPI,
    EngineEvent,
    PromptTooLong,
    Reply,
    TokenDelta,
    ToolCall,
    TurnDone,
    TurnFailed,
    TurnHandle,
    render_block,
    render_user_content,
)
from velo_chat.engine.config import Profile
from velo_chat.store import Attachment, Message, Session, SessionStore, StoreError

from .attachments import room_refusal
from .errors import UserError

log = logging.getLogger(__name__)


def engine_messages(
    system_prompt: str, messages: Sequence[Message], *, view_start: int = 0
) -> list[ChatMessage]:
    """The conversation the model sees: the session's system prompt, then every message that
    has text (failed replies with no text are left out). A user message's attached files come
    before its typed text (`attachments.render_user_content`). A reply's reasoning goes to the
    template as `reasoning_content`: the template decides where it shows (Qwen3 keeps only the
    last reply's) and whether at all.

    `view_start` (`Session.view_start`, after the oldest turns were dropped from the model's
    view): the messages before that position are left out, but the pinned files among them
    are not: the latest version of each, unless the view attaches that path again, opens the
    first user message in view, before that message's own files (docs/compaction.md)."""
    out = [ChatMessage("system", system_prompt)] if system_prompt else []
    carried = carried_files(messages, view_start) if view_start else ()
    for m in messages:
        if m.position < view_start:
            continue
        if m.role == "system" or (m.status == "error" and not m.content and not m.reasoning):
            continue
        if m.role == "user":
            files = (*carried, *m.attachments)
            carried = ()
            out.append(ChatMessage("user", render_user_content(files, m.content)))
        elif m.tool_calls:
            out.extend(tool_step_messages(m))
        else:
            out.append(ChatMessage(m.role, m.content, m.reasoning if m.role == "assistant" else ""))
    return out


NOT_RUN = "Not run: the tool loop stopped before this call was decided."
"""The result the model sees for a call that never got one (a quit or a crash mid-loop), so the
history stays a well-formed conversation."""


def tool_step_messages(m: Message) -> list[ChatMessage]:
    """A reply that made tool calls, as the model sees it: the reply with its calls, then one
    `tool` message per call with what came of it, in call order."""
    calls = tuple(ToolCall(c.name, c.arguments, c.id, c.text, c.error) for c in m.tool_calls)
    out = [ChatMessage("assistant", m.content, m.reasoning, calls)]
    results = {r.call_index: r for r in m.tool_results}
    for i, c in enumerate(calls):
        result = results.get(i)
        out.append(ChatMessage("tool", result.content if result else NOT_RUN, tool_call_id=c.id, name=c.name))
    return out


def pinned_files(messages: Sequence[Message]) -> tuple[Attachment, ...]:
    """The latest version of each pinned file among `messages` (a path is pinned once any
    message attached it pinned; its latest version is the last one attached, pinned or not),
    marked pinned, in the order of those latest versions. What a compaction's continuation and
    a view without its oldest turns keep showing the model."""
    pinned = {a.path for m in messages if m.role == "user" for a in m.attachments if a.pinned}
    latest: dict[str, Attachment] = {}
    for m in messages:
        for a in m.attachments if m.role == "user" else ():
            if a.path in pinned:
                latest.pop(a.path, None)  # re-inserted: the order is that of the latest versions
                latest[a.path] = dataclasses.replace(a, pinned=True)
    return tuple(latest.values())


def carried_files(messages: Sequence[Message], view_start: int) -> tuple[Attachment, ...]:
    """The pinned files of the messages before `view_start` that the view does not attach
    again: they open the first user message in view (`engine_messages`)."""
    before = [m for m in messages if m.position < view_start]
    in_view = {a.path for m in messages if m.position >= view_start for a in m.attachments}
    return tuple(a for a in pinned_files(before) if a.path not in in_view)


@dataclass(frozen=True)
class TurnMessages:
    """What a turn that sends `text` now gives the engine, and where it goes in the store."""

    messages: list[ChatMessage]  # the session's system prompt, its history, then the new message
    text: str  # the user's typed text
    attachments: tuple[Attachment, ...]  # the files it carries
    system_prompt: str  # the session's, or the profile's for a new session
    fork_before: int | None = None  # a revision: the turn runs in a fork of the messages before this


def turn_messages(
    store: SessionStore,
    session: Session | None,
    profile: Profile,
    text: str,
    *,
    attachments: Sequence[Attachment] = (),
    revise_at: int | None = None,
) -> TurnMessages:
    """The one place a turn's messages are built from the store: for a turn (the TUI and
    `velo-chat ask`), the resume-cost preview, and revisions.

    `revise_at`: the turn revises the session at that user message (`Revision.position`): the
    history is the messages before it, and the turn is stored in a fork (`start_turn`)."""
    system_prompt = session.system_prompt if session else profile.system_prompt
    stored = store.messages(session.id) if session else []
    view_start = session.view_start if session else 0
    if revise_at is not None:
        if session is None:
            raise UserError("a revision needs a session")
        stored = [m for m in stored if m.position < revise_at]
        view_start = view_start if view_start < revise_at else 0  # as `fork_before` sets the fork's
    files = tuple(attachments)
    new = ChatMessage("user", render_user_content(files, text))
    history = engine_messages(system_prompt, stored, view_start=view_start)
    return TurnMessages(history + [new], text, files, system_prompt, revise_at)


def check_room(engine: EngineAPI, planned: TurnMessages, *, history: bool = True) -> None:
    """Refuse attached files that do not fit the context's room, saying both token counts
    (`UserError`, before anything is stored). The engine would refuse the whole prompt anyway;
    this says which part is too big. A remote engine cannot count tokens: its server refuses.
    `history` False: the room is that of a conversation holding only the system prompt and the
    typed text (a full context's policy can make room for the rest: docs/compaction.md)."""
    if not planned.attachments or engine.info is None:
        return
    counts = [engine.count_tokens(render_block(a)) for a in planned.attachments]
    known = [c for c in counts if c is not None]
    if len(known) < len(counts):
        return
    before = planned.messages[:-1]
    if not history:
        before = [ChatMessage("system", planned.system_prompt)] if planned.system_prompt else []
    without_files = before + [ChatMessage("user", planned.text)]
    prompt_tokens = engine.preview(without_files).prompt_tokens
    refusal = room_refusal(sum(known), prompt_tokens, engine.info.n_ctx)
    if refusal:
        raise UserError(refusal)


def empty_reply_reason(done: TurnDone) -> str | None:
    """Why a complete reply has no text at all (stored with it and said to the user), or None
    when it has some. A reply is never stored empty and complete without a reason."""
    if (
        done.text
        or done.reasoning
        or done.tool_calls
        or done.stats.finish_reason in ("cancelled", "interrupted")
    ):
        return None
    return f"the model ended its reply before writing anything (finish reason: {done.stats.finish_reason})"


@dataclass
class RecordedTurn:
    """Writes one turn's reply to the store as it streams.

    A store error (a locked or full disk) never stops the reply: the text keeps streaming and
    is kept here, the next flush tries again, and `saved`/`save_error` tell the caller whether
    the final row made it, so it can show the text and say it was not saved. `release` lets go
    of the session's writer lock (`SessionStore.writer`) once the reply is stored."""

    store: SessionStore
    session: Session
    user: Message
    reply: Message
    flush_s: float = 1.0
    streamed: Reply = field(default_factory=Reply)  # the reply so far
    saved: bool = True
    save_error: str | None = None
    empty_reason: str | None = None  # set when the reply ended complete with no text
    release: Callable[[], None] = lambda: None
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
            stats = event.stats.to_json()
            self.empty_reason = empty_reply_reason(event)
            if self.empty_reason:
                stats["empty_reply"] = self.empty_reason
            self._update(
                content=event.text,
                reasoning=event.reasoning,
                status=status,
                prompt_tokens=event.stats.prompt_tokens,
                completion_tokens=event.stats.decode_tokens,
                stats=stats,
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
    created: bool  # a new session was made for this turn (a first turn, or a revision's fork)
    events: TurnHandle
    recorded: RecordedTurn
    forked_from: Session | None = None  # a revision: the session the fork was taken from
    compacted_from: Session | None = None  # the context was full: the session compacted into this one


def start_turn(
    store: SessionStore,
    engine: EngineAPI,
    *,
    session: Session | None,
    profile: Profile,
    text: str,
    attachments: Sequence[Attachment] = (),
    revise_at: int | None = None,
    working_dir: str | None = None,
    on_wait: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
    on_compact: Callable[[str], None] | None = None,
    when_full: str | None = None,
    **turn_kwargs: Any,
) -> StartedTurn:
    """Build the conversation, have the engine accept the turn, then write it.

    One writer per session: a turn that adds to a stored session holds its writer lock
    (`SessionStore.writer`) from reading the history until the reply is stored (released by
    `record`), so two processes never interleave their turns; `on_wait` is told once when
    another holds it, and `cancel` stops the wait (`SessionBusy`). The engine sees the prompt
    before anything is written, so a user error (a prompt that does not fit, no chat template)
    leaves the store as it was. `revise_at`: the turn runs in a new fork of the session holding
    the messages before that position (the session itself is not changed). A new session
    records `working_dir`, the folder its attached paths are relative to.

    A full context (docs/compaction.md): when the turn would fill `context.compact_at` of it, or
    not fit, `when_full` (the profile's `context.when_full` unless given) acts first, under the
    session's lock: "compact" summarizes the session into a continuation and runs the turn
    there (`StartedTurn.compacted_from` is the original, unchanged), "drop_oldest" moves the
    session's view past its oldest turns, "refuse" refuses a turn that does not fit.
    `on_compact` hears one line saying which, before it starts. A compaction that fails or is
    cancelled raises `CompactionFailed` with nothing stored."""
    with contextlib.ExitStack() as lock:
        if session is not None and revise_at is None:
            lock.enter_context(store.writer(session.id, on_wait=on_wait, cancel=cancel))
            session = store.get_session(session.id)  # another process may have changed it
        planned = turn_messages(store, session, profile, text, attachments=attachments, revise_at=revise_at)
        policy = when_full or profile.context.when_full
        makes_room = session is not None and revise_at is None and policy in ("compact", "drop_oldest")
        check_room(engine, planned, history=not makes_room)
        compacted_from = None
        if session is not None and revise_at is None:
            target = _make_room(
                store,
                engine,
                session,
                profile,
                planned,
                policy=policy,
                on_compact=on_compact,
                cancel=cancel,
                reasoning=turn_kwargs.get("reasoning"),
            )
            if target.id != session.id:  # a continuation: no one else may write it either
                lock.enter_context(store.writer(target.id, cancel=cancel))
                compacted_from = session
            if target != session:
                session = target
                planned = turn_messages(store, session, profile, text, attachments=attachments)
        events = engine.turn(planned.messages, cancel=cancel, **turn_kwargs)
        parent = session if revise_at is not None else None
        try:
            created = session is None or revise_at is not None
            if session is None:
                session = store.create_session(
                    profile.name,
                    system_prompt=planned.system_prompt,
                    model_fingerprint=engine.info.fingerprint if engine.info else "",
                    working_dir=working_dir,
                )
            elif revise_at is not None:
                session = store.fork_before(session.id, revise_at)
            try:
                user, reply = store.add_exchange(session.id, text, attachments=planned.attachments)
            except BaseException:
                if created:  # leave no empty session (or empty fork) behind
                    _delete_quietly(store, session.id)
                raise
        except BaseException:
            events.close()  # the engine's turn never started: release it
            raise
        session = store.get_session(session.id)  # its title and time changed with the message
        recorded = RecordedTurn(store, session, user, reply, release=lock.pop_all().close)
    made = created or compacted_from is not None
    return StartedTurn(session, made, events, recorded, parent, compacted_from)


def _make_room(
    store: SessionStore,
    engine: EngineAPI,
    session: Session,
    profile: Profile,
    planned: TurnMessages,
    *,
    policy: str,
    on_compact: Callable[[str], None] | None,
    cancel: threading.Event | None,
    reasoning: Any,
) -> Session:
    """Apply the `when_full` policy when the turn needs room (`compaction.needs_room`); where
    the turn runs: the session (its view moved, maybe) or its continuation. A turn whose own
    message (with the system prompt) does not fit the context is left to the engine, which
    refuses it as too long: no policy can help it."""
    from . import compaction  # it builds on this module's conversations

    fill = compaction.fill(engine, planned, profile, reasoning=reasoning)
    if not compaction.needs_room(fill, profile):
        return session
    if policy == "refuse" or policy not in compaction.WHEN_FULL:
        if not fill.fits:
            raise PromptTooLong(
                f"the conversation is {fill.prompt_tokens:,} tokens but the context holds {fill.n_ctx:,} "
                '(context.when_full is "refuse": set it to "compact" or "drop_oldest", raise '
                "context.n_ctx, or start a new session)"
            )
        return session
    bare = planned.messages[-1:]
    if planned.system_prompt:
        bare = [ChatMessage("system", planned.system_prompt), *bare]
    if engine.preview(bare, reasoning=reasoning).prompt_tokens >= fill.n_ctx:
        return session  # the message alone does not fit: the engine says so
    say = on_compact or (lambda _line: None)
    pending = planned.messages[-1]
    if policy == "drop_oldest":
        say(
            f"the context is {fill.percent}% full: dropping the oldest turns of session "
            f"{session.id[:8]} from the model's view ..."
        )
        return compaction.drop_oldest(store, engine, session, profile, pending=pending, reasoning=reasoning)
    say(f"the context is {fill.percent}% full: compacting session {session.id[:8]} into a continuation ...")
    done = compaction.compact(
        store, engine, session, profile, cancel=cancel, pending=pending, reasoning=reasoning
    )
    return done.session


def _delete_quietly(store: SessionStore, session_id: str) -> None:
    try:
        store.delete(session_id)
    except StoreError:
        log.warning("could not remove the empty session %s", session_id, exc_info=True)


def record(events: Iterator[EngineEvent], turn: RecordedTurn) -> Iterator[EngineEvent]:
    """Pass events through while recording them; an early stop marks the reply interrupted.
    The session's writer lock is released once the reply is stored, however the turn ends."""
    finished = False
    try:
        for event in events:
            turn.feed(event)
            finished = finished or isinstance(event, (TurnDone, TurnFailed))
            yield event
    finally:
        try:
            if not finished:
                turn.interrupted()
        finally:
            turn.release()
