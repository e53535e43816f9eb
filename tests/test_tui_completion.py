"""`@` path completion in the composer, driven with Textual's Pilot on a real folder: the list,
its keys, what accepting leaves in the text, and that Enter and Escape keep their meaning while
the list is closed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Static

from velo_chat.app import file_finder
from velo_chat.app.widgets.composer.completion import LISTING, PathCompletion
from velo_chat.app.widgets.composer.composer import Composer

CHAT_STYLES = Path(__file__).resolve().parents[1] / "assets" / "styles" / "chat.tcss"
SIZE = (80, 24)
FILES = ("main.py", "docs/manual.md", "src/format.py", "README.md", "notes.txt")


class ComposerApp(App[None]):
    """The composer in a container under a transcript stand-in, as on the chat screen."""

    CSS_PATH = CHAT_STYLES
    BINDINGS = [Binding("escape", "escape_reached", "stand-in for stopping a reply")]

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.chosen: list[tuple[str, ...]] = []
        self.submitted: list[str] = []
        self.escapes = 0

    def compose(self) -> ComposeResult:
        with Vertical(id="main"):
            yield Static("transcript", id="transcript")
            yield Composer(cursor_blink=False, id="composer")

    def on_mount(self) -> None:
        composer = self.query_one(Composer)
        composer.set_file_root(self.root)
        composer.focus()

    @on(Composer.FilesChosen)
    def _chosen(self, event: Composer.FilesChosen) -> None:
        self.chosen.append(event.paths)

    @on(Composer.Submitted)
    def _submitted(self, event: Composer.Submitted) -> None:
        self.submitted.append(event.text)

    def action_escape_reached(self) -> None:
        self.escapes += 1


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    for rel in FILES:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{rel}\n")
    return root


async def until(pilot, cond: Callable[[], bool], timeout: float = 60.0) -> None:  # a busy machine
    for _ in range(int(timeout / 0.02)):
        if cond():
            await pilot.pause()
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def completion(app: ComposerApp) -> PathCompletion:
    found = app.query_one(Composer).path_completion
    assert found is not None, "the list was never opened"
    return found


def showing_matches(app: ComposerApp) -> bool:
    found = app.query_one(Composer).path_completion
    return found is not None and found.display and bool(found.matches)


async def test_at_lists_matches_tab_moves_and_enter_accepts(tree: Path) -> None:
    app = ComposerApp(tree)
    async with app.run_test(size=SIZE) as pilot:
        composer = app.query_one(Composer)
        await pilot.press(*"read @ma")
        await until(pilot, lambda: showing_matches(app))
        # "ma" starts both names: the shorter path first; inside a word ("format") after them
        assert completion(app).matches == ("main.py", "docs/manual.md", "src/format.py")
        assert completion(app).highlighted_path == "main.py"
        await pilot.press("tab")
        assert completion(app).highlighted_path == "docs/manual.md"
        await pilot.press("enter")
        await until(pilot, lambda: bool(app.chosen))
        assert app.chosen == [("docs/manual.md",)]
        assert composer.text == "read "
        assert not completion(app).display
        assert app.submitted == []
        await pilot.press(*"now")  # the list stays closed: plain typing again
        assert composer.text == "read now" and not completion(app).display


async def test_down_up_wrap_and_the_rest_of_the_word_goes_with_the_token(tree: Path) -> None:
    app = ComposerApp(tree)
    async with app.run_test(size=SIZE) as pilot:
        composer = app.query_one(Composer)
        composer.load_text("see @manXX please")
        composer.move_cursor((0, len("see @ma")))
        await until(pilot, lambda: showing_matches(app))
        await pilot.press("up")  # from the first: wraps to the last
        assert completion(app).highlighted_path == completion(app).matches[-1]
        await pilot.press("down", "down")
        assert completion(app).highlighted_path == "docs/manual.md"
        await pilot.press("enter")
        await until(pilot, lambda: bool(app.chosen))
        assert app.chosen == [("docs/manual.md",)]
        assert composer.text == "see  please"


async def test_escape_closes_the_list_keeps_the_text_then_reaches_the_screen(tree: Path) -> None:
    app = ComposerApp(tree)
    async with app.run_test(size=SIZE) as pilot:
        composer = app.query_one(Composer)
        await pilot.press(*"see @ma")
        await until(pilot, lambda: showing_matches(app))
        await pilot.press("escape")
        assert not completion(app).display
        assert composer.text == "see @ma"
        assert app.escapes == 0  # the list took it
        await pilot.press("escape")
        assert app.escapes == 1  # closed: it reaches the screen (stops a reply there)
        await pilot.press("i")  # still the dismissed `@`: the list stays closed
        assert not completion(app).display
        await pilot.press("enter")
        await until(pilot, lambda: bool(app.submitted))
        assert app.submitted == ["see @mai"] and app.chosen == []


async def test_a_space_or_deleting_the_at_closes_the_list(tree: Path) -> None:
    app = ComposerApp(tree)
    async with app.run_test(size=SIZE) as pilot:
        composer = app.query_one(Composer)
        await pilot.press(*"@ma")
        await until(pilot, lambda: showing_matches(app))
        await pilot.press("space")
        assert not completion(app).display and composer.text == "@ma "
        await pilot.press("backspace")
        await until(pilot, lambda: showing_matches(app))  # back inside the token
        await pilot.press("backspace", "backspace", "backspace")
        assert composer.text == "" and not completion(app).display


async def test_leaving_the_composer_closes_the_list_and_typing_brings_it_back(tree: Path) -> None:
    app = ComposerApp(tree)
    async with app.run_test(size=SIZE) as pilot:
        composer = app.query_one(Composer)
        await pilot.press(*"@ma")
        await until(pilot, lambda: showing_matches(app))
        app.set_focus(None)
        await pilot.pause()
        assert not completion(app).display and composer.text == "@ma"
        composer.focus()
        await pilot.press("i")
        await until(pilot, lambda: showing_matches(app))
        assert completion(app).matches == ("main.py",)
        await pilot.press("tab")  # one match: nothing to move through, Tab takes it
        await until(pilot, lambda: bool(app.chosen))
        assert app.chosen == [("main.py",)] and composer.text == ""


async def test_keys_queued_behind_the_list_act_on_what_was_typed(tree: Path) -> None:
    """Keys that arrive together (a paste, tmux, a busy machine) reach the composer before the
    list has followed the first of them, and Enter's action runs ahead of them all: Tab and
    Enter still act on the `@ma` typed just before them."""
    app = ComposerApp(tree)
    async with app.run_test(size=SIZE) as pilot:
        composer = app.query_one(Composer)
        await pilot.press("@")
        await until(pilot, lambda: showing_matches(app))  # listed
        composer.clear()
        await pilot.pause()
        for key, char in (("at", "@"), ("m", "m"), ("a", "a"), ("tab", None), ("enter", None)):
            app.post_message(events.Key(key, char))
        await until(pilot, lambda: bool(app.chosen))
        assert app.chosen == [("docs/manual.md",)]
        assert composer.text == "" and app.submitted == []


async def test_enter_with_the_list_closed_still_sends(tree: Path) -> None:
    app = ComposerApp(tree)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"mail me@home")  # an `@` inside a word is no path
        await pilot.press("enter")
        await until(pilot, lambda: bool(app.submitted))
        assert app.submitted == ["mail me@home"]
        assert app.query_one(Composer).path_completion is None


async def test_without_a_root_at_is_plain_text(tree: Path) -> None:
    app = ComposerApp(tree)
    async with app.run_test(size=SIZE) as pilot:
        app.query_one(Composer).set_file_root(None)
        await pilot.press(*"@ma", "tab")
        assert app.query_one(Composer).path_completion is None
        assert app.query_one(Composer).text == "@ma"


async def test_the_list_sits_above_the_composer_and_moves_nothing(tree: Path) -> None:
    app = ComposerApp(tree)
    async with app.run_test(size=SIZE) as pilot:
        composer = app.query_one(Composer)
        transcript = app.query_one("#transcript")
        await pilot.pause()
        before = (transcript.region, composer.region)
        await pilot.press(*"@ma")
        await until(pilot, lambda: showing_matches(app))
        region = completion(app).region
        assert region.bottom == composer.region.y and region.height > 0
        assert (transcript.region, composer.region) == before
        await pilot.press("backspace")  # more matches: the list grows upwards only
        await pilot.pause()
        assert completion(app).region.bottom == composer.region.y
        assert (transcript.region, composer.region) == before


async def test_a_click_on_a_file_accepts_it(tree: Path) -> None:
    app = ComposerApp(tree)
    async with app.run_test(size=SIZE) as pilot:
        composer = app.query_one(Composer)
        await pilot.press(*"x @ma")
        await until(pilot, lambda: showing_matches(app))
        await pilot.click(PathCompletion, offset=(4, 2))  # the border, then the second file
        await until(pilot, lambda: bool(app.chosen))
        assert app.chosen == [("docs/manual.md",)]
        assert composer.text == "x " and composer.has_focus


async def test_while_listing_the_list_says_so_and_enter_does_not_send(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real_list_files = file_finder.list_files

    def slow_list_files(root: Path, max_files: int) -> list[str]:
        release.wait(timeout=60)
        return real_list_files(root, max_files)

    monkeypatch.setattr(file_finder, "list_files", slow_list_files)
    app = ComposerApp(tree)
    async with app.run_test(size=SIZE) as pilot:
        composer = app.query_one(Composer)
        try:
            await pilot.press(*"@ma")
            await pilot.pause()
            assert completion(app).display and completion(app).matches == ()
            assert str(completion(app).get_option_at_index(0).prompt) == LISTING
            await pilot.press("enter")  # nothing to accept: the list closes, nothing is sent
            await pilot.pause()
            assert not completion(app).display and composer.text == "@ma" and app.submitted == []
            await pilot.press("backspace")  # the same `@`: closed for it, as after Escape
            assert not completion(app).display
            await pilot.press("backspace", "backspace", *"@ma")  # a new `@`: the list again
            assert completion(app).display and composer.text == "@ma"
        finally:
            release.set()
        await until(pilot, lambda: showing_matches(app))
        assert completion(app).matches[0] == "main.py"
