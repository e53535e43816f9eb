"""The TUI's tool loop: the generation worker's side of a turn whose reply calls tools.

`run_turn` (generation.py) hands a turn here when the profile offers tools. The loop itself is
`tools/loop.py`; this only connects it to the screen: each step streams as a reply does
(`stream_reply`), a step after the first is announced (`ToolStepBegan`) so the transcript gives
it its own reply, each stored result is posted (`ToolCallDone`), and a call that needs a person
posts `ToolApprovalAsked` and waits for the screen's answer, or for Esc (the turn's cancel),
which stops the loop. One `TurnEnded`, for the last step's reply, ends the turn.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from velo_chat.engine import EngineAPI, EngineEvent
from velo_chat.store import SessionStore

from .conversation import RecordedTurn, StartedTurn
from .errors import UserError
from .messages import EngineNotice, ToolApprovalAsked, ToolCallDone, ToolStepBegan
from .tools.approval import ApprovalPolicy
from .tools.loop import LoopHooks, StepEnd, ToolLoop
from .tools.toolbox import ToolBox
from .tools.types import ApprovalAnswer, PreparedCall

if TYPE_CHECKING:
    from .generation import Post, TurnRequest

log = logging.getLogger(__name__)

ANSWER_POLL_S = 0.1
"""How often a worker waiting for an approval checks whether the turn was cancelled."""


@dataclass(frozen=True)
class TurnTools:
    """A turn's toolbox (in the session's working folder) and the session's approval policy."""

    toolbox: ToolBox
    policy: ApprovalPolicy

    def turn_kwargs(self) -> dict[str, Any]:
        return {"tools": self.toolbox.specs, "tool_choice": self.toolbox.settings.choice}


def turn_tools(req: TurnRequest) -> TurnTools:
    """The tools of `req`'s turn; a profile whose `[tools]` names no known tool or rule raises
    `UserError` (the screen gives the text back with that line)."""
    session_dir = req.session.working_dir if req.session is not None else None
    root = Path(session_dir or req.working_dir or Path.cwd())
    settings = req.profile.tools
    try:
        toolbox = ToolBox(root, settings)
        policy = req.tool_policy if req.tool_policy is not None else ApprovalPolicy(settings)
    except ValueError as exc:
        raise UserError(f"profile {req.profile.name!r}: {exc}") from None
    return TurnTools(toolbox, policy)


def ask_screen(
    post: Post, cancel: threading.Event, is_cancelled: Callable[[], bool]
) -> Callable[[PreparedCall, int], ApprovalAnswer]:
    """`LoopHooks.ask` for the TUI: the screen shows the approval dialog and answers the future;
    a cancelled turn (Esc, the screen going away) answers "stopped", so the worker never hangs."""

    def ask(prepared: PreparedCall, step: int) -> ApprovalAnswer:
        answer: concurrent.futures.Future[ApprovalAnswer] = concurrent.futures.Future()
        post(ToolApprovalAsked(prepared, answer, step))
        while True:
            try:
                return answer.result(timeout=ANSWER_POLL_S)
            except concurrent.futures.TimeoutError:
                if cancel.is_set() or is_cancelled():
                    answer.cancel()
                    return ApprovalAnswer("stopped")

    return ask


def run_tool_steps(
    tools: TurnTools,
    store: SessionStore,
    engine: EngineAPI,
    started: StartedTurn,
    req: TurnRequest,
    post: Post,
    cancel: threading.Event,
    is_cancelled: Callable[[], bool],
) -> None:
    from .generation import post_ended, stream_reply  # generation.py imports this module

    info = engine.info
    assert info is not None
    last = [started.recorded]

    def step(_n: int, recorded: RecordedTurn, events: Iterator[EngineEvent]) -> StepEnd:
        last[0] = recorded
        done, failed = stream_reply(info, recorded, events, post, cancel, is_cancelled, req.paced)
        return StepEnd(done, failed)

    hooks = LoopHooks(
        ask=ask_screen(post, cancel, is_cancelled),
        on_step=lambda n, reply: post(ToolStepBegan(reply, n)),
        on_call=lambda n, reply, model_s, tool_s: post(ToolCallDone(reply, n, model_s, tool_s)),
    )
    loop = ToolLoop(
        store,
        engine,
        started.session,
        req.profile,
        tools.toolbox,
        tools.policy,
        hooks,
        cancel,
        sampling=req.profile.sampling,
        reasoning=req.reasoning_settings,
    )
    failed: str | None = None
    try:
        outcome = loop.run(started.recorded, started.events, step)
        failed = outcome.failed
        if outcome.stopped:
            post(EngineNotice(f"the tool loop ended: {outcome.stopped}"))
        stats = outcome.last.stats if outcome.last is not None else None
    except Exception as exc:  # the steps so far are stored; say what stopped the rest
        log.exception("the tool loop failed")
        failed, stats = f"{type(exc).__name__}: {exc}", None
    post_ended(last[0], stats, failed, post)
