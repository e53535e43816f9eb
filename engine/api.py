"""The engine's public surface as a protocol: what the TUI, the CLI and the test fake rely on.

`Engine` implements it; so does the scripted fake the TUI layout tests use, and the type
checker (plus `tests/test_engine_api.py`) holds both to it, so a change here shows up in both
at once. Nothing outside `engine/` should need more than this: facts about the loaded model come
from `info` (the `ModelLoaded` that `load()` returned), never from the model or context objects.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from .prompt.chat_template import ChatMessage
from .config.profile_schema import Profile, ReasoningSettings, SamplingSettings
from .events import EngineEvent, ModelLoaded, ResumePreview, TurnDone, TurnFailed
from .prompt.thinking import ThinkingSupport
from .tools.types import ToolSpec


class TurnHandle(Protocol):
    """A turn in flight: an iterator of events ending in one `TurnDone` or `TurnFailed`."""

    prompt_tokens: int
    result: TurnDone | TurnFailed | None

    def __iter__(self) -> Iterator[EngineEvent]: ...
    def __next__(self) -> EngineEvent: ...
    def cancel(self) -> None: ...
    def close(self) -> None: ...


class Turn:
    """One turn in flight: iterate it for its events (it ends with exactly one `TurnDone` or
    `TurnFailed`), `cancel()` it from any thread (it stops within a token or a ubatch and still
    ends with `TurnDone`, finish "cancelled"), `close()` it to abandon it (the engine is usable
    again at once, and the live sequence keeps what was computed).
    A context manager closes it. The `TurnHandle` both engines return."""

    def __init__(self, events: Iterator[EngineEvent], cancel: threading.Event, prompt_tokens: int) -> None:
        self._events = events
        self._cancel = cancel
        self.prompt_tokens = prompt_tokens
        self.result: TurnDone | TurnFailed | None = None  # the final event, once seen

    def __iter__(self) -> Turn:
        return self

    def __next__(self) -> EngineEvent:
        event = next(self._events)
        if isinstance(event, (TurnDone, TurnFailed)):
            self.result = event
        return event

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def close(self) -> None:
        close = getattr(self._events, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Turn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EngineFacts:
    """What every engine reports the same way, from the `_profile` it was built from and the
    `_info` its `load()` returned (None until then and after `close()`). A base class for the
    implementations (the in-process engine, the remote one, the test fake), not part of the
    protocol."""

    _profile: Profile
    _info: ModelLoaded | None

    @property
    def profile(self) -> Profile:
        """The profile this engine was built from (`apply` replaces its per-turn settings)."""
        return self._profile

    @property
    def info(self) -> ModelLoaded | None:
        return self._info

    @property
    def loaded(self) -> bool:
        return self._info is not None


class EngineAPI(Protocol):
    @property
    def profile(self) -> Profile: ...

    @property
    def info(self) -> ModelLoaded | None: ...

    @property
    def loaded(self) -> bool: ...

    def check(self) -> None:
        """Raise a user error now if the model cannot be loaded (a missing or bad file, or a
        model that does not fit in memory: `DoesNotFit`, which a caller may override to load
        anyway), cheaply and before the running engine is closed."""

    def load(
        self,
        on_event: Callable[[EngineEvent], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelLoaded: ...

    def apply(self, profile: Profile) -> None:
        """Take the settings that need no reload from `profile`."""

    def thinking_support(self) -> ThinkingSupport | None: ...

    def count_tokens(self, text: str) -> int | None:
        """How many tokens `text` is as plain message text (an attached file's size in the
        model's terms); None when only a server knows (the remote engine)."""

    def tool_format(self) -> str | None:
        """The tool-call format the model speaks ("qwen3-coder-xml", "hermes", ...; "openai" for
        a server), or None when its chat template renders no tools."""

    def preview(
        self,
        messages: Sequence[ChatMessage],
        *,
        reasoning: ReasoningSettings | None = None,
        tools: Sequence[ToolSpec] = (),
    ) -> ResumePreview: ...

    def turn(
        self,
        messages: Sequence[ChatMessage],
        *,
        sampling: SamplingSettings | None = None,
        reasoning: ReasoningSettings | None = None,
        max_tokens: int | None = None,
        cancel: threading.Event | None = None,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str = "auto",
    ) -> TurnHandle:
        """A turn on `messages`; with `tools`, the model may call them (`TurnDone.tool_calls`;
        `tool_choice` "auto", "required" or "none"). A model that renders no tools refuses them
        with `ChatTemplateError` before any event."""

    def warm(
        self, messages: Sequence[ChatMessage], *, reasoning: ReasoningSettings | None = None
    ) -> int | None:
        """Make `messages` (ending with an assistant reply) the live state and save a checkpoint
        at its follow-up boundary, so the next user turn appended to it resumes warm, in this
        process and in a new one; the tokens prefilled (None: a remote engine, whose server
        keeps its own cache, does nothing). A compaction's continuation uses it."""

    def close(self) -> bool: ...
