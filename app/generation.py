"""The body of the generation and preview workers, as plain functions (no widgets).

`run_turn` does what `velo-chat ask` does (app/commands/ask.py): build the conversation, ask the
engine for the turn first (a prompt that does not fit writes nothing), create the session if it
is new, persist the user message and a placeholder reply, then record every event while turning
it into a message for the screen via `post`. The screen's `@work` method calls it.
A turn that offers tools runs its steps in `generation_tools.py`; `/compact`'s worker is in
`generation_compaction.py`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from textual.message import Message

from velo_chat.engine import (
    DoesNotFit,
    EngineAPI,
    EngineEvent,
    EngineWarning,
    ModelLoaded,
    ModelLoading,
    PrefillProgress,
    Reply,
    TokenDelta,
    TurnDone,
    TurnFailed,
    TurnStarted,
    TurnStats,
    usable_cores,
)
from velo_chat.engine.config import Profile, ReasoningSettings
from velo_chat.store import Attachment, Session, SessionStore

from .generation_tools import run_tool_steps, turn_tools
from .conversation import RecordedTurn, record, start_turn, turn_messages
from .engine_host import EngineHost
from .errors import USER_ERRORS
from .stream_pacer import StreamPacer, ui_has_own_core
from .widgets.telemetry.meter import DecodeMeter
from .messages import (
    EngineNotice,
    ModelLoadFailed,
    ModelLoadProgress,
    ModelReady,
    PrefillUpdated,
    PreviewReady,
    TokensStreamed,
    TurnAccepted,
    TurnBegan,
    TurnEnded,
    TurnMakingRoom,
    TurnRejected,
    TurnWaiting,
)

log = logging.getLogger(__name__)
Post = Callable[[Message], Any]


@dataclass(frozen=True)
class TurnRequest:
    text: str
    session: Session | None  # None: create one when the engine accepts the turn
    profile: Profile
    attachments: tuple[Attachment, ...] = ()  # the files the message carries
    revise_at: int | None = None  # a revision: the turn runs in a fork before this message
    regenerate: bool = False  # the revision asks the stored question again (nothing to give back)
    working_dir: str | None = None  # a new session's folder (its attached paths are relative to it)
    reasoning: ReasoningSettings | None = None  # None: the profile's (the thinking key flips it)
    # Pace updates by the UI thread's CPU (stream_pacer.py). Tests turn it off: the pace would
    # depend on the machine, and a scripted engine's clock is not the UI's.
    paced: bool = True
    # The session's approval state for tools (the screen keeps one per session, so "allow for
    # the session" lasts); None: a new one from the profile. Used when `profile.tools.enabled`.
    tool_policy: Any = None

    @property
    def reasoning_settings(self) -> ReasoningSettings:
        return self.reasoning or self.profile.reasoning


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_load(
    host: EngineHost,
    profile: Profile,
    post: Post,
    cancel: threading.Event,
    load_id: int = 0,
    force: bool = False,
) -> None:
    """Make and load an engine for `profile`, posting progress; errors become a message.

    A switch never leaves the user with less than they had: the new model's file is checked
    (`engine.check()`, a header read) before the loaded engine is closed, so a missing or bad
    file keeps the old model running; if the load itself fails after the old engine was closed
    (two big models do not fit side by side), the previous profile is loaded again. The final
    message says which profile is running (`ModelReady`, or `ModelLoadFailed.active`).

    The check includes the fit check (docs/fit.md). The running model's memory counts as used
    there, so when the new one does not fit beside it, the running model is closed and the
    check made again: two big profiles on one machine can be switched. If it still does not
    fit, it is refused with its table (`ModelLoadFailed.refused`): the screen asks whether to
    load it anyway, and loads the closed profile (`ModelLoadFailed.closed`) again if not.
    `force`: the user chose to load anyway."""
    with host.lock:
        previous = host.loaded_profile

        def on_event(event: object) -> None:
            if isinstance(event, ModelLoading):
                post(ModelLoadProgress(event.progress, load_id))

        refused: DoesNotFit | None = None
        try:
            engine = host.factory(profile)
            _check(engine, force)
        except DoesNotFit as exc:
            refused = exc
        except Exception as exc:
            _log_load_failure(exc)
            post(ModelLoadFailed(_reason(exc), load_id, previous))
            return
        if refused is not None and previous is not None:
            log.info("%s; closing the running model and checking again", one_line(refused))
            host.close_locked()
            try:
                _check(engine, force)
                refused = None
            except DoesNotFit as exc:
                refused = exc
            except Exception as exc:  # the file went away meanwhile: the previous profile again
                refused = None
                _log_load_failure(exc)
                restored = _reload_previous(host, previous, on_event, cancel)
                post(ModelLoadFailed(_reason(exc), load_id, previous if restored else None, restored))
                return
        if refused is not None:
            log.warning("model load refused: %s", one_line(refused))
            table = refused.report.compact()
            post(
                ModelLoadFailed(
                    _reason(refused), load_id, None, refused=profile, fit_table=table, closed=previous
                )
            )
            return
        host.close_locked()
        host.engine = engine
        try:
            info = engine.load(on_event, cancel)
            thinking = engine.thinking_support()
        except Exception as exc:
            _log_load_failure(exc)
            host.close_locked()
            restored = None
            if previous is not None and not cancel.is_set():
                restored = _reload_previous(host, previous, on_event, cancel)
            post(ModelLoadFailed(_reason(exc), load_id, previous if restored else None, restored))
            return
    post(ModelReady(info, profile, load_id, thinking))


def _check(engine: EngineAPI, force: bool) -> None:
    try:
        engine.check()
    except DoesNotFit as exc:
        if not force:
            raise
        log.warning("loading anyway (the user chose to): %s", exc.report.summary())


def run_apply(host: EngineHost, profile: Profile) -> None:
    """Give the loaded engine the settings of `profile` that need no reload (it keeps its
    model and context settings; a change to those asks for a reload instead). Waits for a
    running turn to end: the turn finishes with the settings it started with."""
    with host.lock:
        engine = host.engine
        if engine is None or not engine.loaded or engine.profile == profile:
            return
        try:
            engine.apply(profile)
        except Exception:  # e.g. a checkpoint folder that cannot be made: the old settings stay
            log.exception("applying profile %r to the engine failed", profile.name)


def _reload_previous(host: EngineHost, previous: Profile, on_event, cancel: threading.Event):
    """Load the profile that ran before a failed switch; its `ModelLoaded`, or None."""
    try:
        engine = host.factory(previous)
        host.engine = engine
        return engine.load(on_event, cancel)
    except Exception:
        log.exception("reloading the previous profile %r failed", previous.name)
        host.close_locked()
        return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, USER_ERRORS):
        return one_line(exc)
    return f"{type(exc).__name__}: {one_line(exc)}"


def _log_load_failure(exc: BaseException) -> None:
    if isinstance(exc, USER_ERRORS):
        log.warning("model load failed: %s", one_line(exc))
    else:  # a bug, but the UI must say so instead of dying
        log.error("model load failed", exc_info=exc)


def run_turn(
    host: EngineHost,
    store: SessionStore,
    req: TurnRequest,
    post: Post,
    cancel: threading.Event,
    is_cancelled: Callable[[], bool],
) -> None:
    """One turn, start to end. Every outcome ends in exactly one final message: `TurnRejected`
    (nothing was stored: the text goes back to the composer) or `TurnEnded` (the user's message
    is stored; the reply shows what was generated, saved or not)."""
    with host.lock:
        engine = host.engine
        if engine is None or engine.info is None:
            post(TurnRejected("the model is not loaded", req.text, req.attachments, not req.regenerate))
            return
        try:
            tools = turn_tools(req) if req.profile.tools.enabled else None
            started = start_turn(
                store,
                engine,
                session=req.session,
                profile=req.profile,
                text=req.text,
                attachments=req.attachments,
                revise_at=req.revise_at,
                working_dir=req.working_dir,
                on_wait=lambda holder: post(TurnWaiting(holder)),
                sampling=req.profile.sampling,
                reasoning=req.reasoning_settings,
                cancel=cancel,
                on_compact=lambda line: post(TurnMakingRoom(line)),
                **(tools.turn_kwargs() if tools is not None else {}),
            )
        except Exception as exc:  # nothing was stored (start_turn writes in one transaction)
            if not isinstance(exc, USER_ERRORS):
                log.exception("a turn could not start")
            post(TurnRejected(_reason(exc), req.text, req.attachments, not req.regenerate))
            return
        turn = started.recorded
        post(
            TurnAccepted(
                started.session,
                started.created,
                turn.user,
                turn.reply,
                started.forked_from,
                started.compacted_from,
            )
        )
        if tools is not None:
            run_tool_steps(tools, store, engine, started, req, post, cancel, is_cancelled)
        else:
            _stream(engine.info, turn, started.events, post, cancel, is_cancelled, req.paced)


def ui_shares_cores(info: ModelLoaded) -> bool:
    """Whether the decode's threads leave no core of its own to the UI thread (then every frame
    the UI draws is taken from the decode: `stream_pacer.py`, `ui_has_own_core`)."""
    return info.threads is not None and not ui_has_own_core(usable_cores(), info.threads.decode)


def _pacer(info: ModelLoaded, paced: bool = True) -> StreamPacer:
    """Paces `TokensStreamed` by the UI thread's rendering cost (see `stream_pacer.py`);
    unpaced: at the fixed minimum interval, in the events' own time."""
    if not paced:
        return StreamPacer(None, ui_has_own_core=True)
    return StreamPacer(threading.main_thread().ident, ui_has_own_core=not ui_shares_cores(info))


def _stream(
    info: ModelLoaded,
    turn: RecordedTurn,
    events: Iterator[EngineEvent],
    post: Post,
    cancel: threading.Event,
    is_cancelled: Callable[[], bool],
    paced: bool = True,
) -> None:
    done, failed = stream_reply(info, turn, record(events, turn), post, cancel, is_cancelled, paced)
    post_ended(turn, done.stats if done is not None else None, failed, post)


def post_ended(
    turn: RecordedTurn, stats: TurnStats | None, failed: str | None, post: Post | None = None
) -> TurnEnded:
    """The turn's final message. The text is what the user saw stream: the stored row may lag
    (flushed once a second) or not be writable at all (a store error)."""
    reply = turn.streamed
    ended = TurnEnded(
        turn.reply,
        stats,
        failed,
        text=reply.text,
        saved=turn.saved,
        save_error=turn.save_error,
        reasoning=reply.reasoning,
        empty_reason=turn.empty_reason,
    )
    if post is not None:
        post(ended)
    return ended


def stream_reply(
    info: ModelLoaded,
    turn: RecordedTurn,
    events: Iterator[EngineEvent],
    post: Post,
    cancel: threading.Event,
    is_cancelled: Callable[[], bool],
    paced: bool = True,
) -> tuple[TurnDone | None, str | None]:
    """Post a reply's events as it streams (`events` already pass through `record`); its final
    event and why it failed (None: it did not)."""
    reply = turn.streamed  # fed by `record` before each event comes here
    pacer = _pacer(info, paced)
    meter = DecodeMeter()  # the sparkline's samples, over every token (not every update)
    pending = False
    stats: TurnDone | None = None
    failed = None
    try:
        for event in events:
            if is_cancelled():
                cancel.set()
            if isinstance(event, TokenDelta):
                pending = True
                meter.update(reply.n_tokens, reply.t_first or event.t, event.t)
                if pacer.due(event.t):
                    post(_streamed(reply, meter))
                    pacer.posted(event.t)
                    pending = False
            elif isinstance(event, PrefillProgress):
                post(PrefillUpdated(event))
            elif isinstance(event, TurnStarted):
                post(TurnBegan(event, info.n_ctx))
            elif isinstance(event, EngineWarning):
                post(EngineNotice(event.message))
            elif isinstance(event, TurnDone):
                stats = event
                if pending:  # the final text, with held-back text flushed
                    post(_streamed(reply, meter))
            elif isinstance(event, TurnFailed):
                failed = event.reason
    except Exception as exc:  # record() already tried to mark the reply interrupted
        if not isinstance(exc, USER_ERRORS):
            log.exception("turn crashed")
        failed = _reason(exc)
    return stats, failed


def _streamed(reply: Reply, meter: DecodeMeter) -> TokensStreamed:
    """Posted only after a token arrived, so the reply has its first and last token times."""
    assert reply.t_first is not None and reply.t_last is not None
    return TokensStreamed(
        reply.text,
        reply.n_tokens,
        reply.t_first,
        reply.t_last,
        reply.reasoning,
        reply.n_reasoning,
        tuple(meter.samples),
    )


def _log_preview_failure(host: EngineHost, exc: BaseException) -> None:
    """A preview runs on every pause in typing: log each distinct failure once, not per key."""
    what = f"{type(exc).__name__}: {one_line(exc)}"
    if what != host.last_preview_failure:
        host.last_preview_failure = what
        log.warning("resume preview failed: %s", what, exc_info=exc)


def run_preview(host: EngineHost, store: SessionStore, req: TurnRequest, post: Post) -> None:
    """The resume cost of sending `req` now; skipped (no message) while a turn holds the lock."""
    if not host.lock.acquire(blocking=False):
        return
    try:
        engine = host.engine
        if engine is None or not host.loaded:
            return
        file_tokens: tuple[int | None, ...] = ()
        try:
            planned = turn_messages(
                store,
                req.session,
                req.profile,
                req.text,
                attachments=req.attachments,
                revise_at=req.revise_at,
            )
            specs = turn_tools(req).toolbox.specs if req.profile.tools.enabled else ()
            preview = engine.preview(planned.messages, reasoning=req.reasoning_settings, tools=specs)
            file_tokens = tuple(host.file_tokens(engine, a) for a in req.attachments)
        except Exception as exc:  # a preview is a hint: never an error dialog, but recorded
            _log_preview_failure(host, exc)
            preview = None
    finally:
        host.lock.release()
    post(PreviewReady(preview, file_tokens))
