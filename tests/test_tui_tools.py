"""The TUI's side of tool calling: the approval dialog and its answers, a reply's calls as folded
blocks in the transcript, the live panel's step line, a turn's later steps streaming into their
own reply.

The worker's side (the loop, the engine's calls) is tested elsewhere; here the screen gets the
messages the worker posts (`ToolApprovalAsked`, `ToolCallDone`, `ToolStepBegan`), with replies,
calls and results stored in a real store and the fake engine streaming the turn. The whole path
on the real engine is in test_tui_tool_loop.py, `/undo` in test_tui_undo.py. Snapshots: the dialog with an
edit's diff at 80x24, a session with a tool step at 120x40.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import difflib
from pathlib import Path

import pytest
from textual.content import Content
from textual.widgets import Collapsible, Static

from velo_chat.app.dialogs.tool_approval import ToolApprovalDialog
from velo_chat.app.messages import ToolApprovalAsked, ToolCallDone, ToolStepBegan
from velo_chat.app.screens.help import help_text
from velo_chat.app.tools.types import ApprovalAnswer, PreparedCall
from velo_chat.app.widgets.composer.composer import Composer
from velo_chat.app.widgets.telemetry.panel import LivePanel
from velo_chat.app.widgets.transcript.message import MessageView
from velo_chat.app.tools.call_line import diff_counts, plain_line
from velo_chat.app.widgets.transcript.tool_block import ToolBlock, capped, tool_title
from velo_chat.app.widgets.transcript.transcript import Transcript
from velo_chat.engine import ToolCall
from velo_chat.store import SessionStore
from velo_chat.store.models import StoredToolCall, ToolResult

from devkit.fake_engine import FakeScript
from tests.support.llama_templates import templates_dir
from tests.support.tui_helpers import chat, fake_app, wait_for

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
    # the same facts as text, for `sessions show`
    assert plain_line(stored(command), failed) == "run_command `pytest -q` · exit 1 · 3 lines · 1.5 s"
    assert plain_line(stored(edit), refused) == "edit_file calc.py · refused: not [now]"
    assert plain_line(bare, None) == "read_file a.py · not run"
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


async def test_allowed_for_the_session_lasts_across_its_turns(tmp_path):
    """`a` answers for the session: each turn's request carries the session's approval state,
    the same one turn after turn (a new session's is kept once its first call is done)."""
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)):
        screen = chat(app)
        await wait_for(lambda: screen.model_ready)
        settings = app.profile.tools
        fresh = screen.tool_steps.policy(None, settings)
        session = app.store.create_session("default")
        app.store.add_message(session.id, "user", "q")
        reply = app.store.add_message(session.id, "assistant", "")
        fresh.allow_for_session("run_command")  # as the worker does on an `a`
        screen.post_message(ToolCallDone(reply, 1, 0.1, 0.1))
        await wait_for(lambda: screen.query_one("#panel-tools").display)  # the message was handled
        assert screen.tool_steps.policy(session, settings) is fresh
        assert "run_command" in screen.tool_steps.policy(session, settings).allowed_for_session
        stricter = dataclasses.replace(settings, approve="none")
        changed = screen.tool_steps.policy(session, stricter)
        assert changed is not fresh and changed.allowed_for_session == {"run_command"}
        other = app.store.create_session("default")
        assert not screen.tool_steps.policy(other, settings).allowed_for_session


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
