"""Pilot tests of a coding session's flows in the TUI, on the scripted fake engine (the UI's
flow only; what the model sees is tested on real models in test_attachments_templates.py and
test_cli_coding_session.py): attaching files with `/read`, refusals, revising an earlier message
in a fork, and the queue of messages typed while a reply streams, also across a quit.
"""

from __future__ import annotations

import pytest

from velo_chat.app.dialogs.confirm import ConfirmDialog
from velo_chat.app.dialogs.message import MessageDialog
from velo_chat.app.widgets.composer.chips import AttachmentChips
from velo_chat.app.widgets.composer.composer import Composer
from velo_chat.app.widgets.composer.queue import MessageQueue
from velo_chat.app.widgets.transcript.message import MessageView
from velo_chat.app.widgets.transcript.transcript import Transcript

from devkit.fake_engine import FakeScript
from tests.support.tui_helpers import fake_app, fixed_store
from tests.test_tui_flows import chat, ready, send, until

pytestmark = pytest.mark.usefixtures("bare_home")
SIZE = (120, 36)


async def type_and_enter(pilot, text: str) -> None:
    composer = chat(pilot.app).query_one(Composer)
    composer.focus()
    composer.load_text(text)
    await pilot.press("enter")
    await pilot.pause()


def user_texts(app, session_id: str) -> list[str]:
    return [m.content for m in app.store.messages(session_id) if m.role == "user"]


async def test_read_attaches_a_file_and_the_message_carries_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    app, factory = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_and_enter(pilot, "/read calc.py")
        chips = screen.query_one(AttachmentChips)
        await until(pilot, lambda: chips.display)
        assert [a.path for a in screen.files.files] == ["calc.py"]
        assert screen.query_one(Composer).text == ""  # the command is not sent as a message
        await send(pilot, "What does add do?")
        stored = app.store.messages(screen.session.id)
        assert stored[0].content == "What does add do?"
        assert [a.path for a in stored[0].attachments] == ["calc.py"]
        sent = factory.engines[-1].turns[-1][-1].content
        assert sent.startswith("calc.py\n```python\ndef add") and sent.endswith("What does add do?")
        assert not screen.files.files and not chips.display


@pytest.mark.parametrize(
    ("command", "why"),
    [("/read missing.py", "no such file"), ("/read blob.bin", "binary"), ("/read", "needs a path")],
)
async def test_a_refused_file_is_a_dialog_and_the_text_is_kept(tmp_path, monkeypatch, command, why):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "blob.bin").write_bytes(b"\x7fELF\x00\x00")
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_and_enter(pilot, command)
        await until(pilot, lambda: isinstance(app.screen, MessageDialog))
        assert why in app.screen.body
        await pilot.press("escape")
        await pilot.pause()
        assert screen.query_one(Composer).text == command
        assert not screen.files.files and app.store.list_sessions() == []


async def test_revising_an_earlier_message_forks_and_keeps_the_session(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        for text in ("First question", "Second question", "Third question"):
            await send(pilot, text)
        original = screen.session
        before = app.store.messages(original.id)
        second = [v for v in screen.query_one(Transcript).views() if v.role == "user"][1]
        second.focus()
        await pilot.press("e")
        await pilot.pause()
        composer = screen.query_one(Composer)
        assert composer.text == "Second question" and screen.revising is not None
        composer.load_text("Second question, revised")
        await pilot.press("enter")
        await until(pilot, lambda: not screen.busy and not screen.workers)
        fork = screen.session
        assert fork.id != original.id and fork.parent_session_id == original.id
        assert user_texts(app, fork.id) == ["First question", "Second question, revised"]
        assert app.store.messages(original.id) == before  # the session is as it was
        sidebar = screen.query_one("#sidebar")
        order = [s.id for s in sidebar.sessions]
        assert order.index(fork.id) == order.index(original.id) + 1  # the fork under its parent


async def test_regenerating_an_earlier_reply_forks(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await send(pilot, "One")
        await send(pilot, "Two")
        original = screen.session
        first_reply = [v for v in screen.query_one(Transcript).views() if v.role == "assistant"][0]
        first_reply.focus()
        await pilot.press("r")
        await until(
            pilot, lambda: screen.session.id != original.id and not screen.busy and not screen.workers
        )
        assert user_texts(app, screen.session.id) == ["One"]
        assert user_texts(app, original.id) == ["One", "Two"]


async def test_three_messages_queued_during_a_reply_are_answered_in_order(tmp_path):
    app, _ = fake_app(tmp_path, FakeScript(pause_after=2))
    script = None
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        script = app.host.engine.script  # type: ignore[union-attr]
        await type_and_enter(pilot, "Start")
        await until(pilot, lambda: screen.busy and screen.session is not None)
        for text in ("q1", "q2", "q3"):
            await type_and_enter(pilot, text)
        queue = screen.query_one(MessageQueue)
        assert queue.display and len(screen.queue) == 3
        assert [d.text for d in app.store.drafts(screen.session.id)] == ["q1", "q2", "q3"]  # stored at once
        script.gate.set()
        await until(pilot, lambda: not screen.busy and not len(screen.queue) and not screen.workers)
        await until(pilot, lambda: len(app.store.messages(screen.session.id)) == 8)
        assert user_texts(app, screen.session.id) == ["Start", "q1", "q2", "q3"]
        assert app.store.drafts(screen.session.id) == []
        assert not queue.display


async def test_queued_messages_survive_a_quit_and_are_offered_again(tmp_path):
    db = tmp_path / "sessions.db"
    app, _ = fake_app(tmp_path, FakeScript(pause_after=2), store=fixed_store(db))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_and_enter(pilot, "Start")
        await until(pilot, lambda: screen.busy and screen.session is not None)
        await type_and_enter(pilot, "later one")
        await type_and_enter(pilot, "later two")
        session_id = screen.session.id
        await app.action_quit()
    app2, _ = fake_app(tmp_path, store=fixed_store(db))
    async with app2.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await screen.open_session(session_id)
        await until(pilot, lambda: isinstance(app2.screen, ConfirmDialog))
        assert len(screen.queue) == 2 and screen.queue.paused
        await pilot.press("y")
        await until(pilot, lambda: not len(screen.queue) and not screen.busy and not screen.workers)
        await until(pilot, lambda: user_texts(app2, session_id)[-1:] == ["later two"])
        assert user_texts(app2, session_id) == ["Start", "later one", "later two"]


async def test_stopping_a_reply_pauses_the_queue_and_a_key_sends_it(tmp_path):
    app, _ = fake_app(tmp_path, FakeScript(pause_after=2))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_and_enter(pilot, "Start")
        await until(pilot, lambda: screen.busy and screen.session is not None)
        await type_and_enter(pilot, "next")
        await pilot.press("escape")
        await until(pilot, lambda: not screen.busy and not screen.workers)
        assert screen.queue.paused and len(screen.queue) == 1
        header = screen.query_one(MessageQueue).query_one(".queue-header")
        assert header.display and "Ctrl+S sends the next message" in str(header.render())
        app.host.engine.script.gate.set()  # type: ignore[union-attr]
        await pilot.press("ctrl+s")
        await until(pilot, lambda: not len(screen.queue) and not screen.busy and not screen.workers)
        await until(pilot, lambda: user_texts(app, screen.session.id) == ["Start", "next"])


async def test_a_queued_message_can_be_edited_in_place_or_removed(tmp_path):
    app, _ = fake_app(tmp_path, FakeScript(pause_after=2))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_and_enter(pilot, "Start")
        await until(pilot, lambda: screen.busy and screen.session is not None)
        for text in ("alpha", "beta", "gamma"):
            await type_and_enter(pilot, text)
        keys = [item.key for item in screen.queue.items]
        screen.query_one(MessageQueue).post_message(MessageQueue.EditRequested(keys[0]))
        await pilot.pause()
        composer = screen.query_one(Composer)
        assert composer.text == "alpha"
        composer.load_text("alpha, edited")
        await pilot.press("enter")
        await pilot.pause()
        screen.query_one(MessageQueue).post_message(MessageQueue.RemoveRequested(keys[1]))
        await pilot.pause()
        assert [d.text for d in app.store.drafts(screen.session.id)] == ["alpha, edited", "gamma"]
        app.host.engine.script.gate.set()  # type: ignore[union-attr]
        await until(pilot, lambda: not len(screen.queue) and not screen.busy and not screen.workers)
        await until(pilot, lambda: len(user_texts(app, screen.session.id)) == 3)
        assert user_texts(app, screen.session.id) == ["Start", "alpha, edited", "gamma"]


async def test_a_user_message_with_files_shows_them_folded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.md").write_text("# Notes\n\nline\n")
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_and_enter(pilot, "/read notes.md")
        await send(pilot, "Summarize")
        await screen.open_session(screen.session.id)  # from the store, as after a restart
        view = next(v for v in screen.query_one(Transcript).views() if v.role == "user")
        assert isinstance(view, MessageView)
        assert [a.path for a in view.attachments] == ["notes.md"]


async def test_at_completion_in_the_chat_attaches_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "notes.md").write_text("notes\n")
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        screen.query_one(Composer).focus()
        await pilot.press(*"explain @cal")
        composer = screen.query_one(Composer)
        await until(
            pilot, lambda: composer.path_completion is not None and bool(composer.path_completion.matches)
        )
        assert composer.path_completion.matches[0] == "calc.py"
        await pilot.press("enter")  # accepts the file; does not send
        await until(pilot, lambda: [a.path for a in screen.files.files] == ["calc.py"])
        assert composer.text.strip() == "explain" and app.store.list_sessions() == []


async def test_a_changed_file_attached_again_says_which_turn_holds_the_old_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "calc.py"
    source.write_text("def add(a, b):\n    return a + b\n")
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_and_enter(pilot, "/read calc.py")
        await send(pilot, "Review it")
        source.write_text("def add(a, b):\n    return b + a\n")
        await type_and_enter(pilot, "/read calc.py")
        chips = screen.query_one(AttachmentChips)
        await until(pilot, lambda: chips.display)
        assert "changed since turn 1" in str(chips.query_one(".chip-text").render())
        await send(pilot, "And now?")
        first, second = [m for m in app.store.messages(screen.session.id) if m.role == "user"]
        assert first.attachments[0].content.endswith("a + b\n")  # the old turn keeps the old version
        assert second.attachments[0].content.endswith("b + a\n")


async def test_a_turn_waits_for_another_writer_and_shows_what_it_added(tmp_path):
    import threading

    db = tmp_path / "sessions.db"
    app, _ = fake_app(tmp_path, store=fixed_store(db))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await send(pilot, "Mine first")
        session_id = screen.session.id
        other = fixed_store(db)  # another process's store on the same database
        held, release = threading.Event(), threading.Event()

        def writer() -> None:
            with other.writer(session_id):
                held.set()
                release.wait(60)
                other.add_exchange(session_id, "Theirs")

        thread = threading.Thread(target=writer)
        thread.start()
        held.wait(10)
        await type_and_enter(pilot, "Mine again")
        line = screen.query_one("#preview-line")
        await until(pilot, lambda: "waiting" in str(line.render()))
        release.set()
        thread.join(30)
        await until(pilot, lambda: not screen.busy and not screen.workers)
        assert user_texts(app, session_id) == ["Mine first", "Theirs", "Mine again"]
        shown = [v.text for v in screen.query_one(Transcript).views() if v.role == "user"]
        assert shown == ["Mine first", "Theirs", "Mine again"]
        other.close()
