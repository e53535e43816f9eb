"""A user message's attached files show above its text as folded blocks ("📎 path · N lines");
`o` on the focused message opens and folds them, and an opened file shows its whole text in a
read-only area of at most 30 rows. The files come from the real store (SQLite in tmp_path), as a
session opened in the chat screen shows them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from textual.widgets import Markdown, TextArea

from velo_chat.app.widgets.transcript.files import FileBlock, file_title
from velo_chat.app.widgets.transcript.message import MessageView
from velo_chat.app.widgets.transcript.transcript import Transcript
from velo_chat.store import SessionStore
from velo_chat.store.models import Attachment

from tests.support.tui_helpers import chat, fake_app, wait_for

pytestmark = pytest.mark.usefixtures("bare_home")

MODEL_PY = "".join(f"line_{i} = {i}  # app/model.py\n" for i in range(1512))
NOTES = "[b]not markup[/b]\nsecond line"


def attachment(path: str, content: str) -> Attachment:
    data = content.encode()
    return Attachment(path, hashlib.sha256(data).hexdigest(), len(data), content)


def session_with_files(store: SessionStore) -> str:
    session = store.create_session("default")
    store.add_message(
        session.id,
        "user",
        "What does this do?",
        attachments=[attachment("app/model.py", MODEL_PY), attachment("notes/[x].md", NOTES)],
    )
    store.add_message(session.id, "assistant", "It counts.")
    return session.id


async def opened(pilot, session_id: str) -> MessageView:
    screen = chat(pilot.app)
    await screen.open_session(session_id)
    await pilot.pause()
    user = next(v for v in screen.query_one(Transcript).views() if v.role == "user")
    await wait_for(lambda: len(user.query(FileBlock)) == 2)
    return user


def test_title_counts_lines_and_names_the_path():
    assert file_title("app/model.py", MODEL_PY) == "📎 app/model.py · 1,512 lines"
    assert file_title("a.txt", "one line") == "📎 a.txt · 1 line"
    assert file_title("empty.txt", "") == "📎 empty.txt · 0 lines"


async def test_files_show_folded_above_the_typed_text(tmp_path: Path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        user = await opened(pilot, session_with_files(app.store))

        blocks = list(user.query(FileBlock))
        assert [b.title for b in blocks] == [
            "📎 app/model.py · 1,512 lines",
            "📎 notes/\\[x].md · 2 lines",  # escaped: the title is shown as written
        ]
        assert str(blocks[1].query_one("CollapsibleTitle").label).endswith("📎 notes/[x].md · 2 lines")
        assert all(b.collapsed for b in blocks)
        assert not user.query(TextArea)  # nothing is built for a file never opened
        children = list(user.children)
        answer = user.query_one(".answer", Markdown)
        assert all(children.index(b) < children.index(answer) for b in blocks)
        assert user.answer_text() == "What does this do?"


async def test_o_opens_and_folds_the_focused_messages_files(tmp_path: Path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        user = await opened(pilot, session_with_files(app.store))
        user.focus()
        await pilot.press("o")
        await wait_for(lambda: len(user.query(TextArea)) == 2)
        await pilot.pause()

        blocks = list(user.query(FileBlock))
        assert not any(b.collapsed for b in blocks)
        areas = [b.query_one(TextArea) for b in blocks]
        assert [a.text for a in areas] == [MODEL_PY, NOTES]  # the files whole, as sent
        assert all(a.read_only for a in areas)
        assert areas[0].outer_size.height <= 30  # a long file scrolls inside its block
        assert areas[0].max_scroll_y > 0

        user.focus()
        await pilot.press("o")
        await pilot.pause()
        assert all(b.collapsed for b in user.query(FileBlock))


async def test_o_opens_all_when_only_some_are_open(tmp_path: Path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        user = await opened(pilot, session_with_files(app.store))
        first, second = user.query(FileBlock)
        first.collapsed = False
        await pilot.pause()
        user.focus()
        await pilot.press("o")
        await pilot.pause()
        assert not first.collapsed and not second.collapsed


async def test_o_on_a_message_without_files_says_so(tmp_path: Path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await opened(pilot, session_with_files(app.store))
        said: list[str] = []
        app.notify = lambda message, **kw: said.append(message)
        reply = chat(app).query_one(Transcript).views()[-1]
        reply.focus()
        await pilot.press("o")
        await pilot.pause()
        assert said == ["This message has no attached files."]


async def test_copying_a_user_message_copies_its_typed_text_only(tmp_path: Path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        user = await opened(pilot, session_with_files(app.store))
        user.focus()
        await pilot.press("c")
        await pilot.pause()
        assert app.clipboard == "What does this do?"


async def test_the_message_of_a_turn_just_sent_shows_its_files(tmp_path: Path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = chat(app)
        await screen.turn_view.begin(
            "Explain", show_thinking=True, attachments=[attachment("app/model.py", MODEL_PY)]
        )
        await pilot.pause()
        user = screen.turn_view.user
        assert user is not None
        assert [b.title for b in user.query(FileBlock)] == ["📎 app/model.py · 1,512 lines"]
        assert user.text == "Explain"
        await screen.turn_view.remove()
