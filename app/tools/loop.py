"""The tool loop: a turn whose reply calls tools runs them and goes on, one step at a time.

A step is one engine turn. Its reply is stored like any other (streamed, then completed), with the
calls it made (`SessionStore.set_tool_calls`); each call is then checked (`ToolBox.prepare`),
decided (the profile's `tools.approve`, or a person: `LoopHooks.ask`), run, and its result stored
with the decision (`SessionStore.add_tool_result`), an edit's or a write's bytes before and after
going to the undo journal first. The next step appends nothing but those results to the
conversation, so the engine resumes from the checkpoint it saved at the end of the call, before
the tool ran (docs/tools.md): it prefills only the results.

The loop ends when a reply makes no call, when the user stops it (Esc, a "stopped" answer, the
turn's cancel event), when a step fails, or at `tools.max_steps` (a normal end, said in
`LoopOutcome.stopped`). History is only appended to: a stopped loop leaves every step stored,
and a call that never got a result reads as "not run" to the model (`conversation.NOT_RUN`).
The session's writer lock is held from the first step to the last.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from velo_chat.engine import EngineAPI, EngineEvent, PromptTooLong, ToolCall, ToolSpec, TurnDone
from velo_chat.engine.config import Profile, ReasoningSettings, SamplingSettings
from velo_chat.store import Message, Session, SessionStore, StoredToolCall, ToolResult

from ..conversation import RecordedTurn, engine_messages, record
from .approval import ApprovalPolicy
from .toolbox import ToolBox
from .types import ApprovalAnswer, Decision, PreparedCall, ToolOutcome
from .undo import record_change

log = logging.getLogger(__name__)

REFUSED = "The user refused this call."
STOPPED = "Not run: the user stopped the tool loop."


@dataclass(frozen=True)
class StepEnd:
    """How one step's reply ended, as the caller's `stream_step` saw it."""

    done: TurnDone | None  # None: it failed or stopped without a final event
    failed: str | None = None


StreamStep = Callable[[int, RecordedTurn, Iterator[EngineEvent]], StepEnd]
"""Streams one step's events (already passed through `conversation.record`) to the user and
says how the step ended: the CLI prints them, the TUI posts messages."""


@dataclass
class LoopHooks:
    """How the loop reaches a person and the screen. `ask` blocks until a person answers (the
    CLI's prompt, the TUI's dialog); the others only report."""

    ask: Callable[[PreparedCall, int], ApprovalAnswer]
    on_step: Callable[[int, Message], None] = lambda _step, _reply: None
    """A step after the first began: its reply row (status "interrupted" until it is done)."""
    on_call: Callable[[int, Message, float, float], None] = lambda _s, _r, _m, _t: None
    """A call's result was stored: the reply row with it, the turn's model and tool seconds."""


@dataclass(frozen=True)
class CallRecord:
    """One call as `ask --json` reports it."""

    tool: str
    arguments: dict[str, Any]
    decision: Decision
    ok: bool
    result_bytes: int
    seconds: float
    exit_code: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tool": self.tool,
            "arguments": self.arguments,
            "decision": self.decision,
            "ok": self.ok,
            "result_bytes": self.result_bytes,
            "seconds": round(self.seconds, 4),
        }
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        return out


@dataclass
class StepRecord:
    """One step: its reply's stats and the calls it made."""

    step: int
    reply_id: int
    stats: dict[str, Any] = field(default_factory=dict)
    calls: list[CallRecord] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "message_id": self.reply_id,
            "calls": [c.to_json() for c in self.calls],
            "stats": self.stats,
        }


@dataclass
class LoopOutcome:
    """What the loop did: every step, the last reply, and why it ended early (None: the model
    answered without a call)."""

    steps: list[StepRecord] = field(default_factory=list)
    last: TurnDone | None = None
    last_reply: Message | None = None
    failed: str | None = None
    stopped: str | None = None
    model_s: float = 0.0
    tool_s: float = 0.0


@dataclass
class ToolLoop:
    """The loop for one session's turn; `run` drives it from the first step's events."""

    store: SessionStore
    engine: EngineAPI
    session: Session
    profile: Profile
    toolbox: ToolBox
    policy: ApprovalPolicy
    hooks: LoopHooks
    cancel: threading.Event
    sampling: SamplingSettings | None = None
    reasoning: ReasoningSettings | None = None
    max_tokens: int | None = None

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return self.toolbox.specs

    def run(self, first: RecordedTurn, events: Iterator[EngineEvent], stream_step: StreamStep) -> LoopOutcome:
        """Run the steps from the first one (its `RecordedTurn`, whose writer lock the loop holds
        until its end, and its events) until the loop ends."""
        release, first.release = first.release, lambda: None  # held for the whole loop
        self._user = first.user
        out = LoopOutcome()
        try:
            self._drive(out, first, events, 1, stream_step)
        finally:
            release()
        return out

    def resume(self, reply: Message, user: Message, stream_step: StreamStep) -> LoopOutcome:
        """Go on with a loop that stopped between a call and its result (a quit while a call
        waited for approval): decide and run the calls of `reply` that have no result, then take
        the next steps, the first of which resumes from the checkpoint saved at the end of that
        call (on disk, in a new process). The caller holds the session's writer lock."""
        self._user = user
        out = LoopOutcome(last_reply=reply)
        messages = self.store.messages(self.session.id)
        step = _steps_since(messages, user.position)
        record_ = StepRecord(step, reply.id)
        out.steps.append(record_)
        recorded = RecordedTurn(self.store, self.session, user, reply)
        calls = [ToolCall(c.name, c.arguments, c.id, c.text, c.error) for c in reply.tool_calls]
        if not self._run_calls(step, recorded, calls, record_, out, stored=True):
            return out
        if step >= self.profile.tools.max_steps:
            out.stopped = f"reached tools.max_steps ({self.profile.tools.max_steps}) steps"
            return out
        started = self._next_step(out)
        if started is not None:
            self.hooks.on_step(step + 1, started[0].reply)
            self._drive(out, started[0], started[1], step + 1, stream_step)
        return out

    def _drive(
        self,
        out: LoopOutcome,
        recorded: RecordedTurn,
        events: Iterator[EngineEvent],
        step: int,
        stream_step: StreamStep,
    ) -> None:
        """Steps from `recorded` (its events not yet streamed) until the loop ends."""
        while True:
            end = stream_step(step, recorded, record(events, recorded))
            out.last, out.last_reply, out.failed = end.done, recorded.reply, end.failed
            record_ = StepRecord(step, recorded.reply.id)
            out.steps.append(record_)
            if end.done is None:
                break
            record_.stats = end.done.stats.to_json()
            out.model_s += end.done.stats.total_s
            if end.done.stats.finish_reason == "cancelled" or self.cancel.is_set():
                out.stopped = "stopped by the user"
                break
            if not end.done.tool_calls:
                break
            if not self._run_calls(step, recorded, end.done.tool_calls, record_, out):
                break
            if step >= self.profile.tools.max_steps:
                out.stopped = f"reached tools.max_steps ({self.profile.tools.max_steps}) steps"
                break
            step += 1
            started = self._next_step(out)
            if started is None:
                break
            recorded, events = started
            self.hooks.on_step(step, recorded.reply)

    # -- a step's calls -------------------------------------------------------------------------

    def _run_calls(
        self,
        step: int,
        recorded: RecordedTurn,
        calls: Sequence[ToolCall],
        record_: StepRecord,
        out: LoopOutcome,
        *,
        stored: bool = False,
    ) -> bool:
        """Decide and run each call of the step's reply that has no result yet, storing each
        result; False when the user stopped the loop (the calls after are stored as not run).
        `stored`: the calls are stored already (a resumed loop)."""
        if stored:
            reply = recorded.reply
        else:
            calls = [c if c.id else _with_id(c, step, i) for i, c in enumerate(calls)]
            reply = self.store.set_tool_calls(
                recorded.reply.id,
                [StoredToolCall(c.id, c.name, dict(c.arguments), c.text, c.error) for c in calls],
            )
            recorded.reply = reply
        decided = {r.call_index for r in reply.tool_results}
        stopped = False
        for i, call in enumerate(calls):
            if i in decided:
                continue
            prepared = self.toolbox.prepare(call)
            t0 = time.perf_counter()
            decision: Decision
            if stopped:
                decision, reason, outcome = "stopped", "", ToolOutcome(STOPPED, ok=False)
            else:
                decision, reason = self._decide(prepared, step)
                if decision == "stopped":
                    stopped = True
                    outcome = ToolOutcome(STOPPED, ok=False)
                elif decision == "invalid":
                    outcome = ToolOutcome(f"error: {prepared.error}", ok=False)
                elif decision == "refused":
                    outcome = ToolOutcome(f"{REFUSED} Reason: {reason}" if reason else REFUSED, ok=False)
                else:
                    outcome = self._execute(prepared, reply, i)
            seconds = time.perf_counter() - t0 if decision not in ("stopped", "invalid", "refused") else 0.0
            out.tool_s += outcome.seconds or seconds
            result = ToolResult(
                call_index=i,
                call_id=call.id,
                tool=call.name,
                decision=decision,
                content=outcome.content,
                ok=outcome.ok,
                reason=reason,
                details=_details(prepared, outcome, seconds),
                created_at=time.time(),
            )
            reply = self.store.add_tool_result(reply.id, result)
            recorded.reply = reply
            record_.calls.append(
                CallRecord(
                    call.name,
                    dict(call.arguments),
                    decision,
                    outcome.ok,
                    len(outcome.content.encode("utf-8")),
                    outcome.seconds or seconds,
                    outcome.exit_code,
                )
            )
            self.hooks.on_call(step, reply, out.model_s, out.tool_s)
        if stopped:
            out.stopped = "stopped by the user"
        return not stopped

    def _decide(self, prepared: PreparedCall, step: int) -> tuple[Decision, str]:
        if prepared.error:
            return "invalid", ""
        automatic = self.policy.automatic(prepared)
        if automatic is not None:
            return automatic, ""
        if self.cancel.is_set():
            return "stopped", ""
        answer = self.hooks.ask(prepared, step)
        if answer.decision == "allowed_session":
            self.policy.allow_for_session(prepared.call.name)
        return answer.decision, answer.reason

    def _execute(self, prepared: PreparedCall, reply: Message, index: int) -> ToolOutcome:
        """Run an allowed call; an edit's or a write's files go to the undo journal (their bytes
        before and after) once it ran. A tool that raises is the model's error, not a crash."""
        before = {p: _read(p) for p in prepared.paths}
        try:
            outcome = self.toolbox.run(prepared, self.cancel)
        except Exception as exc:  # a bug in a tool must not end the session
            log.exception("tool %s failed", prepared.call.name)
            outcome = ToolOutcome(f"error: the tool failed: {type(exc).__name__}: {exc}", ok=False)
        for path, old in before.items():
            new = _read(path)
            if new != old:
                record_change(self.store, self.session.id, reply.id, index, Path(path), old, new)
        return outcome

    # -- the next step --------------------------------------------------------------------------

    def _next_step(self, out: LoopOutcome) -> tuple[RecordedTurn, Iterator[EngineEvent]] | None:
        """Start the next step: the conversation now ends with the results, and the engine
        resumes from the checkpoint at the end of the call. None when it cannot start (said in
        `out`)."""
        session = self.store.get_session(self.session.id)
        messages = engine_messages(
            session.system_prompt, self.store.messages(session.id), view_start=session.view_start
        )
        try:
            events = self.engine.turn(
                messages,
                sampling=self.sampling,
                reasoning=self.reasoning,
                max_tokens=self.max_tokens,
                cancel=self.cancel,
                tools=self.specs,
                tool_choice=self.profile.tools.choice,
            )
        except PromptTooLong as exc:
            out.stopped = f"the context is full: {exc}"
            return None
        try:
            reply = self.store.add_message(session.id, "assistant", "", status="interrupted")
        except BaseException:
            events.close()
            raise
        return RecordedTurn(self.store, session, self._user, reply), events


def pending_calls(reply: Message) -> int:
    """How many calls of `reply` have no result: a loop that stopped there can go on
    (`ToolLoop.resume`)."""
    if reply.role != "assistant" or not reply.tool_calls:
        return 0
    return len(reply.tool_calls) - len(reply.tool_results)


def _steps_since(messages: Sequence[Message], user_position: int) -> int:
    """The step number of the last reply after the user message at `user_position`."""
    return max(1, sum(1 for m in messages if m.position > user_position and m.role == "assistant"))


def _with_id(call: ToolCall, step: int, index: int) -> ToolCall:
    from dataclasses import replace

    return replace(call, id=f"call_{step}_{index + 1}")


def _read(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        return None


def _details(prepared: PreparedCall, outcome: ToolOutcome, seconds: float) -> dict[str, Any]:
    """What the transcript shows of a call (`ToolResult.details`)."""
    out: dict[str, Any] = {
        "summary": prepared.summary,
        "kind": prepared.kind,
        "seconds": round(outcome.seconds or seconds, 4),
    }
    if prepared.diff:
        out["diff"] = prepared.diff
    if prepared.command:
        out["command"], out["cwd"] = prepared.command, prepared.cwd
    if prepared.outside:
        out["outside"] = True
    if outcome.exit_code is not None:
        out["exit_code"] = outcome.exit_code
    if outcome.truncated:
        out["truncated"] = True
    return out
