"""Code in the transcript is readable at any width: a code line wider than the transcript wraps
with a mark (never cut off silently, as Textual's fence does), copying a block still gives the
original text, and the side panes give way while the transcript is too narrow for its code
(the live panel first, then the sidebar), coming back when the window grows (only the ones that
gave way, never one the user hid with its key)."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.content import Content

from velo_chat.app.screens import chat as chat_module
from velo_chat.app.screens.chat import ChatScreen
from velo_chat.app.widgets.composer.composer import Composer
from velo_chat.app.widgets.transcript.code import (
    WRAP_MARK,
    CodeWrappingMarkdown,
    WrappedCode,
    WrappedFence,
    wrapped_rows,
)
from velo_chat.app.widgets.transcript.panes import GAVE_WAY, Pane, panes_to_show
from velo_chat.app.widgets.transcript.text import code_blocks, widest_code_line, wrap_offsets
from velo_chat.app.widgets.transcript.transcript import CODE_GUTTER, Transcript
from velo_chat.store import SessionStore

from devkit.fake_engine import FakeScript
from tests.support.tui_helpers import chat, fake_app, wait_for

pytestmark = pytest.mark.usefixtures("bare_home")

LINE_70 = "        current.next = self.head  # move the cursor to the head, again"
assert len(LINE_70) == 70
LINE_120 = "result = compute(" + ", ".join(f"arg{i}" for i in range(18)) + ")  # the end is here"
assert len(LINE_120) > 110
SIDEBAR, PANEL = 28, 30  # chat.tcss


def reply_with(*lines: str) -> str:
    code = "\n".join(lines)
    return f"Here it is:\n\n```python\n{code}\n```\n\nThat is all."


def session_with_reply(store: SessionStore, reply: str) -> str:
    session = store.create_session("default")
    store.add_message(session.id, "user", "show me")
    store.add_message(session.id, "assistant", reply)
    return session.id


def shown(screen: ChatScreen) -> dict[str, bool]:
    return {name: screen.query_one(f"#{name}").display for name in ("sidebar", "panel")}


def code_rows(screen: ChatScreen) -> list[str]:
    return [row for code in screen.query(WrappedCode) for row in code.plain_rows()]


def unwrapped(rows: list[str]) -> list[str]:
    """The code lines the rows show: each row that opens with the mark continues the one before."""
    lines: list[str] = []
    for row in rows:
        if row.startswith(WRAP_MARK) and lines:
            lines[-1] += row[len(WRAP_MARK) :]
        else:
            lines.append(row)
    return lines


def notices(app) -> list[str]:
    """What the app tells the user from now on."""
    said: list[str] = []
    app.notify = lambda message, **kw: said.append(message)
    return said


async def open_reply(pilot, reply: str) -> ChatScreen:
    screen = chat(pilot.app)
    await screen.open_session(session_with_reply(pilot.app.store, reply))
    await wait_for(
        lambda: bool(screen.query(WrappedCode)) and all(c.size.width for c in screen.query(WrappedCode))
    )
    await pilot.pause()
    return screen


async def resize(pilot, width: int, height: int) -> None:
    await pilot.resize_terminal(width, height)
    await wait_for(lambda: pilot.app.size == (width, height))
    await pilot.pause()
    await pilot.pause()


# -- the pure parts ------------------------------------------------------------------------------


def test_wrap_offsets_fill_each_row_and_leave_room_for_the_mark():
    assert wrap_offsets("abcdefghij", 4, 2) == [4, 6, 8]  # abcd | ↪ ef | ↪ gh | ↪ ij
    assert wrap_offsets("abcd", 4, 2) == []  # exactly as wide: not cut
    assert wrap_offsets("", 4, 2) == []


def test_wrap_offsets_never_split_a_wide_character():
    # each character takes two cells: two fit the first row (5 cells), one each after (3 cells)
    assert wrap_offsets("日本語日本", 5, 2) == [2, 3, 4]


def test_wrapped_rows_keep_every_character_and_mark_the_continuations():
    code = Content("short\n" + LINE_120 + "\n\n    indented")
    rows = wrapped_rows(code, 40, Content(WRAP_MARK))
    plain = [row.plain for row in rows]
    assert all(len(row) <= 40 for row in plain)
    assert sum(row.startswith(WRAP_MARK) for row in plain) >= 2
    assert unwrapped(plain) == ["short", LINE_120, "", "    indented"]


def test_widest_code_line_counts_cells_of_code_only():
    assert widest_code_line("no code here, " * 20) == 0
    assert widest_code_line(reply_with("x = 1", LINE_70)) == 70
    assert widest_code_line("- item\n\n  ```\n  \tab\n  ```") == 8 + 2  # the tab as drawn
    assert widest_code_line("```\n日本\n```") == 4


def panel(shown: bool = True, *, gave_way: bool = False, kept: bool = False) -> Pane:
    return Pane("panel", PANEL, shown, gave_way, kept)


def sidebar(shown: bool = True, *, gave_way: bool = False, kept: bool = False) -> Pane:
    return Pane("sidebar", SIDEBAR, shown, gave_way, kept)


def test_no_code_keeps_the_panes_as_they_are():
    assert panes_to_show(100, [panel(), sidebar()], 0, CODE_GUTTER, grow=False) == {"panel", "sidebar"}
    assert panes_to_show(100, [panel(False), sidebar()], 0, CODE_GUTTER, grow=True) == {"sidebar"}


def test_the_panel_gives_way_first_then_the_sidebar_as_few_as_it_takes():
    both = [panel(), sidebar()]
    assert panes_to_show(100, both, 60, CODE_GUTTER, grow=False) == {"sidebar"}  # 72 >= 60 + 11
    assert panes_to_show(100, both, 70, CODE_GUTTER, grow=False) == frozenset()
    assert panes_to_show(300, both, 70, CODE_GUTTER, grow=False) == {"panel", "sidebar"}
    assert panes_to_show(100, both, 500, CODE_GUTTER, grow=False) == frozenset()  # all it can


def test_panes_that_gave_way_come_back_on_a_resize_with_room_last_gone_first_back():
    gone = [panel(False, gave_way=True), sidebar(False, gave_way=True)]
    assert panes_to_show(100, gone, 70, CODE_GUTTER, grow=True) == frozenset()
    assert panes_to_show(110, gone, 70, CODE_GUTTER, grow=True) == {"sidebar"}
    assert panes_to_show(200, gone, 70, CODE_GUTTER, grow=True) == {"panel", "sidebar"}
    assert panes_to_show(200, gone, 70, CODE_GUTTER, grow=False) == frozenset()  # new code


def test_a_pane_the_user_hid_never_comes_back_and_one_they_showed_stays():
    user_hid_panel = [panel(False), sidebar(False, gave_way=True)]
    assert panes_to_show(300, user_hid_panel, 70, CODE_GUTTER, grow=True) == {"sidebar"}
    kept = [panel(kept=True), sidebar(False, gave_way=True)]
    assert panes_to_show(100, kept, 70, CODE_GUTTER, grow=False) == {"panel"}
    shown_again = [panel(gave_way=True), sidebar()]  # shown by another key, or a profile
    assert panes_to_show(100, shown_again, 70, CODE_GUTTER, grow=False) == {"panel"}


# -- Textual's fence cuts code off silently; ours wraps ------------------------------------------


class FenceApp(App):
    CSS_PATH = Path(chat_module.__file__).parent / ChatScreen.CSS_PATH

    def compose(self) -> ComposeResult:
        yield Transcript(id="transcript")


async def test_textuals_fence_hides_the_end_of_a_long_line_and_ours_does_not():
    from textual.widgets import Markdown
    from textual.widgets.markdown import MarkdownFence

    app = FenceApp()
    async with app.run_test(size=(60, 20)) as pilot:
        transcript = app.query_one(Transcript)
        await transcript.mount(stock := Markdown(reply_with(LINE_70)))
        await transcript.mount(ours := CodeWrappingMarkdown(reply_with(LINE_70)))
        await pilot.pause()

        fence = stock.query_one(MarkdownFence)
        assert fence.max_scroll_x > 0  # the rest of the line is off to the side ...
        assert fence.styles.scrollbar_size_horizontal == 0  # ... with nothing to say so

        wrapped = ours.query_one(WrappedFence)
        assert wrapped.max_scroll_x == 0
        rows = wrapped.query_one(WrappedCode).plain_rows()
        assert rows[1].startswith(WRAP_MARK)
        assert unwrapped(rows) == [LINE_70]


# -- the chat screen -----------------------------------------------------------------------------


async def test_at_100x30_both_panes_give_way_to_a_70_column_line_and_come_back(tmp_path: Path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        assert shown(chat(app)) == {"sidebar": True, "panel": True}
        said = notices(app)
        screen = await open_reply(pilot, reply_with("x = 1", LINE_70))

        assert shown(screen) == {"sidebar": False, "panel": False}
        assert said == ["Side panes hidden to fit code; Ctrl+B / Ctrl+T bring them back."]
        assert unwrapped(code_rows(screen)) == ["x = 1", LINE_70]
        assert not any(row.startswith(WRAP_MARK) for row in code_rows(screen))  # room for it now

        await resize(pilot, 200, 50)
        assert shown(screen) == {"sidebar": True, "panel": True}
        assert unwrapped(code_rows(screen)) == ["x = 1", LINE_70]
        assert len(said) == 1


async def test_at_100x30_only_the_panel_gives_way_when_that_is_enough(tmp_path: Path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_reply(pilot, reply_with("y" * 55))
        assert shown(screen) == {"sidebar": True, "panel": False}
        assert unwrapped(code_rows(screen)) == ["y" * 55]


async def test_at_80x24_a_line_wider_than_the_window_wraps_with_a_mark(tmp_path: Path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        assert shown(chat(app)) == {"sidebar": False, "panel": True}  # narrow: no sidebar
        screen = await open_reply(pilot, reply_with(LINE_120, LINE_70))

        assert shown(screen) == {"sidebar": False, "panel": False}
        rows = code_rows(screen)
        assert any(row.startswith(WRAP_MARK) for row in rows)
        assert unwrapped(rows) == [LINE_120, LINE_70]  # every character is on screen
        assert all(code.max_scroll_x == 0 for code in screen.query(WrappedFence))

        await resize(pilot, 200, 50)
        assert shown(screen) == {"sidebar": False, "panel": True}  # only what gave way
        assert unwrapped(code_rows(screen)) == [LINE_120, LINE_70]


async def test_copying_a_wrapped_code_block_gives_the_original_text(tmp_path: Path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_reply(pilot, reply_with(LINE_120, "\tindented"))
        reply = screen.query_one(Transcript).views()[-1]
        reply.focus()
        await pilot.press("y")
        await pilot.pause()
        assert app.clipboard == f"{LINE_120}\n\tindented\n"
        assert app.clipboard == code_blocks(reply.text)[0]


async def test_a_pane_the_user_hid_stays_hidden_when_the_window_grows(tmp_path: Path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("ctrl+t")  # the user hides the panel
        await pilot.pause()
        screen = await open_reply(pilot, reply_with(LINE_70))
        assert shown(screen) == {"sidebar": False, "panel": False}

        await resize(pilot, 200, 50)
        assert shown(screen) == {"sidebar": True, "panel": False}


async def test_a_pane_the_user_shows_again_stays_until_the_next_resize(tmp_path: Path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_reply(pilot, reply_with(LINE_70))
        assert shown(screen) == {"sidebar": False, "panel": False}
        await pilot.press("ctrl+t")  # the user wants the panel back
        await pilot.pause()
        assert shown(screen) == {"sidebar": False, "panel": True}

        await open_reply(pilot, reply_with(LINE_70 + "z"))  # more code: the user's choice wins
        assert shown(screen) == {"sidebar": False, "panel": True}

        await resize(pilot, 101, 30)  # a resize: the code's room counts again
        assert shown(screen) == {"sidebar": False, "panel": False}
        assert screen.query_one("#panel").has_class(GAVE_WAY)


async def test_a_streamed_reply_with_long_code_makes_the_panes_give_way_when_it_ends(tmp_path: Path):
    app, _ = fake_app(tmp_path, FakeScript(reply=reply_with(LINE_70)))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = chat(app)
        await wait_for(lambda: screen.model_ready)
        screen.query_one(Composer).load_text("a linked list, please")
        await pilot.press("enter")
        transcript = screen.query_one(Transcript)
        await wait_for(
            lambda: not screen.busy and any(v.text == reply_with(LINE_70) for v in transcript.views())
        )
        await wait_for(lambda: bool(screen.query(WrappedCode)))
        await pilot.pause()

        assert shown(screen) == {"sidebar": False, "panel": False}
        assert unwrapped(code_rows(screen)) == [LINE_70]


async def test_the_code_gutter_is_what_chat_tcss_makes_it(tmp_path: Path):
    long_session = reply_with(LINE_70) + "\n\nmore text\n" * 60  # tall enough for a scrollbar
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(200, 50)) as pilot:
        screen = await open_reply(pilot, long_session)
        transcript = screen.query_one(Transcript)
        await wait_for(lambda: transcript.max_scroll_y > 0)
        await pilot.pause()
        assert transcript.code_gutter() == CODE_GUTTER
