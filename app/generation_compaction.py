"""The body of the `/compact` worker, as a plain function (no widgets): `run_compaction`
summarizes the active session into a continuation (`app/compaction.py`), under the engine lock
and the session's writer lock, as a turn takes them (`generation.run_turn`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from velo_chat.engine import EngineEvent, PrefillProgress, TokenDelta
from velo_chat.engine.config import Profile, ReasoningSettings
from velo_chat.store import Session, SessionStore

from .compaction import compact
from .engine_host import EngineHost
from .errors import USER_ERRORS
from .generation import Post, _reason
from .messages import CompactionMade, CompactionNotMade, CompactionProgressed, TurnWaiting

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompactRequest:
    """`/compact [focus]` on `session`."""

    session: Session
    profile: Profile
    text: str  # the command as typed (given back when nothing is made)
    focus: str | None = None  # what the summary should focus on
    reasoning: ReasoningSettings | None = None  # the next turns' (the continuation is warmed for them)


def run_compaction(
    host: EngineHost, store: SessionStore, req: CompactRequest, post: Post, cancel: threading.Event
) -> None:
    """Summarize the session into a continuation (`compaction.compact`), holding the engine and
    the session's writer lock as a turn does. Ends in exactly one message: `CompactionMade`, or
    `CompactionNotMade` (nothing stored: cancelled, failed, or refused)."""
    with host.lock:
        engine = host.engine
        if engine is None or engine.info is None:
            post(CompactionNotMade("the model is not loaded", req.text))
            return
        try:
            with store.writer(req.session.id, on_wait=_waiting(post), cancel=cancel):
                done = compact(
                    store,
                    engine,
                    req.session,
                    req.profile,
                    focus=req.focus,
                    cancel=cancel,
                    on_event=_compaction_progress(post),
                    reasoning=req.reasoning,
                )
        except Exception as exc:  # `compact` stores nothing unless it succeeded
            if not isinstance(exc, USER_ERRORS):
                log.exception("a compaction failed")
            post(CompactionNotMade(_reason(exc), req.text))
            return
    post(CompactionMade(done.parent, done.session, done.kept_turns, done.stats.decode_tokens))


def _waiting(post: Post) -> Callable[[str], None]:
    """An `on_wait` for the session's writer lock: another process is taking a turn in it."""
    return lambda holder: post(TurnWaiting(holder))


def _compaction_progress(post: Post) -> Callable[[EngineEvent], None]:
    """An `on_event` for the summary turn: its prefill, then how many tokens it has written."""
    n_tokens = 0

    def on_event(event: EngineEvent) -> None:
        nonlocal n_tokens
        if isinstance(event, PrefillProgress):
            post(CompactionProgressed(event))
        elif isinstance(event, TokenDelta):
            n_tokens += 1
            post(CompactionProgressed(None, n_tokens))

    return on_event
