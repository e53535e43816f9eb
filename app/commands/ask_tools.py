"""`velo-chat ask --tools`: the tool loop on the command line (app/tools/loop.py).

Each step's reply streams as `ask` streams a reply; each call prints one line on stderr (what it
is, who allowed it, what came of it). A call that needs a person asks on the terminal: the
summary, the diff of an edit or the command and its folder, then `[y]es / [a]lways (this tool,
this session) / [n]o / [s]top`. With no terminal, edits and commands are refused (the model is
told why) unless `--yes`; nothing outside the working folder runs without a person saying so on a
terminal, whatever `--yes` says (`ApprovalPolicy`).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from velo_chat.engine import EngineAPI, EngineEvent, TurnDone, TurnFailed
from velo_chat.engine.config import Profile
from velo_chat.store import Message, Session, SessionStore

from ..conversation import RecordedTurn, StartedTurn
from ..errors import UserError
from ..tools.approval import ApprovalPolicy
from ..tools.loop import LoopHooks, LoopOutcome, StepEnd, StreamStep, ToolLoop, pending_calls
from ..tools.toolbox import ToolBox
from ..tools.types import ApprovalAnswer, PreparedCall

NO_TERMINAL = "no one could approve it: velo-chat ran without a terminal (--yes allows edits and commands)"
ANSWERS = {
    "y": "allowed",
    "yes": "allowed",
    "a": "allowed_session",
    "always": "allowed_session",
    "n": "refused",
    "no": "refused",
    "s": "stopped",
    "stop": "stopped",
}


def terminal() -> TextIO | None:
    """The terminal a person can answer on: stdin when it is one (None: no person is there)."""
    return sys.stdin if sys.stdin.isatty() else None


def describe(prepared: PreparedCall) -> str:
    """What a person reads before answering: the call, where it acts, and its diff."""
    lines = [f"velo-chat: the model wants to {prepared.summary}"]
    if prepared.outside:
        lines.append("velo-chat: this reaches OUTSIDE the working folder")
    if prepared.command:
        lines.append(f"  command: {prepared.command}\n  folder:  {prepared.cwd}")
    if prepared.diff:
        lines.append(prepared.diff.rstrip("\n"))
    return "\n".join(lines)


def ask_on_terminal(
    tty: TextIO | None, out: TextIO = sys.stderr
) -> Callable[[PreparedCall, int], ApprovalAnswer]:
    """`LoopHooks.ask` for the CLI: a prompt on the terminal, or a refusal when there is none."""

    def ask(prepared: PreparedCall, _step: int) -> ApprovalAnswer:
        if tty is None:
            return ApprovalAnswer("refused", NO_TERMINAL)
        out.write(describe(prepared) + "\n")
        while True:
            out.write("Allow? [y]es once / [a]lways this tool / [n]o / [s]top the loop: ")
            out.flush()
            line = tty.readline()
            if not line:  # end of input: nobody answers
                return ApprovalAnswer("stopped")
            decision = ANSWERS.get(line.strip().lower())
            if decision == "refused":
                out.write("Reason for the model (optional, Enter for none): ")
                out.flush()
                return ApprovalAnswer("refused", tty.readline().strip())
            if decision is not None:
                return ApprovalAnswer(decision)  # type: ignore[arg-type]

    return ask


def call_lines(step: int, reply: Message, _model_s: float, _tool_s: float, out: TextIO = sys.stderr) -> None:
    """`LoopHooks.on_call`: one line for the call just decided (the last result of the reply)."""
    if not reply.tool_results:
        return
    result = reply.tool_results[-1]
    summary = result.details.get("summary") or result.tool
    what = {"auto": "ran", "allowed": "ran (allowed)", "allowed_session": "ran (allowed for the session)"}
    verdict = what.get(result.decision, result.decision)
    tail = f", exit code {result.details['exit_code']}" if "exit_code" in result.details else ""
    size = len(result.content.encode("utf-8"))
    out.write(f"velo-chat: step {step}: {summary}: {verdict}{tail} ({size:,} bytes to the model)\n")
    out.flush()


def cli_hooks(tty: TextIO | None) -> LoopHooks:
    return LoopHooks(ask=ask_on_terminal(tty), on_call=call_lines)


def stream_steps(
    stream: Callable[[Iterator[EngineEvent], bool], tuple[TurnDone | None, TurnFailed | None]], quiet: bool
) -> StreamStep:
    """A `StreamStep` that prints each step's reply as `ask` prints one."""

    def step(n: int, _recorded: RecordedTurn, events: Iterator[EngineEvent]) -> StepEnd:
        if n > 1 and not quiet:
            sys.stdout.write("\n")
        done, failed = stream(events, quiet)
        return StepEnd(done, failed.reason if failed is not None else None)

    return step


@dataclass(frozen=True)
class CliTools:
    """The tools of one `ask`: the toolbox in the working folder and the approval policy."""

    toolbox: ToolBox
    policy: ApprovalPolicy

    @classmethod
    def make(cls, profile: Profile, root: Path, *, assume_yes: bool) -> CliTools:
        """Raises `UserError` (one line) for settings that name no tool or no approval rule."""
        try:
            return cls(ToolBox(root, profile.tools), ApprovalPolicy(profile.tools, assume_yes=assume_yes))
        except ValueError as exc:
            raise UserError(f"profile {profile.name!r}: {exc}") from None

    def turn_kwargs(self) -> dict[str, Any]:
        """What the first step's `engine.turn` gets (through `start_turn`)."""
        return {"tools": self.toolbox.specs, "tool_choice": self.policy_choice}

    @property
    def policy_choice(self) -> str:
        return self.toolbox.settings.choice

    def run(
        self,
        store: SessionStore,
        engine: EngineAPI,
        started: StartedTurn,
        profile: Profile,
        stream: StreamStep,
    ) -> LoopOutcome:
        loop = ToolLoop(
            store,
            engine,
            started.session,
            profile,
            self.toolbox,
            self.policy,
            cli_hooks(terminal()),
            threading.Event(),
        )
        return loop.run(started.recorded, started.events, stream)


def resume_pending(
    store: SessionStore,
    engine: EngineAPI,
    session: Session,
    profile: Profile,
    tools: CliTools,
    stream: StreamStep,
    on_wait: Callable[[str], None] | None,
) -> LoopOutcome:
    """`ask --session ID --tools` with no prompt: go on with the session's tool loop where it
    stopped (its last reply has calls that never got a result: a quit while one waited for
    approval). Raises `UserError` when nothing is pending."""
    with store.writer(session.id, on_wait=on_wait):
        messages = store.messages(session.id)
        reply = messages[-1] if messages else None
        users = [m for m in messages if m.role == "user"]
        if reply is None or not users or not pending_calls(reply):
            raise UserError(
                f"session {session.id[:8]} has no tool call waiting: give a prompt to take a turn"
            )
        loop = ToolLoop(
            store,
            engine,
            session,
            profile,
            tools.toolbox,
            tools.policy,
            cli_hooks(terminal()),
            threading.Event(),
        )
        return loop.resume(reply, users[-1], stream)


def working_folder(session_dir: str | None) -> Path:
    """Where the tools act: the session's working folder, or here for a new session."""
    return Path(session_dir) if session_dir else Path.cwd()
