"""The attachment chips above the composer and the queue of messages waiting for a reply to end:
what they show, the messages they post (by key, by mouse) and that they never crowd the composer
off an 80x24 terminal. Each host app plays the chat screen's part: it owns the list and shows it
again after a removal."""

from __future__ import annotations

from importlib.resources import files

from textual.app import App, ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from velo_chat.app.widgets.composer.chips import (
    AttachmentChips,
    Chip,
    ChipInfo,
    RemoveMark,
    chip_label,
    short_path,
)
from velo_chat.app.widgets.composer.composer import Composer
from velo_chat.app.widgets.composer.queue import (
    MessageQueue,
    QueuedItem,
    QueueEntry,
    first_line,
    item_label,
)

CHAT_CSS = str(files("velo_chat.assets.styles") / "chat.tcss")
SMALL = (80, 24)


def chip(name: str, tokens: int | None = 10, note: str = "") -> ChipInfo:
    return ChipInfo(path=f"src/pkg/{name}", lines=12, tokens=tokens, note=note)


def test_chip_label_says_path_lines_tokens_and_note():
    assert chip_label(ChipInfo("a.py", 1, 1)) == "a.py · 1 line · 1 token"
    assert chip_label(ChipInfo("a.py", 1200, None)) == "a.py · 1,200 lines · … tokens"
    noted = chip_label(ChipInfo("a.py", 3, 2500, note="changed since turn 3"))
    assert noted == "a.py · 3 lines · 2,500 tokens · changed since turn 3"


def test_a_long_path_keeps_its_end():
    long = "very/long/folder/names/that/go/on/and/on/module.py"
    short = short_path(long, width=20)
    assert len(short) == 20 and short.startswith("…") and short.endswith("/module.py")
    assert short_path("a/b.py", width=20) == "a/b.py"


def test_a_queued_item_shows_its_first_line_and_files():
    assert first_line("  hello\nworld\n") == "hello …"
    assert first_line("just one line\n\n") == "just one line"
    assert item_label(QueuedItem(1, "fix [this]\nplease", n_files=2)).plain == (
        "queued  fix [this] …  +2 files"
    )
    assert item_label(QueuedItem(1, "x", n_files=1)).plain.endswith("+1 file")
    assert item_label(QueuedItem(1, "x", editing=True)).plain == "editing  x"


class Layout(App[None]):
    """The chat screen's main column, with the real stylesheet: transcript, queue, chips,
    composer."""

    CSS_PATH = CHAT_CSS

    def __init__(self) -> None:
        super().__init__()
        self.attached: list[ChipInfo] = []
        self.removed: list[int] = []
        self.edit_requests: list[int] = []
        self.remove_requests: list[int] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="main"):
            yield Static("transcript", id="transcript")
            yield MessageQueue(id="queue")
            yield AttachmentChips(id="chips")
            yield Composer(id="composer", cursor_blink=False)

    def attach(self, chips: list[ChipInfo]) -> None:
        self.attached = list(chips)
        self.query_one(AttachmentChips).show(self.attached)

    def on_attachment_chips_removed(self, event: AttachmentChips.Removed) -> None:
        self.removed.append(event.index)
        del self.attached[event.index]
        self.query_one(AttachmentChips).show(self.attached)

    def on_message_queue_edit_requested(self, event: MessageQueue.EditRequested) -> None:
        self.edit_requests.append(event.key)

    def on_message_queue_remove_requested(self, event: MessageQueue.RemoveRequested) -> None:
        self.remove_requests.append(event.key)


def chip_texts(app: App[None]) -> list[str]:
    return [c.info.path for c in app.query_one(AttachmentChips).query_children(Chip)]


async def test_chips_are_hidden_until_something_is_attached():
    app = Layout()
    async with app.run_test(size=SMALL) as pilot:
        row = app.query_one(AttachmentChips)
        assert not row.display
        app.attach([chip("a.py"), chip("b.py", tokens=None)])
        await pilot.pause()
        assert row.display and chip_texts(app) == ["src/pkg/a.py", "src/pkg/b.py"]
        assert "… tokens" in str(row.query_children(Chip)[1].query_one(".chip-text").render())
        app.attach([])
        await pilot.pause()
        assert not row.display and chip_texts(app) == []


async def test_keys_move_between_chips_and_remove_the_focused_one():
    app = Layout()
    async with app.run_test(size=SMALL) as pilot:
        app.attach([chip("a.py"), chip("b.py"), chip("c.py")])
        await pilot.pause()
        chips = list(app.query_one(AttachmentChips).query_children(Chip))
        chips[0].focus()
        await pilot.pause()
        await pilot.press("left")  # already the first: stays
        assert app.focused is chips[0]
        await pilot.press("right")
        assert app.focused is chips[1]
        await pilot.press("delete")
        await pilot.pause()
        assert app.removed == [1]
        assert chip_texts(app) == ["src/pkg/a.py", "src/pkg/c.py"]
        # the focus stays in its place: on the chip that moved up into it
        assert isinstance(app.focused, Chip) and app.focused.info.path == "src/pkg/c.py"
        await pilot.press("backspace")  # the last one goes: the new last chip takes the focus
        await pilot.pause()
        assert app.removed == [1, 1]
        assert isinstance(app.focused, Chip) and app.focused.info.path == "src/pkg/a.py"


async def test_clicking_a_chips_cross_removes_it():
    app = Layout()
    async with app.run_test(size=SMALL) as pilot:
        app.attach([chip("a.py"), chip("b.py")])
        await pilot.pause()
        first = app.query_one(AttachmentChips).query_children(Chip)[0]
        assert await pilot.click(first.query_one(RemoveMark))
        await pilot.pause()
        assert app.removed == [0] and chip_texts(app) == ["src/pkg/b.py"]


async def test_six_chips_at_80_columns_leave_the_composer_on_screen():
    app = Layout()
    async with app.run_test(size=SMALL) as pilot:
        notes = ["", "changed since turn 3"]
        many = [
            chip(f"folder_{i}/module_{i}.py", tokens=i * 900 or None, note=notes[i % 2]) for i in range(6)
        ]
        app.attach(many)
        await pilot.pause()
        row = app.query_one(AttachmentChips)
        composer = app.query_one(Composer)
        screen = app.screen.region
        assert len(chip_texts(app)) == 6
        assert 1 <= row.region.height <= 3
        assert row.region.bottom <= composer.region.y  # above the composer, not over it
        assert composer.region.height >= 3 and screen.contains_region(composer.region)
        # every chip is narrower than the terminal, so focusing one can bring all of it in view
        assert all(c.region.width < SMALL[0] for c in row.query_children(Chip))


def entries(app: App[None]) -> list[QueueEntry]:
    return list(app.query_one(MessageQueue).query_children(QueueEntry))


async def test_queue_shows_items_and_posts_edit_and_remove_by_key():
    app = Layout()
    async with app.run_test(size=SMALL) as pilot:
        queue = app.query_one(MessageQueue)
        assert not queue.display
        items = [QueuedItem(7, "first\nmore"), QueuedItem(3, "second", n_files=2), QueuedItem(9, "third")]
        queue.show(items, paused=False)
        await pilot.pause()
        assert queue.display
        assert [str(e.render()) for e in entries(app)] == [
            "queued  first …",
            "queued  second  +2 files",
            "queued  third",
        ]
        assert not queue.query_one(".queue-header").display
        entries(app)[1].focus()
        await pilot.pause()
        await pilot.press("e")
        await pilot.press("enter")
        await pilot.press("d")
        await pilot.press("delete")
        await pilot.pause()
        assert app.edit_requests == [3, 3] and app.remove_requests == [3, 3]
        # the screen drops the item: the focus stays on the line, now the next message
        queue.show([items[0], items[2]], paused=False)
        await pilot.pause()
        assert isinstance(app.focused, QueueEntry) and app.focused.item.key == 9
        queue.show([], paused=False)
        await pilot.pause()
        assert not queue.display


async def test_a_paused_queue_says_so_with_the_screens_hint():
    app = Layout()
    async with app.run_test(size=SMALL) as pilot:
        queue = app.query_one(MessageQueue)
        editing = QueuedItem(2, "being edited", editing=True)
        queue.show([QueuedItem(1, "hello"), editing], paused=True, paused_hint="Ctrl+S sends")
        await pilot.pause()
        header = queue.query_one(".queue-header", Static)
        assert header.display and str(header.render()) == "queue paused — Ctrl+S sends"
        assert [e.has_class("-editing") for e in entries(app)] == [False, True]
        queue.show([QueuedItem(1, "hello")], paused=False)
        await pilot.pause()
        assert not header.display


async def test_a_long_queue_is_capped_and_scrolls():
    app = Layout()
    async with app.run_test(size=SMALL) as pilot:
        queue = app.query_one(MessageQueue)
        queue.show([QueuedItem(i, f"message {i}") for i in range(20)], paused=True, paused_hint="x")
        await pilot.pause()
        assert len(entries(app)) == 20
        assert queue.region.height <= 6 and queue.max_scroll_y > 0
        assert app.screen.region.contains_region(app.query_one(Composer).region)
