"""`/undo` in the chat screen: the files the session's tool calls changed are put back (real
files, undo records in a real store), a file changed since the edit is shown with its diff to
restore anyway or keep, nothing is undone while a reply runs, and revising an earlier message
offers to undo the edits made after it first."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.content import Content
from textual.widgets import Static

from velo_chat.app.dialogs.choice import ChoiceDialog
from velo_chat.app.dialogs.tool_approval import UndoConflictDialog
from velo_chat.app.errors import UserError
from velo_chat.app.screens.chat_tools import UndoAsked, outcome_line, parse_undo
from velo_chat.app.tools.undo import UndoOutcome, record_change
from velo_chat.app.widgets.composer.composer import Composer
from velo_chat.app.widgets.transcript.transcript import Transcript
from velo_chat.store import SessionStore

from devkit.fake_engine import FakeScript
from tests.support.tui_helpers import chat, fake_app, wait_for

pytestmark = pytest.mark.usefixtures("bare_home")

OLD = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
NEW = OLD.replace("\n\ndef mul", "\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul")


async def opened(pilot, session_id: str) -> None:
    screen = chat(pilot.app)
    await wait_for(lambda: screen.model_ready)
    await screen.open_session(session_id)
    await pilot.pause()


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

        untouched = app.store.create_session("default")  # no tool changed a file
        app.store.add_message(untouched.id, "user", "a question")
        app.store.add_message(untouched.id, "assistant", "an answer")
        await opened(pilot, untouched.id)
        screen.query_one(Transcript).views()[0].focus()
        await pilot.press("e")
        await pilot.pause()
        assert not isinstance(app.screen, ChoiceDialog) and screen.revising is not None
