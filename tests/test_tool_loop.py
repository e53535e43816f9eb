"""The tool loop on the real engine: forced calls (`tools.choice = "required"`) on the tiny
hybrid qwen4exp built with tool-capable templates drive real loops through real tools in a
temporary folder, through the app's own turn path (`start_turn` + `ToolLoop`).

For each template: every step's reply is a well-formed call (the grammar admits nothing else),
stored with its result; every step after the first resumes from the checkpoint saved at the end
of the previous call and prefills only what the step appended (the results); and a step samples
exactly what a cold engine samples on the same conversation (the warm state is exact). The
engines run one thread and prefill one token per batch, as the template corpus does, so two
paths compute the same floats.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from pathlib import Path

import pytest

from velo_chat.app.conversation import engine_messages, start_turn
from velo_chat.app.tools.approval import ApprovalPolicy
from velo_chat.app.tools.loop import LoopHooks, StepEnd, ToolLoop, pending_calls
from velo_chat.app.tools.toolbox import ToolBox
from velo_chat.app.tools.types import ApprovalAnswer
from velo_chat.app.tools.undo import undo
from velo_chat.engine import ToolCall
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import TokenDelta, TurnDone, TurnStarted
from velo_chat.engine.prompt import template_env
from velo_chat.store import SessionStore

from devkit.gguf_template import with_chat_template
from tests.support.engine_helpers import test_profile
from tests.support.llama_templates import read_template, templates_dir
from tests.support.scripted_calls import ScriptedCalls

TEMPLATES = templates_dir()
TOOL_TEMPLATES = (
    "Qwen3-Coder",
    "Qwen3.5-4B",
    "Qwen-Qwen3-0.6B",
    "meta-llama-Llama-3.3-70B-Instruct",
    "Mistral-Small-3.2-24B-Instruct-2506",
    "openai-gpt-oss-120b",
)
STEPS = 3
THINKING_BUDGET = {"Qwen3.5-4B": 8}
"""Templates that open the reply in its reasoning: a budget closes it, and the required call is
constrained from there (random weights would otherwise think to the length limit)."""


@pytest.fixture(autouse=True)
def fixed_date(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_env, "now", lambda: datetime.datetime(2026, 1, 15, 12, 0))


def _repo(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def add(a, b):\n    return a - b\n", encoding="utf-8")
    (root / "tests").mkdir()
    (root / "tests" / "test_app.py").write_text(
        "from src.app import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"
    )
    (root / "README.md").write_text("# demo\n")
    return root


def _profile(model: Path, budget: int = 0, max_tokens: int = 80, **tools):
    profile = test_profile(
        model,
        context={"n_batch": 1, "n_ubatch": 1, "n_threads": 1, "n_ctx": 8192},
        sampling={"temperature": 0.7, "seed": 11, "max_tokens": max_tokens},
        checkpoints={"interval_tokens": 0, "min_prefill_tokens": 0},
        # a thinking template opens the reply in its reasoning: the budget closes it, and the
        # required call is constrained from there
        reasoning={"budget_tokens": budget},
        tools={"enabled": True, "choice": "required", "max_steps": STEPS, "approve": "read", **tools},
    )
    return dataclasses.replace(profile, system_prompt="You fix bugs in the repository with the tools.")


def _collect(events) -> tuple[TurnStarted, list[int], TurnDone | None]:
    started, tokens, done = None, [], None
    for event in events:
        if isinstance(event, TurnStarted):
            started = event
        elif isinstance(event, TokenDelta):
            tokens.append(event.token_id)
        elif isinstance(event, TurnDone):
            done = event
    assert started is not None
    return started, tokens, done


@pytest.mark.skipif(TEMPLATES is None, reason="llama.cpp's chat templates are unavailable")
@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_forced_calls_drive_a_warm_exact_loop(name, qwen_path, tmp_path):
    assert TEMPLATES is not None
    model = with_chat_template(qwen_path, read_template(TEMPLATES, name), tmp_path / f"{name}.gguf")
    repo = _repo(tmp_path / "repo")
    profile = _profile(model, THINKING_BUDGET.get(name, 0))
    toolbox = ToolBox(repo, profile.tools)
    asked: list[str] = []

    def ask(prepared, _step):
        asked.append(prepared.call.name)
        return ApprovalAnswer("refused", "not in this test")

    steps: list[tuple[TurnStarted, list[int], TurnDone | None]] = []

    def stream(_n, _recorded, events):
        steps.append(_collect(events))
        return StepEnd(steps[-1][2])

    cold_profile = dataclasses.replace(
        profile, checkpoints=dataclasses.replace(profile.checkpoints, enabled=False)
    )
    with (
        SessionStore(tmp_path / "s.sqlite3") as store,
        Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine,
        Engine(cold_profile) as cold,
    ):
        engine.load()
        cold.load()
        started = start_turn(
            store,
            engine,
            session=None,
            profile=profile,
            text="The test fails. Find the bug.",
            working_dir=str(repo),
            tools=toolbox.specs,
            tool_choice="required",
        )
        loop = ToolLoop(
            store, engine, started.session, profile, toolbox, ApprovalPolicy(profile.tools),
            LoopHooks(ask=ask), threading.Event(),
        )  # fmt: skip
        outcome = loop.run(started.recorded, started.events, stream)

        assert len(outcome.steps) == STEPS
        assert outcome.stopped and "max_steps" in outcome.stopped
        replies = [m for m in store.messages(started.session.id) if m.role == "assistant"]
        assert len(replies) == STEPS
        for reply in replies:
            # random weights may run out of tokens inside an argument: that call is an error the
            # model is told about, never a crash; a whole call runs (or is refused) as decided
            assert len(reply.tool_calls) >= 1, reply
            assert {r.call_index for r in reply.tool_results} == set(range(len(reply.tool_calls)))
            for call, result in zip(reply.tool_calls, reply.tool_results, strict=True):
                assert result.decision == ("invalid" if call.error else result.decision)
                assert call.error or result.decision in ("auto", "refused")
            assert reply.status == "complete"
            assert "empty_reply" not in reply.stats  # a reply that is only calls is not empty
        # every step after the first starts at least from the state before the previous reply:
        # it prefills the call (re-tokenized as the template renders it) and the results only
        for k in range(1, STEPS):
            begun, before = steps[k][0], steps[k - 1][0]
            assert begun.cached_tokens >= before.prompt_tokens - 1, (k, begun, before)
        # and samples what a cold engine samples on the same conversation
        messages = engine_messages(started.session.system_prompt, store.messages(started.session.id))
        cut = [i for i, m in enumerate(messages) if m.role == "assistant"]
        for k in range(1, STEPS):
            convo = messages[: cut[k]]
            _s, cold_tokens, _d = _collect(cold.turn(convo, tools=toolbox.specs, tool_choice="required"))
            assert cold_tokens == steps[k][1], f"step {k + 1} differs from a cold run"


class Quit(Exception):
    """The user quit while a call waited for approval."""


RESUME_SCRIPT = (
    ToolCall("write_file", {"path": "notes.txt", "content": "hi\n"}),
    ToolCall("read_file", {"path": "notes.txt"}),
)


@pytest.mark.skipif(TEMPLATES is None, reason="llama.cpp's chat templates are unavailable")
def test_a_loop_quit_at_a_call_goes_on_from_disk_in_a_new_process(qwen_path, tmp_path):
    """Scripted calls (`ScriptedCalls`): the first step writes a file, and the process quits while
    that call waits for approval. A new engine on the same store and checkpoint folder goes on:
    the write is approved and runs, and the next step resumes from the disk checkpoint at the end
    of the call. Then undo removes the file the loop created."""
    assert TEMPLATES is not None
    model = with_chat_template(qwen_path, read_template(TEMPLATES, "Qwen3-Coder"), tmp_path / "coder.gguf")
    repo = _repo(tmp_path / "repo")
    # a literal call may take a random model one token per character: room for the whole call
    profile = _profile(model, approve="read", max_tokens=400)
    toolbox = ToolBox(repo, profile.tools)
    db, ckpt = tmp_path / "s.sqlite3", tmp_path / "ckpt"
    prompts: list[TurnStarted] = []

    def stream(_n, _recorded, events):
        started, _tokens, done = _collect(events)
        prompts.append(started)
        return StepEnd(done)

    def quit_(_prepared, _step):
        raise Quit

    with SessionStore(db) as store, Engine(profile, checkpoint_root=ckpt) as real:
        real.load()
        engine = ScriptedCalls(real, RESUME_SCRIPT[:1])
        started = start_turn(
            store, engine, session=None, profile=profile, text="Write a note.", working_dir=str(repo),
            tools=toolbox.specs, tool_choice="required",
        )  # fmt: skip
        loop = ToolLoop(
            store, engine, started.session, profile, toolbox, ApprovalPolicy(profile.tools),
            LoopHooks(ask=quit_), threading.Event(),
        )  # fmt: skip
        with pytest.raises(Quit):
            loop.run(started.recorded, started.events, stream)
        session = started.session
    first_prompt = prompts[0].prompt_tokens
    assert not (repo / "notes.txt").exists()
    # a new process: nothing live, nothing in RAM; the disk tier holds the end of the call
    with SessionStore(db) as store, Engine(profile, checkpoint_root=ckpt) as real:
        real.load()
        messages = store.messages(session.id)
        reply, user = messages[-1], messages[-2]
        assert pending_calls(reply) == 1 and reply.tool_calls[0].name == "write_file"
        loop = ToolLoop(
            store, ScriptedCalls(real, RESUME_SCRIPT[1:]), session, profile, toolbox,
            ApprovalPolicy(profile.tools), LoopHooks(ask=lambda _p, _s: ApprovalAnswer("allowed")),
            threading.Event(),
        )  # fmt: skip
        outcome = loop.resume(reply, user, stream)
        assert (repo / "notes.txt").read_text() == "hi\n"
        assert [r.decision for r in store.get_message(reply.id).tool_results] == ["allowed"]
        resumed = prompts[1]
        assert resumed.source == "disk", resumed
        assert resumed.cached_tokens >= first_prompt - 1, (resumed, first_prompt)
        read = store.messages(session.id)[-2] if outcome.stopped is None else store.messages(session.id)[-1]
        assert any(
            r.tool == "read_file" and r.decision == "auto" and "hi" in r.content for r in read.tool_results
        )
        done = undo(store, session.id)
        assert done.removed == (str(repo / "notes.txt"),) and not (repo / "notes.txt").exists()
