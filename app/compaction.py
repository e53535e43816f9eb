"""A full context is not a dead end: compaction and dropping the oldest turns (no Textual).

When the next turn's prompt fills the context to `context.compact_at` (or would not fit at all),
`context.when_full` decides (docs/compaction.md):

- "compact" (`compact`): a summary request is appended to the conversation the model sees, as a
  user message, and answered like any turn. The prompt is the history plus that request, so the
  history comes from the live context or a checkpoint and only the request is prefilled. The
  answer opens a *continuation*: a new session linked to the original (which stays whole)
  holding the request with the pinned files, the summary, and the last turns word for word, as
  many as `keep_share` of the context holds. Its prefill is checkpointed at once
  (`EngineAPI.warm`), so the turn after it resumes warm, in this process or a new one.
- "drop_oldest" (`drop_oldest`): the session's `view_start` moves forward by whole turns until
  the next turn fits below `compact_at`; the messages before it stay stored and shown, the
  pinned files among them are carried into the first message in view (`pinned_files`,
  `conversation.engine_messages`), and the new view is prefilled and checkpointed at once.
- "refuse": a turn that does not fit is refused, in one line naming the settings.

Nothing is stored unless the whole compaction succeeded: a cancelled, failed or empty summary
turn, or a continuation that could not hold the summary and the pinned files, raises
`CompactionFailed` (one line) with the store as it was. The caller holds the session's writer
lock (`SessionStore.writer`) around `compact` and `drop_oldest`, as `start_turn` does.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from velo_chat.engine import (
    ChatMessage,
    EngineAPI,
    EngineEvent,
    TurnDone,
    TurnFailed,
    TurnStats,
    render_user_content,
)
from velo_chat.engine.config import Profile, ReasoningSettings
from velo_chat.store import Message, NewMessage, Session, SessionStore

from .conversation import TurnMessages, engine_messages, pinned_files
from .errors import UserError

log = logging.getLogger(__name__)

WHEN_FULL = ("compact", "drop_oldest", "refuse")
"""The policies of `context.when_full`."""

SUMMARY_SHARE = 0.15
"""Most of the context a summary may take (and never more than `sampling.max_tokens`): it and
the pinned files must leave the continuation room for the turns it keeps and the next one."""

MIN_SUMMARY_TOKENS = 16
"""The fewest tokens a summary turn is given room for; less is no summary."""

TURN_OVERHEAD_TOKENS = 16
"""What a kept turn costs beyond its text (the template's tokens around two messages), when the
turns a continuation keeps are counted one by one (`engine.count_tokens`)."""

CHARS_PER_TOKEN = 4
"""Where an engine cannot count tokens (a remote one), a kept turn is estimated at this rate."""

DROP_HEADROOM = 0.2
"""How far below `compact_at` (a share of the context) `drop_oldest` aims the next turn: every
drop costs a prefill of the whole view that is left (the tokens after the dropped turns move),
so it drops enough for the next several turns to run warm, not just enough for one."""


class CompactionFailed(UserError):
    """A compaction or a drop could not be made; nothing was stored. One line for the user."""


@dataclass(frozen=True)
class Fill:
    """How full the context is with the turn about to be sent (`fill`)."""

    prompt_tokens: int  # the turn's whole prompt (0: the engine cannot count, a remote one)
    n_ctx: int  # the context's size (0: not loaded)
    fraction: float  # prompt_tokens / n_ctx (0.0 when either is unknown)
    turns_left: int | None  # about how many more turns of the session's size before `when_full` acts
    tokens_per_turn: float | None = None  # the session's average, which `turns_left` is reckoned at

    @property
    def known(self) -> bool:
        """Whether the engine could count the prompt (a remote engine cannot)."""
        return self.n_ctx > 0 and self.prompt_tokens > 0

    @property
    def fits(self) -> bool:
        """Whether the prompt fits the context at all (unknown counts as fitting: the server
        decides)."""
        return not self.known or self.prompt_tokens < self.n_ctx

    @property
    def percent(self) -> int:
        return round(self.fraction * 100)


@dataclass(frozen=True)
class Compacted:
    """A compaction that succeeded: the continuation (stored, linked to `parent`), the summary
    and the summary turn's numbers."""

    session: Session  # the continuation
    parent: Session  # the session it continues (unchanged)
    summary: str
    stats: TurnStats  # the summary turn's (cached_tokens: the history it reused)
    kept_turns: int  # turns of the parent copied word for word after the summary
    warmed_tokens: int | None  # tokens the continuation's prefill took (None: not warmed)


# -- how full ---------------------------------------------------------------------------------------


def fill(
    engine: EngineAPI,
    planned: TurnMessages,
    profile: Profile,
    *,
    reasoning: ReasoningSettings | None = None,
) -> Fill:
    """How full the context is with `planned` (the turn about to be sent), and about how many
    turns of the session's average size are left before `when_full` acts (`compact_at` of the
    context; the whole context for "refuse"). `reasoning`: the settings the turn runs with
    (they can change the prompt). A remote engine cannot count: the fill is unknown (all 0)."""
    n_ctx = engine.info.n_ctx if engine.info is not None else 0
    prompt = engine.preview(planned.messages, reasoning=reasoning).prompt_tokens if n_ctx else 0
    if n_ctx <= 0 or prompt <= 0:
        return Fill(prompt, n_ctx, 0.0, None)
    turns = sum(1 for m in planned.messages if m.role == "user")
    per_turn = prompt / turns if turns else None
    limit = n_ctx if profile.context.when_full == "refuse" else profile.context.compact_at * n_ctx
    left = max(0, int((limit - prompt) // per_turn)) if per_turn else None
    return Fill(prompt, n_ctx, prompt / n_ctx, left, per_turn)


def needs_room(fill: Fill, profile: Profile) -> bool:
    """Whether `when_full` should act before the turn: the prompt fills `compact_at` of the
    context, or does not fit at all."""
    return fill.known and (fill.fraction >= profile.context.compact_at or not fill.fits)


# -- compact -----------------------------------------------------------------------------------------


def summary_request(profile: Profile, focus: str | None = None) -> str:
    """The text of the summary request: the profile's `summary_prompt`, and what to focus on."""
    text = profile.context.summary_prompt.strip()
    if focus and focus.strip():
        text += "\n\nFocus on: " + " ".join(focus.split())
    return text


def compact(
    store: SessionStore,
    engine: EngineAPI,
    session: Session,
    profile: Profile,
    *,
    focus: str | None = None,
    cancel: threading.Event | None = None,
    on_event: Callable[[EngineEvent], None] | None = None,
    pending: ChatMessage | None = None,
    reasoning: ReasoningSettings | None = None,
) -> Compacted:
    """Summarize `session` into a continuation (module docstring); the caller holds its writer
    lock. `on_event` sees the summary turn's events as they come (a UI shows its progress);
    `cancel` stops it. `pending`: the user message about to be sent in the continuation (a turn
    that found the context full), which the continuation must leave room for. `reasoning`: the
    settings the next turns run with (the continuation is warmed for them; the profile's when
    None).

    The summary turn runs with thinking off when the template can switch it and switching it
    keeps what the turn reuses (`summary_reasoning`). Raises `CompactionFailed`, storing
    nothing, when the turn is cancelled or fails, the summary is empty, or the continuation
    cannot hold the summary, the pinned files and `pending`."""
    n_ctx = _loaded_context(engine)
    session = store.get_session(session.id)  # another process may have moved its view
    history = store.messages(session.id)
    settings = reasoning or profile.reasoning
    request = ChatMessage("user", summary_request(profile, focus))
    view = _summary_view(engine, session, history, request, n_ctx, settings)
    if not any(m.role == "assistant" for m in view):
        raise CompactionFailed(f"session {session.id[:8]} has no reply to summarize yet")
    done = _summarize(engine, [*view, request], profile, n_ctx, cancel, on_event, settings)
    summary = done.text.strip()
    if not summary:
        raise CompactionFailed(
            f"the summary came back empty (finish reason: {done.stats.finish_reason}); "
            "the session is as it was"
        )
    messages, kept = _continuation(engine, session, history, request, summary, done, profile, n_ctx, pending)
    continuation = store.create_continuation(session.id, messages)
    log.info(
        "compacted session %s into %s: summary %d tokens (%d of %d prompt tokens reused), %d turns kept",
        session.id[:8], continuation.id[:8], done.stats.decode_tokens, done.stats.cached_tokens,
        done.stats.prompt_tokens, kept,
    )  # fmt: skip
    warmed = _warm(engine, continuation, store, settings)
    return Compacted(continuation, session, summary, done.stats, kept, warmed)


def _loaded_context(engine: EngineAPI) -> int:
    if engine.info is None:
        raise CompactionFailed("the model is not loaded")
    return engine.info.n_ctx


def summary_reasoning(
    engine: EngineAPI, messages: Sequence[ChatMessage], settings: ReasoningSettings
) -> ReasoningSettings:
    """The reasoning settings of the summary turn: thinking off when the template can switch it
    and the turn reuses as much of the history that way (the answer is all a summary needs,
    and reasoning would only take the context's room and the user's time); otherwise the
    session's own settings, so that a template that renders the history differently without
    thinking does not cost a prefill of all of it."""
    support = engine.thinking_support()
    if support is None or not support.can_switch or not support.thinks(settings):
        return settings
    off = dataclasses.replace(settings, enabled="off")
    kept = engine.preview(messages, reasoning=settings).cached_tokens
    return off if engine.preview(messages, reasoning=off).cached_tokens >= kept else settings


def _summary_view(
    engine: EngineAPI,
    session: Session,
    history: Sequence[Message],
    request: ChatMessage,
    n_ctx: int,
    settings: ReasoningSettings,
) -> list[ChatMessage]:
    """The conversation the summary request is appended to: what the model sees now, or, when
    that and the request leave no room for a summary (a reply that filled the context), the
    most recent whole turns that do (then only those are summarized)."""
    room = n_ctx - MIN_SUMMARY_TOKENS
    view = engine_messages(session.system_prompt, history, view_start=session.view_start)
    tokens = engine.preview([*view, request], reasoning=settings).prompt_tokens
    if not n_ctx or not tokens or tokens < room:  # fits, or only a server can tell
        return view
    start = first_view_that_fits(engine, session, history, [request], room, settings)
    if start is None:
        raise CompactionFailed(
            f"not even the last turn of session {session.id[:8]} leaves room for a summary in the "
            f"{n_ctx:,}-token context; raise context.n_ctx or start a new session"
        )
    return engine_messages(session.system_prompt, history, view_start=start)


def _summarize(
    engine: EngineAPI,
    messages: list[ChatMessage],
    profile: Profile,
    n_ctx: int,
    cancel: threading.Event | None,
    on_event: Callable[[EngineEvent], None] | None,
    settings: ReasoningSettings,
) -> TurnDone:
    """Run the summary turn to its end; its `TurnDone`, or `CompactionFailed`."""
    prompt = engine.preview(messages, reasoning=settings).prompt_tokens
    budget = profile.sampling.max_tokens
    if n_ctx:
        budget = min(budget, int(n_ctx * SUMMARY_SHARE))
    if n_ctx and prompt:
        budget = min(budget, n_ctx - prompt - 1)
    turn = engine.turn(
        messages,
        sampling=profile.sampling,
        reasoning=summary_reasoning(engine, messages, settings),
        max_tokens=max(budget, 1),
        cancel=cancel,
    )
    done: TurnDone | None = None
    try:
        for event in turn:
            if on_event is not None:
                on_event(event)
            if isinstance(event, TurnFailed):
                raise CompactionFailed(f"the summary turn failed: {event.reason}; the session is as it was")
            if isinstance(event, TurnDone):
                done = event
    finally:
        turn.close()
    if done is None:
        raise CompactionFailed("the summary turn ended without a reply; the session is as it was")
    if done.stats.finish_reason in ("cancelled", "interrupted") or (cancel is not None and cancel.is_set()):
        raise CompactionFailed("the compaction was cancelled; the session is as it was")
    return done


def _continuation(
    engine: EngineAPI,
    session: Session,
    history: Sequence[Message],
    request: ChatMessage,
    summary: str,
    done: TurnDone,
    profile: Profile,
    n_ctx: int,
    pending: ChatMessage | None,
) -> tuple[list[NewMessage], int]:
    """The continuation's messages (the request with the pinned files, the summary, then the
    last complete turns that fit `keep_share` of the context) and how many turns were kept."""
    in_view = [m for m in history if m.position >= session.view_start]
    candidates = complete_turns(in_view)
    kept: list[tuple[Message, Message]] = []
    opening = _opening(session, history, request, summary, done, kept)
    alone = _prompt_tokens(engine, session, opening, None)
    if alone and alone >= profile.context.compact_at * n_ctx:  # it would compact again at once
        raise CompactionFailed(
            f"the summary and the pinned files take {alone:,} tokens, more than context.compact_at "
            f"({profile.context.compact_at:.2f}) of the {n_ctx:,}-token context: unpin files, raise "
            'context.n_ctx, or use context.when_full = "drop_oldest" (the session is as it was)'
        )
    fixed = _prompt_tokens(engine, session, opening, pending)
    if fixed and fixed >= n_ctx:
        raise CompactionFailed(
            f"the summary and the pinned files take {fixed:,} tokens with the next message, more "
            f"than the {n_ctx:,}-token context holds; unpin files or raise context.n_ctx "
            "(the session is as it was)"
        )
    budget = min(profile.context.keep_share * n_ctx, profile.context.compact_at * n_ctx - fixed)
    used = 0.0
    for turn in reversed(candidates):
        cost = _turn_tokens(engine, turn)
        if used + cost > budget:
            break
        used += cost
        kept.insert(0, turn)
    while True:  # the counts above are estimates: check the whole continuation, drop to fit
        messages = _opening(session, history, request, summary, done, kept) + _copies(kept)
        total = _prompt_tokens(engine, session, messages, pending)
        if not kept or not total or total < profile.context.compact_at * n_ctx:
            return messages, len(kept)
        kept.pop(0)


def _opening(
    session: Session,
    history: Sequence[Message],
    request: ChatMessage,
    summary: str,
    done: TurnDone,
    kept: Sequence[tuple[Message, Message]],
) -> list[NewMessage]:
    """The continuation's first two messages: the summary request, carrying the latest version
    of each pinned file (but those a kept turn holds already), and the summary."""
    in_kept = {a.path for user, _reply in kept for a in user.attachments}
    pinned = tuple(a for a in pinned_files(history) if a.path not in in_kept)
    stats = {**done.stats.to_json(), "summary_of": session.id}
    return [
        NewMessage("user", request.content, attachments=pinned),
        NewMessage(
            "assistant",
            summary,
            stats=stats,
            prompt_tokens=done.stats.prompt_tokens,
            completion_tokens=done.stats.decode_tokens,
        ),
    ]


def _copies(kept: Sequence[tuple[Message, Message]]) -> list[NewMessage]:
    """The kept turns as they are stored (text, reasoning, files, stats)."""
    out = []
    for turn in kept:
        for m in turn:
            out.append(
                NewMessage(
                    m.role,
                    m.content,
                    reasoning=m.reasoning,
                    attachments=m.attachments,
                    status=m.status,
                    stats=m.stats,
                    prompt_tokens=m.prompt_tokens,
                    completion_tokens=m.completion_tokens,
                )
            )
    return out


def complete_turns(messages: Sequence[Message]) -> list[tuple[Message, Message]]:
    """The (question, reply) pairs whose reply is complete and has text, in order: the turns a
    continuation may keep word for word (a cut or failed reply is left to the summary)."""
    turns = []
    for user, reply in zip(messages, messages[1:], strict=False):
        if user.role == "user" and reply.role == "assistant" and reply.status == "complete" and reply.content:
            turns.append((user, reply))
    return turns


def _turn_tokens(engine: EngineAPI, turn: tuple[Message, Message]) -> int:
    """A kept turn's tokens, counted as the model sees its text (`count_tokens`)."""
    user, reply = turn
    texts = (render_user_content(user.attachments, user.content), reply.content, reply.reasoning)
    total = TURN_OVERHEAD_TOKENS
    for text in texts:
        if text:
            counted = engine.count_tokens(text)
            total += counted if counted is not None else len(text) // CHARS_PER_TOKEN + 1
    return total


def _prompt_tokens(
    engine: EngineAPI, session: Session, messages: Sequence[NewMessage], pending: ChatMessage | None
) -> int:
    """The prompt tokens of the continuation holding `messages` (and `pending`, when given);
    0 when the engine cannot count (a remote one)."""
    convo = [ChatMessage("system", session.system_prompt)] if session.system_prompt else []
    convo += [_chat(m) for m in messages]
    if pending is not None:
        convo.append(pending)
    return engine.preview(convo).prompt_tokens


def _chat(m: NewMessage) -> ChatMessage:
    if m.role == "user":
        return ChatMessage("user", render_user_content(m.attachments, m.content))
    return ChatMessage(m.role, m.content, m.reasoning)


def _warm(
    engine: EngineAPI, session: Session, store: SessionStore, settings: ReasoningSettings
) -> int | None:
    """Prefill the session's view and checkpoint it (`EngineAPI.warm`), so its next turn resumes
    warm. A failure here costs only that: the session is stored and whole, its next turn
    prefills cold (logged)."""
    convo = engine_messages(session.system_prompt, store.messages(session.id), view_start=session.view_start)
    if not convo or convo[-1].role != "assistant":
        return None
    try:
        return engine.warm(convo, reasoning=settings)
    except Exception:
        log.warning("could not warm session %s; its next turn prefills cold", session.id[:8], exc_info=True)
        return None


# -- drop_oldest -------------------------------------------------------------------------------------


def first_view_that_fits(
    engine: EngineAPI,
    session: Session,
    history: Sequence[Message],
    tail: Sequence[ChatMessage],
    limit: float,
    settings: ReasoningSettings | None = None,
) -> int | None:
    """The earliest `view_start` after the session's own (a user message's position, never past
    the last one) whose view followed by `tail` is under `limit` prompt tokens; None when not
    even the last turn alone is. A binary search: fewer turns in view, fewer tokens."""
    starts = [m.position for m in history if m.role == "user" and m.position > session.view_start]

    def tokens(start: int) -> int:
        view = engine_messages(session.system_prompt, history, view_start=start)
        return engine.preview([*view, *tail], reasoning=settings).prompt_tokens

    lo, hi = 0, len(starts)
    while lo < hi:
        mid = (lo + hi) // 2
        if tokens(starts[mid]) < limit:
            hi = mid
        else:
            lo = mid + 1
    return starts[lo] if lo < len(starts) else None


def drop_oldest(
    store: SessionStore,
    engine: EngineAPI,
    session: Session,
    profile: Profile,
    *,
    pending: ChatMessage | None = None,
    reasoning: ReasoningSettings | None = None,
) -> Session:
    """Move the session's view forward by whole turns until the next turn (`pending`, when
    given) fits below `compact_at` of the context (aiming `DROP_HEADROOM` lower, so that the
    next turns do not drop again at once), never past the last turn; then prefill and
    checkpoint the new view (`EngineAPI.warm`). The messages before it stay stored; the pinned
    files among them are still shown to the model (`conversation.engine_messages`). The caller
    holds the writer lock. Returns the session as stored now (unchanged when no turn can go and
    the turn fits anyway); `CompactionFailed`, with nothing changed, when even the last turn
    alone leaves no room."""
    n_ctx = _loaded_context(engine)
    session = store.get_session(session.id)
    history = store.messages(session.id)
    settings = reasoning or profile.reasoning
    tail = [pending] if pending is not None else []
    compact_at = profile.context.compact_at
    start = None
    for limit in (max(compact_at - DROP_HEADROOM, 0.1) * n_ctx, compact_at * n_ctx, n_ctx):
        start = first_view_that_fits(engine, session, history, tail, limit, settings)
        if start is not None:  # else the last turn alone, if that fits at all
            break
    if start is None:
        now = engine_messages(session.system_prompt, history, view_start=session.view_start)
        if engine.preview([*now, *tail], reasoning=settings).prompt_tokens < n_ctx:
            return session  # nothing can go, and the turn fits as it is
        raise CompactionFailed(
            f"even the last turn of session {session.id[:8]} leaves no room for the next one in the "
            f"{n_ctx:,}-token context; raise context.n_ctx, compact, or start a new session"
        )
    dropped = store.set_view_start(session.id, start)
    log.info("session %s: the model's view now starts at message %d", session.id[:8], start)
    _warm(engine, dropped, store, settings)
    return dropped
