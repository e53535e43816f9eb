"""Reading a streamed chat-completions reply: chunks in, engine events out, and the `TurnDone`
with stats from what the server reported and what the client measured.

`finish_reason` "tool_calls" is a normal end ("stop"): the calls themselves are in
`TurnDone.tool_calls`, put together from the `delta.tool_calls` fragments (tools.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ..events import EngineEvent, PrefillProgress, ServerStats, TokenDelta, TurnDone, TurnStats
from ..reply import Reply
from ..tools.types import ToolSpec
from .tools import ToolCallStream

FINISH = {"stop": "stop", "length": "length", "eos": "stop", "tool_calls": "stop", "content_filter": "stop"}


def chunks(stream: Any, cancel: threading.Event) -> Iterator[dict[str, Any]]:
    for chunk in stream:
        if cancel.is_set():
            return
        yield chunk.to_dict() if hasattr(chunk, "to_dict") else dict(chunk)
        if cancel.is_set():
            return


class StreamReader:
    """Turns chunks into events and keeps what the stats need."""

    def __init__(self, t_start: float, tools: tuple[ToolSpec, ...] = ()) -> None:
        self.t_start = t_start
        self.tools = tools
        self.reply = Reply()  # the streamed pieces: each a `TokenDelta`
        self.calls = ToolCallStream()  # the `delta.tool_calls` fragments
        self.finish: str | None = None
        self.finish_seen = False  # the server sent a finish_reason
        self.usage: dict[str, Any] = {}
        self.timings: dict[str, Any] = {}
        self.progress: dict[str, Any] = {}

    def feed(self, chunk: Mapping[str, Any]) -> Iterator[EngineEvent]:
        now = time.perf_counter()
        if chunk.get("usage"):
            self.usage = dict(chunk["usage"])
        if chunk.get("timings"):
            self.timings = dict(chunk["timings"])
        progress = chunk.get("prompt_progress")
        if isinstance(progress, Mapping):
            self.progress = dict(progress)
            total = int(progress.get("total", 0)) - int(progress.get("cache", 0))
            done = int(progress.get("processed", 0)) - int(progress.get("cache", 0))
            secs = float(progress.get("time_ms", 0.0)) / 1000.0
            rate = done / secs if secs > 0 else 0.0
            yield PrefillProgress(done, total, rate, (total - done) / rate if rate > 0 else 0.0)
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
            answer = delta.get("content") or ""
            if thought:
                yield self.reply.add(TokenDelta("", -1, now, thought, True))
            if answer:
                yield self.reply.add(TokenDelta(answer, -1, now))
            if delta.get("tool_calls"):
                self.calls.feed(delta["tool_calls"], now)
            if choice.get("finish_reason"):
                self.finish_seen = True
                self.finish = FINISH.get(choice["finish_reason"], str(choice["finish_reason"]))

    def done(self) -> TurnDone:
        end = time.perf_counter()
        t, u, reply, calls = self.timings, self.usage, self.reply, self.calls
        pieces = reply.n_tokens + calls.n_fragments  # a call's fragments are decoded text too
        decode_tokens = int(u.get("completion_tokens") or t.get("predicted_n") or pieces)
        cached = int(t.get("cache_n") or (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        prompt_tokens = int(u.get("prompt_tokens") or (t.get("prompt_n", 0) + t.get("cache_n", 0)) or 0)
        t_first = min((x for x in (reply.t_first, calls.t_first) if x is not None), default=None)
        t_last = max((x for x in (reply.t_last, calls.t_last) if x is not None), default=None)
        span = (t_last - t_first) if t_first is not None and t_last is not None else 0.0
        client_rate = (pieces - 1) / span if pieces > 1 and span > 0 else 0.0
        stats = TurnStats(
            ttft_s=(t_first - self.t_start) if t_first is not None else 0.0,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            prefill_tokens=max(prompt_tokens - cached, 0),
            prefill_s=float(t.get("prompt_ms", 0.0)) / 1000.0,
            prefill_tok_s=float(t.get("prompt_per_second") or 0.0),
            decode_tokens=decode_tokens,
            decode_s=span,
            decode_tok_s=float(t.get("predicted_per_second") or client_rate),
            total_s=end - self.t_start,
            finish_reason=self.finish or "stop",
            source="server" if cached else "none",
            reasoning_tokens=reply.n_reasoning if not u else min(reply.n_reasoning, decode_tokens),
            first_answer_s=(reply.t_first_answer - self.t_start)
            if reply.t_first_answer is not None
            else None,
            backend="remote",
            server=_server_stats(t, u, client_rate),
        )
        # a call is whole once the server said the reply finished (or the stream simply ended)
        complete = self.finish_seen or self.finish is None
        return TurnDone(reply.text, stats, reply.reasoning, calls.calls(self.tools, complete=complete))


def _server_stats(t: Mapping[str, Any], usage: Mapping[str, Any], client_rate: float) -> ServerStats:
    """What the server reported: llama.cpp's server sends `timings`, most servers `usage`."""

    def count(key: str) -> int | None:
        return int(t[key]) if key in t else None

    def number(key: str) -> float | None:
        return t[key] if key in t else None  # as sent (an integer stays one)

    return ServerStats(
        client_tok_s=round(client_rate, 2),
        prompt_n=count("prompt_n"),
        cache_n=count("cache_n"),
        prompt_ms=number("prompt_ms"),
        prompt_per_second=number("prompt_per_second"),
        predicted_ms=number("predicted_ms"),
        predicted_per_second=number("predicted_per_second"),
        draft_n=count("draft_n"),
        draft_n_accepted=count("draft_n_accepted"),
        usage=dict(usage) if usage else None,
    )
