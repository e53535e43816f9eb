"""A scripted stand-in for `Engine`, for the TUI's layout and flow tests and for
`benchmarks/tui_update_cost.py` only (docs/architecture.md: every engine behaviour is tested on a
real model; this only feeds the UI deterministic events).

Token timestamps come from a fake clock (`t0 + i * dt`), so the live panel's numbers are fixed.
`gate`: when set up, the turn stops after `pause_after` tokens until the test opens the gate (or
the turn is cancelled), so a test can look at a reply mid-stream.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from velo_chat.engine import PromptTooLong, ResumePreview
from velo_chat.engine.api import EngineAPI, EngineFacts, Turn
from velo_chat.engine.llama.model import LoadCancelled
from velo_chat.engine.events import (
    CheckpointStats,
    LlamaTimings,
    LocalModel,
    ModelLoaded,
    ModelLoading,
    PrefillProgress,
    SpeculationStats,
    ThreadsInfo,
    TokenDelta,
    TurnDone,
    TurnStarted,
    TurnStats,
)
from velo_chat.engine.prompt.thinking import ThinkingSupport, requested


def _pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@dataclass
class FakeScript:
    reply: str = "Hello! Here is **bold** text."
    reasoning: str = ""  # streamed before the reply, as reasoning, when the turn thinks
    thinking: ThinkingSupport | None = None  # what `thinking_support()` reports
    prompt_limit: int = 4096
    n_ctx: int = 4096  # the context `load` reports (a small one fills up in a few turns)
    load_error: Exception | None = None
    check_errors: dict[str, Exception] = field(default_factory=dict)  # by profile name
    load_errors: dict[str, Exception] = field(default_factory=dict)  # by profile name
    load_gates: dict[str, threading.Event] = field(default_factory=dict)  # load waits on it
    turn_error: Exception | None = None  # raised by `turn()` itself (before any event)
    preview_error: Exception | None = None
    crash_after: int | None = None  # the event iterator raises after this many tokens
    pause_after: int | None = None  # tokens before waiting on `gate`
    pause_in_prefill: bool = False  # wait on `gate` after the first prefill ubatch instead
    gate: threading.Event = field(default_factory=threading.Event)
    t0: float = 1000.0
    dt: float = 0.01  # seconds between tokens: 100 tok/s
    prefill_chunks: int = 4


class FakeEngine(EngineFacts):
    """Implements `EngineAPI` (engine/api.py) like `Engine`; the type checker and
    tests/test_engine_api.py hold both to it."""

    def __init__(self, profile, script: FakeScript) -> None:
        self._profile = profile
        self.script = script
        self._info: ModelLoaded | None = None
        self.applied: list = []  # profiles given to `apply`
        self.live = 0
        self.turns: list[list] = []
        self.reasoning: list = []  # the reasoning settings of each turn
        self.warmed: list[list] = []  # the conversations given to `warm`
        self.closed = False

    def apply(self, profile) -> None:
        self.applied.append(profile)
        self._profile = profile

    def check(self) -> None:
        error = self.script.check_errors.get(self.profile.name)
        if error is not None:
            raise error

    def load(self, on_event=None, cancel=None) -> ModelLoaded:
        emit = on_event or (lambda e: None)
        emit(ModelLoading(0.5))
        error = self.script.load_errors.get(self.profile.name, self.script.load_error)
        if error is not None:
            raise error
        gate = self.script.load_gates.get(self.profile.name)
        while gate is not None and not gate.wait(0.01):
            if cancel is not None and cancel.is_set():
                raise LoadCancelled(f"loading {self.profile.name} was cancelled")
        emit(ModelLoading(1.0))
        info = ModelLoaded(
            "/models/fake.gguf",
            "llama",
            self.script.n_ctx,
            0.1,
            fingerprint="fake-fingerprint",
            local=LocalModel(135_000_000, 100 << 20, 49152, hybrid=False),
            threads=ThreadsInfo(2, 2, "decode 2 (auto), prefill 2 (auto)"),
        )
        self._info = info
        emit(info)
        return info

    def _count(self, messages) -> int:
        return sum(4 + len(m.content) // 4 for m in messages)

    def thinking_support(self) -> ThinkingSupport | None:
        return self.script.thinking

    def count_tokens(self, text: str) -> int | None:
        return len(text) // 4

    def tool_format(self) -> str | None:
        return None

    def preview(self, messages, *, reasoning=None, tools=()) -> ResumePreview:
        if self.script.preview_error is not None:
            raise self.script.preview_error
        n = self._count(messages)
        cached = min(self.live, n - 1)
        return ResumePreview(n, cached, n - cached, "live" if cached else "none", 0.1)

    def turn(
        self,
        messages,
        *,
        sampling=None,
        reasoning=None,
        max_tokens=None,
        cancel=None,
        tools=(),
        tool_choice="auto",
    ) -> Turn:
        n = self._count(messages)
        if n > self.script.prompt_limit:
            raise PromptTooLong(
                f"the conversation is {n:,} tokens but the context holds {self.script.prompt_limit:,}"
            )
        if self.script.turn_error is not None:
            raise self.script.turn_error
        self.turns.append(list(messages))
        self.reasoning.append(reasoning)
        enabled = requested(reasoning)[0] if reasoning is not None else None
        thinks = bool(self.script.reasoning) and enabled is not False
        stop = cancel or threading.Event()
        return Turn(self._run(n, stop, thinks), stop, n)

    def _wait(self, cancel: threading.Event) -> None:
        while not self.script.gate.wait(0.01):
            if cancel.is_set():
                return

    def _run(self, n: int, cancel: threading.Event, thinks: bool = False):
        s = self.script
        cached = min(self.live, n - 1)
        tail = n - cached
        yield TurnStarted(n, cached, tail, "live" if cached else "none")
        finish = "stop"
        for i in range(1, s.prefill_chunks + 1):
            done = tail * i // s.prefill_chunks
            yield PrefillProgress(done, tail, 1000.0, (tail - done) / 1000.0)
            if i == 1 and s.pause_in_prefill:
                self._wait(cancel)
            if cancel.is_set() and done < tail:
                finish = "cancelled"
                break
        text = reasoning = ""
        count = n_reasoning = 0
        pieces = [(p, True) for p in _pieces(s.reasoning)] if thinks else []
        pieces += [(p, False) for p in _pieces(s.reply)]
        if finish != "cancelled":
            for count, (piece, in_reasoning) in enumerate(pieces, start=1):
                t = s.t0 + count * s.dt
                if in_reasoning:
                    reasoning += piece
                    n_reasoning += 1
                    yield TokenDelta("", count, t, piece, True)
                else:
                    text += piece
                    yield TokenDelta(piece, count, t)
                if s.pause_after is not None and count == s.pause_after:
                    self._wait(cancel)
                if s.crash_after is not None and count == s.crash_after:
                    raise RuntimeError("the fake engine crashed mid-reply")
                if cancel.is_set():
                    finish = "cancelled"
                    break
        self.live = n + count
        rate = 1 / s.dt
        yield TurnDone(
            text,
            TurnStats(
                ttft_s=0.05,
                prompt_tokens=n,
                cached_tokens=cached,
                prefill_tokens=tail,
                prefill_s=tail / 1000,
                prefill_tok_s=1000.0,
                decode_tokens=count,
                decode_s=(count - 1) * s.dt,
                decode_tok_s=rate if count > 1 else 0.0,
                total_s=0.5,
                finish_reason=finish,
                source="live" if cached else "none",
                reasoning_tokens=n_reasoning,
                first_answer_s=0.05 + n_reasoning * s.dt if count > n_reasoning else None,
                checkpoint=CheckpointStats(),
                speculation=SpeculationStats(),
                llama=LlamaTimings(
                    graphs_reused=max(0, count - 2), eval_ms=1.0, prompt_eval_ms=1.0, wall_ms=1.0
                ),
            ),
            reasoning,
        )

    def warm(self, messages, *, reasoning=None) -> int | None:
        """The conversation becomes the live prefix (the next turn reports it cached)."""
        self.warmed.append(list(messages))
        self.live = self._count(messages)
        return self.live

    def close(self) -> bool:
        self.closed = True
        self._info = None
        return True


class FakeFactory:
    """engine_factory for make_app: records the engines it made."""

    def __init__(self, script: FakeScript | None = None) -> None:
        self.script = script or FakeScript()
        self.engines: list[FakeEngine] = []

    def __call__(self, profile) -> EngineAPI:
        engine = FakeEngine(profile, self.script)
        self.engines.append(engine)
        return engine
