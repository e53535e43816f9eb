"""Messages the generation worker posts to the chat screen (shared by the screen and its panel).

The worker never touches a widget (docs/architecture.md, "Code conventions"): it turns engine
events into these. The high-rate ones (`TokensStreamed`, `PrefillUpdated`,
`ModelLoadProgress`) carry cumulative state and define `can_replace`, so when the UI falls
behind, Textual's queue keeps only the newest and a fast stream never floods the queue.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

from textual.message import Message

from velo_chat.engine import (
    ModelLoaded,
    PrefillProgress,
    ResumePreview,
    ThinkingSupport,
    TurnStarted,
    TurnStats,
)
from velo_chat.engine.config import Profile
from velo_chat.store import Message as StoredMessage
from velo_chat.store import Attachment, Session

from .tools.types import ApprovalAnswer, PreparedCall


@dataclass
class ModelLoadProgress(Message):
    progress: float
    load_id: int = 0  # which load (a newer load makes an older one's messages stale)

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ModelLoadProgress)


@dataclass
class ModelReady(Message):
    info: ModelLoaded
    profile: Profile  # the profile the engine was built from: now the running one
    load_id: int = 0
    thinking: ThinkingSupport | None = None  # the model's thinking controls (None: no template)


@dataclass
class ModelLoadFailed(Message):
    reason: str
    load_id: int = 0
    active: Profile | None = None  # the profile still (or again) running; None: no model
    active_info: ModelLoaded | None = None  # set when `active` had to be loaded again
    refused: Profile | None = None  # the fit check refused this profile: the screen offers "load anyway"
    fit_table: str = ""  # and its table, compact (`FitReport.compact`; docs/fit.md)
    closed: Profile | None = None  # closed to make room for `refused`: loaded again if the user declines


@dataclass
class TurnRejected(Message):
    """The engine refused the turn before it started (too long, no model): nothing saved."""

    reason: str
    text: str  # the user's text, given back to the composer
    attachments: tuple[Attachment, ...] = ()  # its files, given back to the chips
    give_back: bool = True  # False for a regenerate: the question is still stored


@dataclass
class TurnWaiting(Message):
    """Another process holds the session's writer lock (a turn of its own): this turn waits."""

    holder: str  # who, as the lock file says ("process 1234")


@dataclass
class TurnAccepted(Message):
    """The user's message and the placeholder reply are stored; streaming follows."""

    session: Session
    created: bool  # a new session was created for this turn (a first turn or a revision's fork)
    user: StoredMessage
    reply: StoredMessage
    forked_from: Session | None = None  # a revision: the session it forked, which stays as it was
    # the context was full and the session was compacted first: `session` is the continuation,
    # this the original (which stays whole); the transcript shows the continuation's messages
    compacted_from: Session | None = None


@dataclass
class TurnMakingRoom(Message):
    """The context is full and `context.when_full` acts before the turn (compacting into a
    continuation, or dropping the oldest turns from the model's view): what is happening."""

    line: str


@dataclass
class TurnBegan(Message):
    started: TurnStarted
    n_ctx: int


@dataclass
class PrefillUpdated(Message):
    progress: PrefillProgress

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PrefillUpdated)


@dataclass
class TokensStreamed(Message):
    """The reply so far (cumulative, so a newer one supersedes an older one)."""

    text: str  # the answer so far
    n_tokens: int
    t_first: float
    t_last: float
    reasoning: str = ""  # the reasoning so far
    n_reasoning: int = 0  # of n_tokens, the reasoning's
    # the decode-rate samples so far, measured by the worker over every token: the same for the
    # same tokens however many of these messages the UI's queue coalesced
    samples: tuple[float, ...] = ()

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, TokensStreamed)


@dataclass
class EngineNotice(Message):
    message: str


@dataclass
class TurnEnded(Message):
    reply: StoredMessage | None  # the stored reply with its final status
    stats: TurnStats | None
    failed: str | None = None  # reason, when the turn failed
    text: str | None = None  # the reply as it streamed (the stored row may lag or be stale)
    saved: bool = True  # False: the store refused the reply; the text is only on screen
    save_error: str | None = None
    reasoning: str = ""  # the reply's reasoning as it streamed
    empty_reason: str | None = None  # a complete reply with no text: why (stored with it)


@dataclass
class PreviewReady(Message):
    preview: ResumePreview | None
    file_tokens: tuple[int | None, ...] = ()  # each attached file's tokens (None: unknown)


@dataclass
class CompactionProgressed(Message):
    """The summary turn of a `/compact` so far (cumulative: a newer one replaces an older)."""

    prefill: PrefillProgress | None = None  # the request's prefill (None: done, or not begun)
    n_tokens: int = 0  # summary tokens so far

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, CompactionProgressed)


@dataclass
class CompactionMade(Message):
    """A `/compact` made its continuation (stored and warmed); the original is unchanged."""

    original: Session
    continuation: Session
    kept_turns: int  # turns of the original copied word for word after the summary
    summary_tokens: int


@dataclass
class CompactionNotMade(Message):
    """A `/compact` failed or was cancelled: nothing was stored, the session is as it was."""

    reason: str  # one line
    text: str  # the command the user typed, given back to the composer


@dataclass
class ToolApprovalAsked(Message):
    """A tool call needs the user's word: the worker waits on `answer` until the screen sets it
    (the dialog's answer, or "stopped" when the turn or the screen goes away first)."""

    prepared: PreparedCall
    answer: Future[ApprovalAnswer]
    step: int  # the turn's tool step the call belongs to (1: the first reply)


@dataclass
class ToolStepBegan(Message):
    """A tool step's results are in and the model answers again (step >= 2 of a turn): `reply`
    is the new assistant row (status "interrupted" while it streams) that the next
    `TokensStreamed` fill."""

    reply: StoredMessage
    step: int


@dataclass
class ToolCallDone(Message):
    """A reply row was updated with its calls and the results so far; the times are the turn's
    totals so far (decoding and prefilling, and running tools)."""

    reply: StoredMessage
    step: int
    model_s: float
    tool_s: float
