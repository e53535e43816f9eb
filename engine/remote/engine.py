"""`RemoteEngine`: `EngineAPI` over an OpenAI-compatible chat-completions server.

A turn is one streamed `chat/completions` request. The request is sent by `turn()` itself, so
everything that stops a turn before it starts — the server down, a wrong key, an unknown model,
a server still busy after the retries — raises a one-line `RemoteError` before the app stores
anything, and the user's text stays where it was. Once the stream runs, its events are the local
engine's: `TurnStarted`, `PrefillProgress` (llama-server's `return_progress`), `TokenDelta`
(answer and reasoning apart), `TurnDone` with stats from what the server reports (llama-server's
`timings`, the final `usage` chunk of vLLM and others) and what the client measured (TTFT, tok/s),
and the calls the reply made (`TurnDone.tool_calls`, put together from `delta.tool_calls`: tools.py).
A stream cut in the middle, or a chunk that is not JSON, ends the turn with the text so far kept
(`TurnDone`, finish "interrupted", after a warning); cancelling closes the stream.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..api import EngineFacts, Turn
from ..prompt.chat_template import ChatMessage
from ..config.profile_schema import Profile, ReasoningSettings, SamplingSettings
from ..events import (
    EngineEvent,
    EngineWarning,
    ModelLoaded,
    ModelLoading,
    ResumePreview,
    TurnFailed,
    TurnStarted,
)
from ..prompt.thinking import ThinkingSupport, requested
from ..tools.types import ToolSpec
from .errors import RemoteError, describe, import_openai
from .stream import StreamReader, chunks
from .tools import message_dicts, tool_fields

log = logging.getLogger(__name__)


def api_key(profile: Profile) -> str | None:
    """The key from the environment variable the profile names (None: no key configured)."""
    name = profile.backend.api_key_env.strip()
    if not name:
        return None
    value = os.environ.get(name)
    if not value:
        raise RemoteError(f"the environment variable {name} (backend.api_key_env) is not set")
    return value


def request_body(
    profile: Profile,
    model: str,
    messages: Sequence[ChatMessage],
    sampling: SamplingSettings,
    reasoning: ReasoningSettings,
    *,
    tools: Sequence[ToolSpec] = (),
    tool_choice: str = "auto",
) -> dict[str, Any]:
    """The streamed chat-completions request. Standard fields (and `tools`, `tool_choice` when
    tools are offered, and the messages' calls and results: tools.py) go as the SDK's arguments;
    llama-server's and vLLM's extensions (keep the prompt cache, report prefill progress, top-k,
    min-p, the template's thinking switch, the thinking budget) go in `extra_body`, which other
    servers ignore.

    The thinking budget is the server's to keep: this client sees the reply as text after the
    server's own reasoning parser, not tokens it could close. llama-server reads
    `thinking_budget_tokens` (and `thinking_budget_message`) per request and closes the
    reasoning itself; a server that knows neither field ignores it, and `TurnStats` cannot say
    whether it cut (`reasoning_budget_hit` stays false)."""
    extra: dict[str, Any] = {"cache_prompt": True, "return_progress": True}
    if sampling.top_k:
        extra["top_k"] = sampling.top_k
    if sampling.min_p:
        extra["min_p"] = sampling.min_p
    if sampling.repeat_penalty != 1.0:
        extra["repeat_penalty"] = sampling.repeat_penalty
    enabled, effort = requested(reasoning)
    kwargs: dict[str, Any] = {}
    if enabled is not None:
        kwargs["enable_thinking"] = enabled
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    if kwargs:
        extra["chat_template_kwargs"] = kwargs
    if reasoning.budget_tokens > 0 and enabled is not False:
        extra["thinking_budget_tokens"] = reasoning.budget_tokens
        if reasoning.budget_message:
            extra["thinking_budget_message"] = reasoning.budget_message
    body: dict[str, Any] = {
        "model": model,
        "messages": message_dicts(messages),
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "extra_body": extra,
    }
    if sampling.seed >= 0:
        body["seed"] = sampling.seed
    body.update(tool_fields(tools, tool_choice))
    return body


class RemoteEngine(EngineFacts):
    """Implements `EngineAPI` (engine/api.py) for `backend.kind = "remote"`."""

    def __init__(self, profile: Profile, *, client_factory: Callable[..., Any] | None = None) -> None:
        self._profile = profile
        self._client_factory = client_factory
        self._client: Any = None
        self._model = profile.backend.model
        self._info: ModelLoaded | None = None

    @property
    def base_url(self) -> str:
        return self._profile.backend.base_url.rstrip("/")

    def _describe(self, exc: BaseException) -> RemoteError:
        return describe(exc, self.base_url, self._model, self._profile.backend.max_retries)

    def check(self) -> None:
        """Refuse at once what cannot work: no SDK, no URL, a key variable that is not set."""
        import_openai()
        if not self.base_url.startswith(("http://", "https://")):
            raise RemoteError(f"backend.base_url must be an http(s) URL, got {self.base_url!r}")
        api_key(self._profile)

    def load(
        self,
        on_event: Callable[[EngineEvent], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelLoaded:
        """Connect: list the server's models and pick ours (or its first), so a wrong URL, key
        or model name is said now, not at the first message."""
        emit = on_event or (lambda _e: None)
        self.check()
        t0 = time.perf_counter()
        emit(ModelLoading(0.0))
        backend = self._profile.backend
        factory = self._client_factory or import_openai().OpenAI
        self._client = factory(
            base_url=self.base_url,
            api_key=api_key(self._profile) or "no-key",
            timeout=backend.timeout_s,
            max_retries=backend.max_retries,
        )
        try:
            models = list(self._client.models.list())
        except Exception as exc:
            self._client = None
            raise self._describe(exc) from None
        ids = [m.id for m in models]
        if self._model and ids and self._model not in ids:
            self._client = None
            raise RemoteError(
                f"the server at {self.base_url} has no model {self._model!r} (it has: {', '.join(ids[:5])})"
            )
        if not self._model:
            if not ids:
                self._client = None
                raise RemoteError(f"the server at {self.base_url} lists no models; set backend.model")
            self._model = ids[0]
        entry = next((m for m in models if m.id == self._model), None)
        extra = (getattr(entry, "model_extra", None) or {}) if entry is not None else {}
        meta = extra.get("meta") or {}
        n_ctx = int(extra.get("max_model_len") or meta.get("n_ctx_train") or 0)
        emit(ModelLoading(1.0))
        self._info = ModelLoaded(
            path=f"{self.base_url} · {self._model}",
            architecture="remote",
            n_ctx=n_ctx,
            load_s=time.perf_counter() - t0,
            fingerprint=f"remote:{self.base_url}#{self._model}",
        )
        emit(self._info)
        return self._info

    def apply(self, profile: Profile) -> None:
        """Take per-turn settings (sampling, reasoning, timeouts); the server stays the same."""
        self._profile = profile

    def thinking_support(self) -> ThinkingSupport | None:
        return None  # the server's template decides; `reasoning.enabled` is passed through

    def count_tokens(self, text: str) -> int | None:
        """The server's tokenizer is not reachable through the OpenAI API: unknown."""
        return None

    def tool_format(self) -> str | None:
        """The API's own: the server renders the definitions and parses the calls."""
        return "openai"

    def preview(
        self,
        messages: Sequence[ChatMessage],
        *,
        reasoning: ReasoningSettings | None = None,
        tools: Sequence[ToolSpec] = (),
    ) -> ResumePreview:
        """The server keeps its own prompt cache; nothing is known before the request."""
        return ResumePreview(0, 0, 0, "server", None)

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
    ) -> Turn:
        """A streamed request; with `tools`, the server may answer with calls (`tool_choice`
        "auto", "required" or "none", as the API has them). A server started without tool
        support refuses such a request: that is the `RemoteError` this raises."""
        return self._turn(
            messages,
            sampling=sampling,
            reasoning=reasoning,
            max_tokens=max_tokens,
            cancel=cancel,
            tools=tools,
            tool_choice=tool_choice,
        )

    def _turn(
        self,
        messages: Sequence[ChatMessage],
        *,
        sampling: SamplingSettings | None = None,
        reasoning: ReasoningSettings | None = None,
        max_tokens: int | None = None,
        cancel: threading.Event | None = None,
        ignore_eos: bool = False,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str = "auto",
    ) -> Turn:
        """`turn`, and `ignore_eos` asks the server to decode past end-of-generation tokens
        (`velo-chat bench`'s decode section, through `diagnostics.turn_past_eos`)."""
        if self._client is None:
            raise RuntimeError("RemoteEngine.load() must be called before a turn")
        settings = sampling or self._profile.sampling
        if max_tokens is not None:
            settings = dataclasses.replace(settings, max_tokens=max_tokens)
        body = request_body(
            self._profile,
            self._model,
            messages,
            settings,
            reasoning or self._profile.reasoning,
            tools=tools,
            tool_choice=tool_choice,
        )
        if ignore_eos:
            body["extra_body"]["ignore_eos"] = True
        t_start = time.perf_counter()
        try:
            stream = self._client.chat.completions.create(**body)
        except Exception as exc:
            raise self._describe(exc) from None
        stop = cancel or threading.Event()
        return Turn(self._events(stream, stop, t_start, tuple(tools)), stop, 0)

    def _events(
        self, stream: Any, cancel: threading.Event, t_start: float, tools: tuple[ToolSpec, ...]
    ) -> Iterator[EngineEvent]:
        reader = StreamReader(t_start, tools)
        yield TurnStarted(0, 0, 0, "server")
        try:
            for chunk in chunks(stream, cancel):
                yield from reader.feed(chunk)
        except Exception as exc:  # cut, garbage, timeout mid-stream: keep what came
            reason = str(self._describe(exc))
            if not reader.reply.text and not reader.reply.reasoning and not reader.calls:
                yield TurnFailed(reason, "", "")
                return
            yield EngineWarning(f"the reply was cut: {reason}")
            reader.finish = "interrupted"
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        if cancel.is_set() and reader.finish is None:
            reader.finish = "cancelled"
        yield reader.done()

    def warm(
        self, messages: Sequence[ChatMessage], *, reasoning: ReasoningSettings | None = None
    ) -> int | None:
        """Nothing to do: the server keeps its own prompt cache, and the next request fills it."""
        return None

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> bool:
        client, self._client, self._info = self._client, None, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing must never fail a quit
                log.debug("closing the HTTP client failed", exc_info=True)
        return True
