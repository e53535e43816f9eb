"""Plain models the store returns, and the value rules they follow.

The models are frozen dataclasses so a widget or the engine can hold one without the store's
database changing under it; a change goes through the store and yields a new model. Times are
float Unix seconds (UTC) everywhere: they sort and compare as numbers, and the exports say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

Role = Literal["system", "user", "assistant"]
Status = Literal["complete", "interrupted", "error"]

ROLES: Final = ("system", "user", "assistant")
STATUSES: Final = ("complete", "interrupted", "error")

TITLE_MAX_CHARS: Final = 60
"""A derived title is cut to this many characters (an ellipsis included)."""


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation. Its messages are fetched separately (`SessionStore.messages`)."""

    id: str
    """uuid4 hex (32 characters); the CLI accepts any unique prefix."""
    title: str | None
    """None until set by `rename` or derived from the first user message."""
    created_at: float
    updated_at: float
    """Last change to the conversation (a message added, changed or deleted); `list_sessions`
    sorts on it. A rename or a settings change does not bump it, so the list keeps its order."""
    profile: str
    """Name of the profile the session runs on."""
    system_prompt: str
    model_fingerprint: str | None
    """The engine's fingerprint of the model last used, so a resume can tell a model change."""
    parent_session_id: str | None = None
    """For a fork: the session it was forked from (None once that session is deleted)."""
    forked_from_message_id: int | None = None
    """For a fork: the parent's message the fork was taken at (its last copied message); None
    for a fork taken before the first message."""
    working_dir: str | None = None
    """The folder velo-chat was started in when the session was created: its attachments' relative
    paths are relative to it, so a resume elsewhere can still name the same files."""
    continues: bool = False
    """True for a continuation: the session `parent_session_id` was compacted into it (it opens
    with a summary of the parent, which stays whole; docs/compaction.md)."""
    view_start: int = 0
    """The position of the first message the model sees (0: all of them). The oldest turns left
    the model's view when the context was full (`when_full = "drop_oldest"`); the messages before
    it stay stored and shown, marked as out of view. Always 0 or a user message's position."""


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file attached to a user message, as it was sent.

    Kept apart from the typed text (the model sees it rendered before that text), so an edit or a
    revision can start from what the user typed and the files can be listed and searched by name.
    The content is stored whole: the file on disk may change or vanish, and the session must still
    say exactly what the model was shown."""

    path: str
    """As shown to the model (relative to the session's working folder when inside it)."""
    sha256: str
    """Hex sha256 of the file's bytes as read from disk (lowercase, 64 characters)."""
    size: int
    """Bytes of the file as read."""
    content: str
    """The text as sent to the model (decoded)."""
    pinned: bool = False
    """The user pinned the file: it stays in the model's view when the context is full (a
    compaction carries its latest version into the continuation, a dropped view into the first
    message still in view). Last, so positional constructors of older code keep working."""


@dataclass(frozen=True, slots=True)
class StoredToolCall:
    """A tool call a reply made, as the model wrote it (`text`) and as it was read (`name`,
    `arguments`). `error` is why it was not a valid call of a declared tool ("" when it was)."""

    id: str
    name: str
    arguments: dict[str, Any]
    text: str
    error: str = ""


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What came of one call of a reply: who decided it, and what the model was told."""

    call_index: int
    """The call's place in its reply's `tool_calls`."""
    call_id: str
    tool: str
    decision: str
    """"auto" (the profile allowed it), "allowed" (the user, once), "allowed_session" (the user,
    for the session), "refused" (the user), "invalid" (unknown tool or bad arguments),
    "stopped" (the user stopped the loop first)."""
    content: str
    """The text the model was given as the tool's result."""
    ok: bool
    reason: str = ""
    """A refusal's reason as the user typed it ("" when none)."""
    details: dict[str, Any] = field(default_factory=dict)
    """Facts for the transcript: "summary", "seconds", "exit_code", "truncated", "diff", ..."""
    created_at: float = 0.0


@dataclass(frozen=True, slots=True)
class UndoRecord:
    """A file's bytes before and after one edit or write by a tool, so it can be put back without
    git. The bytes are stored once by sha256 (`SessionStore.blob`)."""

    id: int
    session_id: str
    message_id: int
    """The reply whose call changed the file."""
    call_index: int
    path: str
    """Absolute path of the file."""
    before_sha256: str | None
    """None: the file did not exist before (undo removes it)."""
    after_sha256: str | None
    """None: the call removed the file (undo restores it)."""
    created_at: float
    undone_at: float | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of a session. `position` is its 0-based place in the session."""

    id: int
    """Unique across the database and never reused, so it can name a fork point."""
    session_id: str
    position: int
    role: Role
    content: str
    status: Status
    """`interrupted` while a reply streams (and if it never finished), `error` if it failed."""
    prompt_tokens: int | None
    completion_tokens: int | None
    stats: dict[str, Any]
    """Per-turn engine stats (ttft, tok/s, checkpoint source ...), stored as JSON."""
    created_at: float
    reasoning: str = ""
    """A reply's reasoning (a thinking model's), kept apart from its answer in `content`;
    "" when the model did not think."""
    attachments: tuple[Attachment, ...] = ()
    """Files sent with a user message, in the order they were attached; `content` holds only
    the typed text."""
    tool_calls: tuple[StoredToolCall, ...] = ()
    """A reply's tool calls (a step of a tool loop); `content` is the text around them."""
    tool_results: tuple[ToolResult, ...] = ()
    """What came of each of those calls, in call order (missing for a call never decided)."""


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to write into a new session as it is (`SessionStore.create_continuation`): a
    summary, or a turn copied from the session it continues."""

    role: Role
    content: str
    reasoning: str = ""
    attachments: tuple[Attachment, ...] = ()
    status: Status = "complete"
    stats: Mapping[str, Any] = field(default_factory=dict)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Draft:
    """A message queued while a reply streamed, not sent yet (kept so a quit loses none).

    Not a message: it has no position, is not searched and does not change the session's
    `updated_at`, because nothing has been said yet; sending it is the caller's `add_exchange`
    followed by `delete_draft`."""

    id: int
    session_id: str
    text: str
    attachments: tuple[Attachment, ...]
    created_at: float


@dataclass(frozen=True, slots=True)
class SearchHit:
    """A message that matched a search, with its session and a short excerpt."""

    session: Session
    message: Message
    snippet: str
    """Text around the match; matched terms are wrapped in `SNIPPET_OPEN`/`SNIPPET_CLOSE`."""


def make_title(content: str) -> str | None:
    """Derive a session title from a user message: its first non-blank line, whitespace collapsed,
    cut at a word boundary to `TITLE_MAX_CHARS` with an ellipsis. None when there is no text."""
    for line in content.splitlines():
        words = line.split()
        if words:
            break
    else:
        return None
    title = " ".join(words)
    if len(title) <= TITLE_MAX_CHARS:
        return title
    cut = title[: TITLE_MAX_CHARS - 1]
    space = cut.rfind(" ")
    if space >= TITLE_MAX_CHARS // 2:
        cut = cut[:space]
    return cut.rstrip() + "…"
