"""The TUI's side of tool calling: the approval dialog and its answers, a reply's calls as folded
blocks in the transcript, the live panel's step line, a turn's later steps streaming into their
own reply, and `/undo` (with files changed since, and offered before a revision).

The worker's side (the loop, the engine's calls) is tested elsewhere; here the screen gets the
messages the worker posts (`ToolApprovalAsked`, `ToolCallDone`, `ToolStepBegan`), with replies,
calls and results stored in a real store, the fake engine streaming the turn, and real files for
undo. Snapshots: the dialog with an edit's diff at 80x24, a session with a tool step at 120x40.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import difflib
from pathlib import Path

import pytest
from textual.content import Content
from textual.widgets import Collapsible, Static

from velo_chat.app.app import make_app
from velo_chat.app.dialogs.choice import ChoiceDialog
from velo_chat.app.dialogs.tool_approval import ToolApprovalDialog, UndoConflictDialog
from velo_chat.app.errors import UserError
from velo_chat.app.messages import ToolApprovalAsked, ToolCallDone, ToolStepBegan
from velo_chat.app.screens.chat_tools import UndoAsked, outcome_line, parse_undo
from velo_chat.app.screens.help import help_text
from velo_chat.app.settings import AppSettings
from velo_chat.app.tools.types import ApprovalAnswer, PreparedCall
from velo_chat.app.tools.undo import UndoOutcome, record_change
from velo_chat.app.widgets.composer.composer import Composer
from velo_chat.app.widgets.telemetry.panel import LivePanel
from velo_chat.app.widgets.transcript.message import MessageView
from velo_chat.app.widgets.transcript.tool_block import ToolBlock, capped, diff_counts, tool_title
from velo_chat.app.widgets.transcript.transcript import Transcript
from velo_chat.engine import ToolCall
from velo_chat.engine.prompt import template_env
from velo_chat.store import SessionStore
from velo_chat.store.models import StoredToolCall, ToolResult

from devkit.gguf_template import with_chat_template
from tests.support.engine_helpers import test_profile
from tests.support.fake_engine import FakeScript
from tests.support.llama_templates import read_template, templates_dir
from tests.support.tui_helpers import FIXED_NOW, chat, fake_app, wait_for

pytestmark = pytest.mark.usefixtures("bare_home")
TEMPLATES = templates_dir()


@pytest.fixture(autouse=True)
def keys_answer_at_once(monkeypatch):
    """The dialog ignores `y`/`a`/`n` for a moment after it opens (a key typed for the composer
    must not answer); the tests press keys at once, so no moment: one test sets it back."""
    monkeypatch.setattr(ToolApprovalDialog, "ARM_S", 0.0)


OLD = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
NEW = OLD.replace("\n\ndef mul", "\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul")
DIFF = "".join(difflib.unified_diff(OLD.splitlines(True), NEW.splitlines(True), "a/calc.py", "b/calc.py"))
PYTEST_OUT = "F.\nFAILED test_calc.py::test_sub - assert 2 == -1\n1 failed, 1 passed in 0.02s\n"


def edit_call(call_id: str = "call_1_1") -> PreparedCall:
    return PreparedCall(
        ToolCall("edit_file", {"path": "calc.py", "old": "...", "new": "..."}, id=call_id),
        "edit",
        "edit_file calc.py",
        diff=DIFF,
        paths=("/work/proj/calc.py",),
    )


def command_call(call_id: str = "call_1_2") -> PreparedCall:
    return PreparedCall(
        ToolCall("run_command", {"command": "pytest -q"}, id=call_id),
        "command",
        "run_command `pytest -q`",
        command="pytest -q",
        cwd="/work/proj",
    )


def stored(prepared: PreparedCall) -> StoredToolCall:
    c = prepared.call
    return StoredToolCall(c.id, c.name, dict(c.arguments), f'<tool_call>{{"name": "{c.name}"}}</tool_call>')


def result_of(index: int, prepared: PreparedCall, content: str, **kw) -> ToolResult:
    details = {"summary": prepared.summary, "kind": prepared.kind, "seconds": kw.pop("seconds", 0.25)}
    if prepared.diff:
        details["diff"] = prepared.diff
    if prepared.command:
        details["command"], details["cwd"] = prepared.command, prepared.cwd
    details.update(kw.pop("details", {}))
    return ToolResult(
        index,
        prepared.call.id,
        prepared.call.name,
        kw.pop("decision", "allowed"),
        content,
        kw.pop("ok", True),
        reason=kw.pop("reason", ""),
        details=details,
    )


def session_with_tool_step(store: SessionStore) -> tuple[str, int]:
    """A session: a question, a reply that edited a file and ran the tests (one failing), a reply
    whose write was refused, and the answer. Returns the session and the first reply's id."""
    session = store.create_session("default")
    store.add_message(session.id, "user", "Add a subtract function to calc.py and run the tests.")
    first = store.add_message(session.id, "assistant", "I'll add it, then run the tests.")
    edit, command = edit_call(), command_call()
    store.set_tool_calls(first.id, [stored(edit), stored(command)])
    store.add_tool_result(first.id, result_of(0, edit, "edited calc.py"))
    store.add_tool_result(
        first.id,
        result_of(1, command, PYTEST_OUT, ok=False, seconds=1.5, details={"exit_code": 1}),
    )
    second = store.add_message(session.id, "assistant", "")
    write = PreparedCall(
        ToolCall("write_file", {"path": "notes.md"}, id="call_2_1"), "edit", "write_file notes.md"
    )
    store.set_tool_calls(second.id, [stored(write)])
    store.add_tool_result(
        second.id,
        result_of(0, write, "refused", decision="refused", ok=False, reason="no notes please", seconds=0.0),
    )
    store.add_message(session.id, "assistant", "The test expects `sub(1, 2) == -1`: it passes now.")
    return session.id, first.id


async def opened(pilot, session_id: str) -> list[MessageView]:
    screen = chat(pilot.app)
    await wait_for(lambda: screen.model_ready)
    await screen.open_session(session_id)
    await pilot.pause()
    return [v for v in screen.query_one(Transcript).views() if v.role == "assistant"]


# -- pure parts ---------------------------------------------------------------------------------


def test_folded_line_says_what_came_of_each_call():
    edit, command = edit_call(), command_call()
    assert diff_counts(DIFF) == (4, 0)
    assert tool_title(stored(edit), result_of(0, edit, "ok")) == "edit_file calc.py · +4 −0 · 0.2 s"
    failed = result_of(1, command, PYTEST_OUT, ok=False, seconds=1.5, details={"exit_code": 1})
    assert (
        tool_title(stored(command), failed)
        == "run_command `pytest -q` · [b $error]exit 1[/] · 3 lines · 1.5 s"
    )
    refused = result_of(0, edit, "refused", decision="refused", ok=False, reason="not [now]")
    assert tool_title(stored(edit), refused) == "edit_file calc.py · [b $error]refused[/]: not \\[now]"
    bare = StoredToolCall("c", "read_file", {"path": "a.py"}, "")
    assert tool_title(bare, None) == "read_file a.py · [i]not run[/i]"


def test_undo_command_and_its_notice():
    assert parse_undo("hello") is None
    assert parse_undo("/undo") == UndoAsked(None)
    assert parse_undo(" /undo 4 ") == UndoAsked(4)
    assert parse_undo("/undone") is None
    with pytest.raises(UserError):
        parse_undo("/undo last")
    base = Path("/work/proj")
    line = outcome_line(
        UndoOutcome(restored=("/work/proj/a.py", "/etc/x"), removed=("/work/proj/new.py",)), base
    )
    assert line == "Undone: restored a.py, /etc/x; removed new.py."
    assert outcome_line(UndoOutcome(), base) == ""
    assert capped("\n".join(map(str, range(50))), 40).endswith("39\n… 10 more lines")


def test_the_help_lists_the_approval_keys():
    text = help_text({})
    for binding_id in ("approval.allow", "approval.allow_session", "approval.refuse", "approval.stop"):
        assert binding_id in text


# -- the dialog ---------------------------------------------------------------------------------


async def answer_of(tmp_path: Path, prepared: PreparedCall, *keys: str) -> ApprovalAnswer | None:
    app, _ = fake_app(tmp_path)
    answers: list[ApprovalAnswer | None] = []
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(lambda: chat(app).model_ready)
        app.push_screen(ToolApprovalDialog(prepared, 2, cursor_blink=False), answers.append)
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
        await pilot.pause()
        assert not isinstance(app.screen, ToolApprovalDialog)
    return answers[0]


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        (("y",), ApprovalAnswer("allowed")),
        (("a",), ApprovalAnswer("allowed_session")),
        (("n", *"not now", "enter"), ApprovalAnswer("refused", "not now")),
        (("n", "enter"), ApprovalAnswer("refused", "")),
        (("escape",), ApprovalAnswer("stopped")),
        (("enter", "n", "escape", "y"), ApprovalAnswer("allowed")),  # Enter decides nothing; Esc goes back
    ],
    ids=["allow", "session", "refuse-reason", "refuse-empty", "stop", "back"],
)
async def test_the_dialog_answers(tmp_path, keys, expected):
    assert await answer_of(tmp_path, command_call(), *keys) == expected


async def test_keys_that_come_as_the_dialog_opens_do_not_answer(tmp_path, monkeypatch):
    monkeypatch.setattr(ToolApprovalDialog, "ARM_S", 3600.0)
    app, _ = fake_app(tmp_path)
    answers: list[ApprovalAnswer | None] = []
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(lambda: chat(app).model_ready)
        app.push_screen(ToolApprovalDialog(command_call(), cursor_blink=False), answers.append)
        await pilot.pause()
        await pilot.press("y", "a", "n")
        await pilot.click("#allow")
        await pilot.pause()
        assert isinstance(app.screen, ToolApprovalDialog) and not answers
        assert "press it again" in str(app.screen.query_one("#approval-hint", Static).render())
        await pilot.press("escape")  # stopping is always safe: it works at once
        await pilot.pause()
    assert answers == [ApprovalAnswer("stopped")]


async def test_the_buttons_answer_too(tmp_path):
    app, _ = fake_app(tmp_path)
    answers: list[ApprovalAnswer | None] = []
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(lambda: chat(app).model_ready)
        app.push_screen(ToolApprovalDialog(command_call(), cursor_blink=False), answers.append)
        await pilot.pause()
        await pilot.click("#allow_session")
        await pilot.pause()
    assert answers == [ApprovalAnswer("allowed_session")]


async def test_the_dialog_shows_the_diff_coloured_and_an_outside_call_says_so(tmp_path):
    app, _ = fake_app(tmp_path)
    outside = PreparedCall(
        ToolCall("write_file", {"path": "/etc/hosts"}), "edit", "write_file /etc/hosts", outside=True,
        diff="--- a/etc/hosts\n+++ b/etc/hosts\n@@ -1 +1,2 @@\n 127.0.0.1 localhost\n+10.0.0.1 db\n-::1 x\n",
        paths=("/etc/hosts",),
    )  # fmt: skip
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(lambda: chat(app).model_ready)
        app.push_screen(ToolApprovalDialog(outside, cursor_blink=False))
        await pilot.pause()
        dialog = app.screen
        banner = dialog.query_one("#approval-outside", Static)
        assert "OUTSIDE the working folder: /etc/hosts" in str(banner.render())
        diff = dialog.query_one("#approval-diff", Static).render()
        assert isinstance(diff, Content)
        styles = {line.plain: [s.style for s in line.spans] for line in diff.split("\n")}
        assert styles["+10.0.0.1 db"] == ["$text-success"]
        assert styles["-::1 x"] == ["$text-error"]
        assert styles[" 127.0.0.1 localhost"] == []
        assert dialog.query_one("#approval-detail").has_focus  # the arrow keys scroll the diff


# -- the screen: approvals, steps, the panel ------------------------------------------------------


async def test_a_turn_with_tool_steps_shows_each_step_and_routes_the_stream(tmp_path):
    """Mid-turn (the fake engine paused), the worker's messages: the first call asks (its block
    waits, the dialog's answer reaches the worker, the block runs), its result comes (the block
    and the panel say so), then a second step starts and the rest of the stream fills it."""
    script = FakeScript(reply="Let me look. " * 4, pause_after=8)
    app, _ = fake_app(tmp_path, script)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = chat(app)
        await wait_for(lambda: screen.model_ready)
        screen.query_one(Composer).load_text("add sub to calc.py")
        await pilot.press("enter")
        await wait_for(
            lambda: screen.turn_view.reply is not None and screen.turn_view.reply.message_id is not None
        )
        first = screen.turn_view.reply
        assert first is not None and first.message_id is not None
        edit = edit_call()
        app.store.set_tool_calls(first.message_id, [stored(edit)])
        future: concurrent.futures.Future[ApprovalAnswer] = concurrent.futures.Future()
        screen.post_message(ToolApprovalAsked(edit, future, 1))
        await wait_for(lambda: isinstance(app.screen, ToolApprovalDialog))
        block = first.query_one(ToolBlock)
        assert "waiting for your approval" in block.title and block.has_class("-waiting")
        await pilot.press("y")
        assert future.result(timeout=5) == ApprovalAnswer("allowed")
        await wait_for(lambda: "running" in block.title)

        row = app.store.add_tool_result(first.message_id, result_of(0, edit, "edited calc.py"))
        screen.post_message(ToolCallDone(row, 1, 4.1, 0.8))
        await wait_for(lambda: "+4 −0" in block.title)
        panel = screen.query_one(LivePanel)
        assert panel.query_one("#panel-tools").display
        assert str(panel.query_one("#panel-tools", Static).render()) == "step 1\nmodel 4.1 s · tools 0.8 s"

        second_row = app.store.add_message(row.session_id, "assistant", "", status="interrupted")
        screen.post_message(ToolStepBegan(second_row, 2))
        await wait_for(lambda: screen.turn_view.reply is not first)
        second = screen.turn_view.reply
        assert second is not None and second.message_id == second_row.id and second.streaming
        assert not first.streaming
        first_text = first.text
        script.gate.set()
        await wait_for(lambda: not screen.busy)
        await pilot.pause()
        assert second.text == script.reply and first.text == first_text
        assert first.query_one(ToolBlock).title == "edit_file calc.py · +4 −0 · 0.2 s"


async def test_a_turn_that_ends_answers_an_open_question_stopped(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = chat(app)
        await wait_for(lambda: screen.model_ready)
        future: concurrent.futures.Future[ApprovalAnswer] = concurrent.futures.Future()
        screen.post_message(ToolApprovalAsked(command_call(), future, 1))
        await wait_for(lambda: isinstance(app.screen, ToolApprovalDialog))
        await screen.tool_steps.turn_ended()
        await pilot.pause()
        assert future.result(timeout=1) == ApprovalAnswer("stopped")
        assert not isinstance(app.screen, ToolApprovalDialog)


async def test_quitting_while_asked_answers_stopped(tmp_path):
    app, _ = fake_app(tmp_path)
    future: concurrent.futures.Future[ApprovalAnswer] = concurrent.futures.Future()
    async with app.run_test(size=(100, 30)):
        screen = chat(app)
        await wait_for(lambda: screen.model_ready)
        screen.post_message(ToolApprovalAsked(command_call(), future, 1))
        await wait_for(lambda: isinstance(app.screen, ToolApprovalDialog))
    assert future.result(timeout=1) == ApprovalAnswer("stopped")


async def test_a_question_the_worker_gave_up_on_is_not_asked(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = chat(app)
        await wait_for(lambda: screen.model_ready)
        future: concurrent.futures.Future[ApprovalAnswer] = concurrent.futures.Future()
        future.cancel()
        screen.post_message(ToolApprovalAsked(command_call(), future, 1))
        await pilot.pause()
        assert not isinstance(app.screen, ToolApprovalDialog)


async def test_a_real_tool_loop_in_the_tui(qwen_path, tmp_path, monkeypatch):
    """The whole path on the real engine: the tiny qwen4exp with a tool-capable template, calls
    forced (`tools.choice = "required"`), three steps, every call asking (`approve = "none"`).
    The dialog's answers reach the worker: reads and edits are allowed (the folder is a temporary
    one), a command is refused. Every step is a reply of its own with its calls folded under it,
    none left waiting or running, and the panel says step 3. (A random-weight model mostly writes
    calls that never close: those are invalid and do not ask; with this seed the first one does.)"""
    if TEMPLATES is None:
        pytest.skip("llama.cpp's chat templates are unavailable")
    monkeypatch.setattr(template_env, "now", lambda: datetime.datetime(2026, 1, 15, 12, 0))
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
        sampling={"temperature": 0.7, "seed": 4, "max_tokens": 80},
        checkpoints={"interval_tokens": 0, "min_prefill_tokens": 0},
        tools={"enabled": True, "choice": "required", "max_steps": 3, "approve": "none"},
    )
    profile = dataclasses.replace(profile, system_prompt="You fix bugs in the repository with the tools.")
    app = make_app(
        profile,
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
        while screen.busy:
            dialog = app.screen
            if isinstance(dialog, ToolApprovalDialog) and (not asked or asked[-1] is not dialog.prepared):
                asked.append(dialog.prepared)
                allow = dialog.prepared.kind != "command" and not dialog.prepared.outside
                await pilot.press("y" if allow else "n", *(() if allow else ("enter",)))
            await pilot.pause(0.05)
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
        decisions = [r.decision for reply in replies for r in reply.tool_results]
        assert asked, "seed 4 makes the first call a well-formed one, which asks (approve = none)"
        allowed = [p for p in asked if p.kind != "command" and not p.outside]
        assert decisions.count("allowed") == len(allowed)
        assert decisions.count("refused") == len(asked) - len(allowed)
        line = str(screen.query_one("#panel-tools", Static).render())
        assert line.startswith("step 3\nmodel ")


# -- the transcript -------------------------------------------------------------------------------


async def test_tool_blocks_fold_and_unfold_with_the_diff_and_the_exit_code(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        session_id, _ = session_with_tool_step(app.store)
        first, second, last = await opened(pilot, session_id)
        edit, command = first.query(ToolBlock)
        assert edit.title == "edit_file calc.py · +4 −0 · 0.2 s"
        assert command.title.startswith("run_command `pytest -q` · [b $error]exit 1[/]")
        assert all(b.collapsed for b in (edit, command)) and not first.query(".tool-diff")
        (refused,) = second.query(ToolBlock)
        assert "refused[/]: no notes please" in refused.title
        assert not second.query_one(".answer").display  # only calls: only the blocks
        assert not last.query(ToolBlock)

        first.focus()
        await pilot.press("o")
        await pilot.pause()
        assert not edit.collapsed and not command.collapsed
        diff = edit.query_one(".tool-diff", Static).render()
        assert isinstance(diff, Content) and "+def sub(a, b):" in diff.plain
        assert any(s.style == "$text-success" for s in diff.spans)
        assert str(command.query_one(".tool-command", Static).render()) == "$ pytest -q"
        output = command.query_one(".tool-output-fold", Collapsible)
        assert output.title == "output · exit 1 · 3 lines" and output.collapsed
        await pilot.press("o")
        await pilot.pause()
        assert edit.collapsed and command.collapsed


# -- undo -----------------------------------------------------------------------------------------


def edited_session(store: SessionStore, folder: Path) -> tuple[str, Path, Path]:
    """A session whose second turn's reply changed calc.py and created new.py (recorded for undo,
    and on disk)."""
    calc, new = folder / "calc.py", folder / "new.py"
    session = store.create_session("default", working_dir=str(folder))
    store.add_message(session.id, "user", "first question")
    store.add_message(session.id, "assistant", "first answer")
    store.add_message(session.id, "user", "add sub and a new module")
    reply = store.add_message(session.id, "assistant", "done")
    calc.write_text(NEW)
    new.write_text("x = 1\n")
    record_change(store, session.id, reply.id, 0, calc, OLD.encode(), NEW.encode())
    record_change(store, session.id, reply.id, 1, new, None, b"x = 1\n")
    return session.id, calc, new


async def send(pilot, text: str) -> None:
    chat(pilot.app).query_one(Composer).load_text(text)
    await pilot.press("enter")


async def test_undo_puts_the_files_back_and_says_so(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        session_id, calc, new = edited_session(app.store, tmp_path)
        await opened(pilot, session_id)
        said: list[str] = []
        app.notify = lambda message, **kw: said.append(message)
        await send(pilot, "/undo")
        await wait_for(lambda: bool(said))
        assert calc.read_text() == OLD and not new.exists()
        assert said == ["Undone: restored calc.py; removed new.py."]
        said.clear()
        await send(pilot, "/undo 2")
        await wait_for(lambda: bool(said))
        assert said[0].startswith("Nothing to undo")


async def test_undo_of_a_file_changed_since_asks_with_the_diff(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        session_id, calc, new = edited_session(app.store, tmp_path)
        await opened(pilot, session_id)
        calc.write_text(NEW + "# mine\n")
        await send(pilot, "/undo 2")
        await wait_for(lambda: isinstance(app.screen, UndoConflictDialog))
        assert not new.exists()  # the other file was put back
        diff = app.screen.query_one(".conflict-diff", Static).render()
        assert isinstance(diff, Content) and "+# mine" in diff.plain
        await pilot.click("#force")
        await wait_for(lambda: calc.read_text() == OLD)


async def test_undo_waits_for_the_reply_to_end(tmp_path):
    script = FakeScript(pause_after=4)
    app, _ = fake_app(tmp_path, script)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = chat(app)
        await wait_for(lambda: screen.model_ready)
        await send(pilot, "hello")
        await wait_for(lambda: screen.busy)
        await send(pilot, "/undo")
        await pilot.pause()
        assert screen.query_one(Composer).text == "/undo"  # given back, not queued
        assert len(screen.queue) == 0
        script.gate.set()
        await wait_for(lambda: not screen.busy)


async def test_revising_a_message_offers_to_undo_the_edits_after_it(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        session_id, calc, new = edited_session(app.store, tmp_path)
        await opened(pilot, session_id)
        screen = chat(app)
        question = [v for v in screen.query_one(Transcript).views() if v.role == "user"][1]
        question.focus()
        await pilot.press("e")
        await wait_for(lambda: isinstance(app.screen, ChoiceDialog))
        assert "changed 2 files: calc.py, new.py" in app.screen.title_text
        await pilot.press("up", "enter")  # "keep" is highlighted first: the safe default
        await wait_for(lambda: calc.read_text() == OLD and not new.exists())
        assert screen.query_one(Composer).text == "add sub and a new module"


async def test_the_offer_declined_keeps_the_files_and_no_edit_asks_nothing(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        session_id, calc, _ = edited_session(app.store, tmp_path)
        await opened(pilot, session_id)
        screen = chat(app)
        screen.query_one(Transcript).views()[0].focus()  # the first question: a later turn edited
        await pilot.press("e")
        await wait_for(lambda: isinstance(app.screen, ChoiceDialog))
        await pilot.press("escape")
        await pilot.pause()
        assert calc.read_text() == NEW and screen.revising is not None

        untouched, _ = session_with_tool_step(app.store)  # calls, but no file changed
        await opened(pilot, untouched)
        screen.query_one(Transcript).views()[0].focus()
        await pilot.press("e")
        await pilot.pause()
        assert not isinstance(app.screen, ChoiceDialog) and screen.revising is not None


# -- snapshots ------------------------------------------------------------------------------------


def test_snapshot_approval_dialog_edit(snap_compare, tmp_path):
    app, _ = fake_app(tmp_path)

    async def run(pilot):
        await wait_for(lambda: chat(pilot.app).model_ready)
        pilot.app.push_screen(ToolApprovalDialog(edit_call(), 2, cursor_blink=False))
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run)


def test_snapshot_transcript_with_a_tool_step(snap_compare, tmp_path):
    app, _ = fake_app(tmp_path)

    async def run(pilot):
        session_id, first_id = session_with_tool_step(pilot.app.store)
        first, *_ = await opened(pilot, session_id)
        screen = chat(pilot.app)
        screen.post_message(ToolCallDone(pilot.app.store.get_message(first_id), 2, 4.1, 0.8))
        edit = first.query(ToolBlock).first()
        edit.collapsed = False
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(120, 40), run_before=run)
