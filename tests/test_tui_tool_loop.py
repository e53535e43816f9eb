"""A tool loop in the TUI on the real engine: the generation worker's messages (approvals, steps,
results) reach the chat screen, the dialog's answers reach the worker, and each step shows as a
reply of its own with its calls folded under it."""

from __future__ import annotations

import dataclasses
import datetime

import pytest
from textual.widgets import Static

from velo_chat.app.app import make_app
from velo_chat.app.dialogs.tool_approval import ToolApprovalDialog
from velo_chat.app.settings import AppSettings
from velo_chat.app.tools.types import PreparedCall
from velo_chat.app.widgets.composer.composer import Composer
from velo_chat.app.widgets.transcript.tool_block import ToolBlock, tool_title
from velo_chat.app.widgets.transcript.transcript import Transcript
from velo_chat.engine import ToolCall
from velo_chat.engine.engine import Engine
from velo_chat.engine.prompt import template_env
from velo_chat.store import SessionStore

from devkit.gguf_template import with_chat_template
from tests.support.engine_helpers import test_profile
from tests.support.llama_templates import read_template, templates_dir
from tests.support.scripted_calls import ScriptedCalls
from tests.support.tui_helpers import FIXED_NOW, chat, wait_for

pytestmark = pytest.mark.usefixtures("bare_home")
TEMPLATES = templates_dir()


async def send(pilot, text: str) -> None:
    chat(pilot.app).query_one(Composer).load_text(text)
    await pilot.press("enter")


SCRIPT = (
    ToolCall("edit_file", {"path": "src/app.py", "old": "return a - b", "new": "return a + b"}),
    ToolCall("run_command", {"command": "python -m pytest -q"}),
    ToolCall("read_file", {"path": "src/app.py"}),
)
"""The calls the model makes, in order (`tests/support/scripted_calls.py`: each step's reply is
forced to be exactly that call as the template writes it, on the real engine)."""


async def test_a_real_tool_loop_in_the_tui(qwen_path, tmp_path, monkeypatch):
    """The whole path on the real engine: the tiny qwen4exp with a tool-capable template, three
    steps whose calls are scripted, every call asking (`approve = "none"`). The dialog's answers
    reach the worker: the edit is allowed from its diff, the command refused with a reason, the
    read allowed. Every step is a reply of its own with its calls folded under it, none left
    waiting or running, the panel says step 3; then `/undo` puts the edited file back."""
    if TEMPLATES is None:
        pytest.skip("llama.cpp's chat templates are unavailable")
    monkeypatch.setattr(template_env, "now", lambda: datetime.datetime(2026, 1, 15, 12, 0))
    monkeypatch.setattr(ToolApprovalDialog, "ARM_S", 0.0)  # the keys below answer at once
    model = with_chat_template(qwen_path, read_template(TEMPLATES, "Qwen3-Coder"), tmp_path / "coder.gguf")
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "app.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_app.py").write_text(
        "from src.app import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"
    )
    monkeypatch.chdir(repo)
    profile = test_profile(
        model,
        context={"n_batch": 1, "n_ubatch": 1, "n_threads": 1, "n_ctx": 8192},
        sampling={"temperature": 0.7, "seed": 4, "max_tokens": 400},  # a whole scripted call
        checkpoints={"interval_tokens": 0, "min_prefill_tokens": 0},
        tools={"enabled": True, "choice": "required", "max_steps": 3, "approve": "none"},
    )
    profile = dataclasses.replace(profile, system_prompt="You fix bugs in the repository with the tools.")
    app = make_app(
        profile,
        engine_factory=lambda p: ScriptedCalls(Engine(p), SCRIPT),
        store=SessionStore(tmp_path / "sessions.db"),
        settings=AppSettings(),
        clock=lambda: 100.0,
        wall_clock=lambda: FIXED_NOW,
        memory_probe=lambda: (300 << 20, None),
        memory_interval=None,
        cursor_blink=False,
        pace_stream=False,
    )
    asked: list[PreparedCall] = []
    async with app.run_test(size=(120, 40)) as pilot:
        screen = chat(app)
        await wait_for(lambda: screen.model_ready or app.screen is not screen, timeout=300)
        assert screen.model_ready, getattr(app.screen, "body", app.screen)  # a failed load's dialog
        await send(pilot, "The test fails. Find the bug.")
        await wait_for(lambda: screen.busy)
        for _ in range(6000):  # answer each question as it comes, for at most about 5 minutes
            if not screen.busy:
                break
            dialog = app.screen
            if isinstance(dialog, ToolApprovalDialog) and (not asked or asked[-1] is not dialog.prepared):
                asked.append(dialog.prepared)
                if dialog.prepared.kind == "command":
                    await pilot.press("n")
                    await pilot.pause()
                    await pilot.press(*"use unittest", "enter")
                else:
                    await pilot.press("y")
            await pilot.pause(0.05)
        else:
            pytest.fail("the turn did not end")
        await pilot.pause()
        replies = [m for m in app.store.messages(screen.session.id) if m.role == "assistant"]
        views = [v for v in screen.query_one(Transcript).views() if v.role == "assistant"]
        assert len(replies) == 3 and [v.message_id for v in views] == [r.id for r in replies]
        for reply, view in zip(replies, views, strict=True):
            blocks = list(view.query(ToolBlock))
            assert len(blocks) == len(reply.tool_calls) >= 1
            results = {r.call_index: r for r in reply.tool_results}
            for i, block in enumerate(blocks):
                assert block.title == tool_title(reply.tool_calls[i], results.get(i))
                assert not block.has_class("-waiting") and not block.has_class("-running")
            assert not view.streaming and view.text == reply.content
        assert [p.call.name for p in asked] == [c.name for c in SCRIPT]
        assert "-    return a - b" in asked[0].diff and "+    return a + b" in asked[0].diff
        results = [r for reply in replies for r in reply.tool_results]
        assert [r.decision for r in results] == ["allowed", "refused", "allowed"]
        assert results[1].reason == "use unittest" and "use unittest" in results[1].content
        assert "return a + b" in results[2].content  # the read saw the edit
        assert (repo / "src" / "app.py").read_text() == "def add(a, b):\n    return a + b\n"
        line = str(screen.query_one("#panel-tools", Static).render())
        assert line.startswith("step 3\nmodel ")
        await send(pilot, "/undo")
        await wait_for(lambda: (repo / "src" / "app.py").read_text() == "def add(a, b):\n    return a - b\n")
