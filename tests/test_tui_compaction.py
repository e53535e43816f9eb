"""Pilot tests of a full context in the TUI, on the scripted fake engine (the UI's flow only; what
the model sees and reuses is tested on real models in test_compaction.py): the line under the
composer once the next turn fills `context.compact_at`, `/compact` opening a continuation while
the original stays whole, the chain in the sidebar, a cancelled `/compact` changing nothing, a
turn that compacts first, the view marker after `drop_oldest`, and `/pin` chips.

The fake engine counts 4 tokens per message plus one per 4 characters. With `N_CTX` = 270 and
the default `compact_at` (0.85, about 229 tokens), a turn of a `LONG` question (104 tokens) and
`REPLY` (13) takes 117: the second turn's prompt (221) is below it, the third's (338) is not,
and the draft after two turns (238) is.
"""

from __future__ import annotations

import pytest

from velo_chat.app.dialogs.message import MessageDialog
from velo_chat.app.screens.chat_compact import compact_focus, fill_warning, turns_left
from velo_chat.app.widgets.composer.chips import AttachmentChips
from velo_chat.app.widgets.composer.composer import Composer
from velo_chat.app.widgets.sessions.sidebar import SessionList, session_label
from velo_chat.app.widgets.transcript.message import VIEW_START_TEXT, MessageView, ViewStartMarker
from velo_chat.app.widgets.transcript.transcript import Transcript
from velo_chat.engine.config.profiles import build_profile
from velo_chat.store import Session

from devkit.fake_engine import FakeScript
from tests.support.tui_helpers import fake_app
from tests.test_tui_coding_session import type_and_enter
from tests.test_tui_flows import ready, send, until

pytestmark = pytest.mark.usefixtures("bare_home")
SIZE = (120, 36)
N_CTX = 270
REPLY = "Noted: the parser keeps the last line."  # 38 characters: 13 tokens


def long_question(n: int) -> str:
    """A question of exactly 400 characters (104 tokens on the fake engine)."""
    head = f"Question {n}: "
    return head + "x" * (400 - len(head))


def profile(when_full: str = "compact"):
    return build_profile("default", {"context": {"when_full": when_full}})


def line_text(screen) -> str:
    return str(screen.query_one("#preview-line").render())


def shown(screen) -> list[tuple[str, str]]:
    return [(v.role, v.text) for v in screen.query_one(Transcript).views()]


def stored(app, session_id: str) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in app.store.messages(session_id)]


# -- the pure parts --------------------------------------------------------------------------------


def test_compact_focus_parses_only_the_command():
    assert compact_focus("/compact") == ""
    assert compact_focus("  /compact the parser and its tests ") == "the parser and its tests"
    assert compact_focus("/compacting is a word") is None
    assert compact_focus("please /compact") is None


@pytest.mark.parametrize(
    ("when_full", "tokens", "says"),
    [
        (
            "compact",
            230,
            "sending compacts this session into a continuation first (context.when_full = compact)",
        ),
        (
            "drop_oldest",
            230,
            "drops the oldest turns from the model's view first (context.when_full = drop_oldest)",
        ),
        ("refuse", 230, "a turn that does not fit will be refused"),
        ("refuse", 300, "sending is refused"),
    ],
)
def test_fill_warning_says_what_sending_will_do(when_full, tokens, says):
    line = fill_warning(tokens, N_CTX, profile(when_full))
    assert f"context {tokens / N_CTX:.0%} full" in line and says in line


def test_fill_warning_is_silent_below_compact_at_or_when_unknown():
    assert fill_warning(200, N_CTX, profile()) == ""
    assert fill_warning(0, N_CTX, profile()) == ""  # a remote engine cannot count


def test_turns_left_at_the_sessions_rate():
    assert turns_left(1000, 10, 4000, profile()) == 24  # 100 per turn up to 3,400
    assert turns_left(1000, 10, 4000, profile("refuse")) == 30  # up to the whole context
    assert turns_left(3500, 10, 4000, profile()) == 0
    assert turns_left(0, 0, 4000, profile()) is None


def session(title: str | None, *, continues: bool) -> Session:
    return Session(
        "c" * 32, title, 1.0, 1.0, "default", "", None, parent_session_id="p" * 32, continues=continues
    )


def test_a_continuation_is_labelled_in_the_sidebar():
    assert session_label(session("Parser bug (continued)", continues=True)) == "⤷ Parser bug (continued)"
    assert session_label(session(None, continues=True)) == "⤷ untitled (continued)"
    assert session_label(session("Parser bug", continues=False)) == "Parser bug"  # a fork


# -- the TUI ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("when_full", "says"),
    [
        ("compact", "sending compacts this session into a continuation first"),
        ("drop_oldest", "sending drops the oldest turns from the model's view first"),
        ("refuse", "a turn that does not fit will be refused"),
    ],
)
async def test_the_line_under_the_composer_warns_at_compact_at(tmp_path, when_full, says):
    app, _ = fake_app(tmp_path, FakeScript(reply=REPLY, n_ctx=N_CTX), profile=profile(when_full))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await send(pilot, long_question(1))
        await until(pilot, lambda: "reuses" in line_text(screen))
        assert "full" not in line_text(screen)  # 121 of 270 tokens: below compact_at
        await send(pilot, long_question(2))
        await until(pilot, lambda: says in line_text(screen))
        assert "context 88% full" in line_text(screen)
        assert f"context.when_full = {when_full}" in line_text(screen)
        panel = str(screen.query_one("#panel-context").render())
        assert "~0 turns left" in panel


async def test_compact_opens_a_continuation_and_the_original_stays_whole(tmp_path):
    app, factory = fake_app(tmp_path, FakeScript(reply=REPLY))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        for text in ("Where is the parser?", "Why does it drop the last line?", "Fix it"):
            await send(pilot, text)
        original = screen.session
        before = app.store.messages(original.id)
        await type_and_enter(pilot, "/compact the parser")
        await until(
            pilot, lambda: screen.session.id != original.id and not screen.busy and not screen.workers
        )
        continuation = screen.session
        assert continuation.continues and continuation.parent_session_id == original.id
        assert app.store.messages(original.id) == before  # the original is whole
        messages = stored(app, continuation.id)
        assert messages[0][0] == "user" and messages[0][1].endswith("Focus on: the parser")
        assert messages[1] == ("assistant", REPLY)  # the summary
        assert messages[2:] == stored(app, original.id)  # the three turns fit: kept verbatim
        assert shown(screen) == messages  # the continuation is open
        assert screen.query_one(Composer).text == ""
        assert factory.engines[-1].warmed  # its prefill was checkpointed at once
        sidebar = screen.query_one("#sidebar")
        order = [s.id for s in sidebar.sessions]
        assert order.index(continuation.id) == order.index(original.id) + 1  # the chain
        option = screen.query_one(SessionList).get_option_at_index(order.index(continuation.id))
        assert "⤷" in str(option.prompt) and "(continued)" in str(option.prompt)
        await screen.open_session(original.id)  # either can be opened
        assert shown(screen) == stored(app, original.id)


async def test_a_cancelled_compact_changes_nothing_and_gives_the_command_back(tmp_path):
    script = FakeScript(reply=REPLY)
    app, _ = fake_app(tmp_path, script)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await send(pilot, "Where is the parser?")
        original = screen.session
        before = app.store.messages(original.id)
        script.pause_after = 2  # the summary waits after two tokens
        await type_and_enter(pilot, "/compact")
        await until(pilot, lambda: "summary 2 tokens" in line_text(screen))
        assert screen.busy
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, MessageDialog))
        assert "cancelled" in app.screen.body
        await pilot.press("escape")
        await until(pilot, lambda: not screen.busy and not screen.workers)
        assert screen.query_one(Composer).text == "/compact"
        assert screen.session.id == original.id
        assert [s.id for s in app.store.list_sessions()] == [original.id]
        assert app.store.messages(original.id) == before
        assert shown(screen) == stored(app, original.id)


async def test_compact_in_a_new_session_is_refused_and_the_text_kept(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_and_enter(pilot, "/compact")
        assert screen.query_one(Composer).text == "/compact"
        assert not screen.busy and app.store.list_sessions() == []


async def test_a_turn_into_a_full_context_compacts_first_and_shows_the_continuation(tmp_path):
    script = FakeScript(reply=REPLY, n_ctx=N_CTX)
    app, _ = fake_app(tmp_path, script, profile=profile("compact"))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await send(pilot, long_question(1))
        await send(pilot, long_question(2))
        original = screen.session
        before = app.store.messages(original.id)
        script.pause_after = 2  # the summary turn waits: the line says what is happening
        await type_and_enter(pilot, long_question(3))
        await until(pilot, lambda: "compacting session" in line_text(screen))
        assert "the context is" in line_text(screen) and "full" in line_text(screen)
        script.pause_after = None
        script.gate.set()
        await until(pilot, lambda: not screen.busy and not screen.workers)
        continuation = screen.session
        assert continuation.continues and continuation.parent_session_id == original.id
        assert app.store.messages(original.id) == before
        messages = stored(app, continuation.id)
        assert messages[-2:] == [("user", long_question(3)), ("assistant", REPLY)]
        assert shown(screen) == messages  # the continuation's messages, then the turn


async def test_drop_oldest_marks_where_the_models_view_begins(tmp_path):
    app, _ = fake_app(tmp_path, FakeScript(reply=REPLY, n_ctx=N_CTX), profile=profile("drop_oldest"))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        for n in (1, 2, 3):
            await send(pilot, long_question(n))
        session = app.store.get_session(screen.session.id)
        assert session.view_start == 2  # the first turn left the model's view
        assert len(app.store.messages(session.id)) == 6  # and stays stored

        def marker_before() -> str | None:
            transcript = screen.query_one(Transcript)
            rows = [c for c in transcript.children if isinstance(c, (MessageView, ViewStartMarker))]
            at = next((i for i, row in enumerate(rows) if isinstance(row, ViewStartMarker)), None)
            if at is None or at + 1 >= len(rows):
                return None
            assert str(rows[at].render()) == VIEW_START_TEXT
            follower = rows[at + 1]
            return follower.text if isinstance(follower, MessageView) else None

        await until(pilot, lambda: marker_before() == long_question(2))
        assert len(screen.query(ViewStartMarker)) == 1
        await screen.open_session(session.id)  # from the store, as after a restart
        await until(pilot, lambda: marker_before() == long_question(2))
        assert len(screen.query(ViewStartMarker)) == 1


async def test_pin_attaches_pinned_files_with_a_pin_on_the_chip(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "notes.md").write_text("notes\n")
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_and_enter(pilot, "/pin calc.py")
        await type_and_enter(pilot, "/read notes.md")
        chips = screen.query_one(AttachmentChips)
        await until(pilot, lambda: len(chips.chips) == 2)
        assert [(a.path, a.pinned) for a in screen.files.files] == [("calc.py", True), ("notes.md", False)]
        labels = [str(label.render()) for label in chips.query(".chip-text")]
        assert "📌" in labels[0] and "📌" not in labels[1]
        await send(pilot, "Review it")
        first = app.store.messages(screen.session.id)[0]
        assert [(a.path, a.pinned) for a in first.attachments] == [("calc.py", True), ("notes.md", False)]


async def test_pin_without_a_path_is_a_dialog_and_the_text_is_kept(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await type_and_enter(pilot, "/pin")
        await until(pilot, lambda: isinstance(app.screen, MessageDialog))
        assert "/pin needs a path" in app.screen.body
        await pilot.press("escape")
        await pilot.pause()
        assert screen.query_one(Composer).text == "/pin" and not screen.files.files
