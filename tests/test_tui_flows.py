"""Pilot behaviour tests of the TUI flows on a scripted fake engine (layout and flow only)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from velo_chat.app.screens.chat import ChatScreen
from velo_chat.app.screens.settings import SettingsScreen
from velo_chat.app.dialogs.confirm import ConfirmDialog
from velo_chat.app.dialogs.message import MessageDialog
from velo_chat.app.dialogs.text_prompt import TextPrompt
from velo_chat.app.gc_hold import HELD_THRESHOLD
from velo_chat.app.widgets.composer.composer import Composer
from velo_chat.app.widgets.sessions.sidebar import SessionList
from velo_chat.app.widgets.transcript.transcript import Transcript
from velo_chat.engine.llama.gguf_file import GGUFError
from velo_chat.engine.config.profiles import active_profile_name

from devkit.fake_engine import FakeScript
from tests.support.tui_helpers import fake_app

pytestmark = pytest.mark.usefixtures("bare_home")
SIZE = (120, 36)
CODE_REPLY = "Here you go:\n\n```python\nprint('hi')\n```\n\nand\n\n```sh\nls -l\n```\n"


async def until(pilot, cond, timeout: float = 60.0) -> None:  # generous: a loaded machine
    for _ in range(int(timeout / 0.02)):
        if cond():
            await pilot.pause()
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def chat(app) -> ChatScreen:
    return next(s for s in app.screen_stack if isinstance(s, ChatScreen))


async def ready(pilot) -> ChatScreen:
    """The chat screen, once its model is loaded."""
    screen = chat(pilot.app)
    await until(pilot, lambda: screen.model_ready)
    return screen


async def send(pilot, text: str) -> None:
    screen = chat(pilot.app)
    await until(pilot, lambda: screen.model_ready)
    composer = screen.query_one(Composer)
    composer.focus()
    composer.load_text(text)
    await pilot.press("enter")
    await until(pilot, lambda: not screen.busy and not screen.workers)


async def test_send_streams_and_persists(tmp_path):
    app, factory = fake_app(tmp_path, FakeScript(reply="Hello **there**."))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hi")
        views = chat(app).query_one(Transcript).views()
        assert [(v.role, v.text, v.status) for v in views] == [
            ("user", "hi", "complete"),
            ("assistant", "Hello **there**.", "complete"),
        ]
        session = app.store.list_sessions()[0]
        assert [m.content for m in app.store.messages(session.id)] == ["hi", "Hello **there**."]
        assert chat(app).session.id == session.id
        panel = chat(app).query_one("#panel-decode").render()
        assert "avg 100.0" in str(panel)
        await send(pilot, "again")  # the fake reports cached tokens from the live context
        assert len(app.store.messages(session.id)) == 4
        assert app.store.messages(session.id)[-1].stats["cached_tokens"] > 0
        assert len(factory.engines[0].turns[-1]) == 3  # the history went to the engine


@pytest.mark.parametrize("cores, drawn_first", [(2, True), (16, False)])
async def test_the_engine_starts_once_the_new_messages_are_drawn(tmp_path, monkeypatch, cores, drawn_first):
    """Where the decode's threads (the fake's: 2) take every core, the turn's worker starts
    after the frame that shows the question and the empty reply: after a short prefill that
    frame would otherwise be drawn over the decode's first tokens. With cores to spare it
    starts at once."""
    from velo_chat.app import generation

    started = []
    generate = ChatScreen._generate

    def record(screen, request):
        reply = screen.query_one(Transcript).views()[-1]
        started.append((reply.role, reply.region.height > 0))
        return generate(screen, request)

    monkeypatch.setattr(ChatScreen, "_generate", record)
    monkeypatch.setattr(generation, "usable_cores", lambda: cores)
    app, _ = fake_app(tmp_path, FakeScript(reply="Hello."))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hi")
        assert started == [("assistant", drawn_first)]


async def test_cancel_keeps_partial_reply_marked_interrupted(tmp_path):
    script = FakeScript(reply="one two three four five six", pause_after=3)
    app, _ = fake_app(tmp_path, script)
    async with app.run_test(size=SIZE) as pilot:
        screen = chat(app)
        await until(pilot, lambda: screen.model_ready)
        screen.query_one(Composer).load_text("count")
        await pilot.press("enter")
        await until(pilot, lambda: screen.turn_view.reply is not None and screen.turn_view.reply.text)
        await pilot.press("escape")
        await until(pilot, lambda: not screen.busy)
        reply = app.store.messages(app.store.list_sessions()[0].id)[-1]
        assert reply.status == "interrupted" and reply.content == "one two t"
        view = screen.query_one(Transcript).views()[-1]
        assert view.has_class("-interrupted") and "interrupted" in str(
            view.query_one(".message-header").render()
        )


async def test_cancel_mid_prefill(tmp_path):
    app, _ = fake_app(tmp_path, FakeScript(pause_in_prefill=True))
    async with app.run_test(size=SIZE) as pilot:
        screen = chat(app)
        await until(pilot, lambda: screen.model_ready)
        screen.query_one(Composer).load_text("long prompt")
        await pilot.press("enter")
        await until(pilot, lambda: screen.query_one("#panel-prefill").display)
        await pilot.press("escape")
        await until(pilot, lambda: not screen.busy)
        reply = app.store.messages(app.store.list_sessions()[0].id)[-1]
        assert reply.status == "interrupted" and reply.content == ""


async def test_enter_during_a_reply_queues_the_message_and_sends_it_once(tmp_path):
    script = FakeScript(pause_after=1)
    app, factory = fake_app(tmp_path, script)
    async with app.run_test(size=SIZE) as pilot:
        screen = chat(app)
        await until(pilot, lambda: screen.model_ready)
        screen.query_one(Composer).load_text("first")
        await pilot.press("enter")
        await until(pilot, lambda: screen.busy)
        screen.query_one(Composer).load_text("second")
        await pilot.press("enter")
        await pilot.pause()
        assert screen.query_one(Composer).text == "" and len(screen.queue) == 1
        assert len(factory.engines[0].turns) == 1  # queued, not sent beside the running turn
        script.gate.set()
        await until(pilot, lambda: not screen.busy and not len(screen.queue) and not screen.workers)
        await until(pilot, lambda: len(factory.engines[0].turns) == 2)
        assert [turn[-1].content for turn in factory.engines[0].turns] == ["first", "second"]


async def test_streaming_holds_the_cursors_still_and_marks_only_the_composer(tmp_path):
    """While a reply streams nothing blinks (a blink is a frame taken from the decode on a
    small machine), the busy mark restyles the composer, not every widget of the screen, and no
    full garbage collection runs (app/gc_hold.py); typing still works, and all of it comes back
    when the reply ends."""
    full_threshold = gc.get_threshold()[2]
    script = FakeScript(pause_after=2)
    app, _ = fake_app(tmp_path, script, cursor_blink=True)
    async with app.run_test(size=SIZE) as pilot:
        screen = chat(app)
        composer = screen.query_one(Composer)
        await until(pilot, lambda: screen.model_ready)
        assert composer.cursor_blink
        composer.load_text("first")
        await pilot.press("enter")
        await until(pilot, lambda: screen.busy)
        assert not composer.cursor_blink and not screen.query_one("#session-filter").cursor_blink
        assert composer.has_class("-busy") and not screen.has_class("-busy")
        assert gc.get_threshold()[2] == HELD_THRESHOLD
        await pilot.press("n", "e", "x", "t")
        assert composer.text == "next"
        script.gate.set()
        await until(pilot, lambda: not screen.busy)
        assert composer.cursor_blink and screen.query_one("#session-filter").cursor_blink
        assert not composer.has_class("-busy") and composer.text == "next"
        assert gc.get_threshold()[2] == full_threshold


async def test_prompt_too_long_writes_nothing_and_says_why(tmp_path):
    app, _ = fake_app(tmp_path, FakeScript(prompt_limit=10))
    async with app.run_test(size=SIZE) as pilot:
        screen = chat(app)
        await until(pilot, lambda: screen.model_ready)
        screen.query_one(Composer).load_text("x" * 200)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, MessageDialog))
        assert "context holds" in app.screen.body
        assert app.store.list_sessions() == []
        await pilot.press("escape")
        assert screen.query_one(Composer).text == "x" * 200
        assert screen.query_one(Transcript).views() == []


async def test_load_error_is_a_dialog_not_a_crash(tmp_path):
    script = FakeScript(load_error=GGUFError("/x.gguf: not a GGUF file (bad magic)"))
    app, _ = fake_app(tmp_path, script)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, MessageDialog))
        assert "bad magic" in app.screen.body
        await pilot.press("escape")
        screen = chat(app)
        screen.query_one(Composer).load_text("hi")
        await pilot.press("enter")
        await pilot.pause()
        assert screen.query_one(Transcript).views() == []


async def test_new_rename_delete_fork(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = chat(app)
        await send(pilot, "first chat")
        first = screen.session
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert screen.session is None and screen.query_one(Transcript).views() == []
        await send(pilot, "second chat")
        assert len(app.store.list_sessions()) == 2
        # rename the active session
        screen.query_one(SessionList).focus()
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, TextPrompt))
        app.screen.query_one("Input").value = "Renamed"
        await pilot.press("enter")
        await pilot.pause()
        assert app.store.get_session(screen.session.id).title == "Renamed"
        # fork it: a new active session with the same messages
        await pilot.press("f")
        await pilot.pause()
        assert screen.session.parent_session_id is not None
        assert [m.content for m in app.store.messages(screen.session.id)][0] == "second chat"
        # delete the first session from the list, after confirming
        lst = screen.query_one(SessionList)
        lst.focus()
        lst.highlighted = [s.id for s in screen.query_one("#sidebar").sessions].index(first.id)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await pilot.press("y")
        await pilot.pause()
        assert first.id not in {s.id for s in app.store.list_sessions()}
        # switching by selecting in the list shows that session
        lst.focus()
        lst.highlighted = 0
        await pilot.press("enter")
        await pilot.pause()
        assert screen.session.id == screen.query_one("#sidebar").sessions[0].id  # the tree's first row


async def test_filter_sessions_as_you_type(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = chat(app)
        await send(pilot, "about apples")
        await pilot.press("ctrl+n")
        await send(pilot, "about pears")
        await pilot.press("ctrl+f")
        await pilot.press(*"apple")
        await pilot.pause()
        shown = screen.query_one("#sidebar").sessions
        assert [s.title for s in shown] == ["about apples"]


async def test_copy_code_block_and_message(tmp_path):
    app, _ = fake_app(tmp_path, FakeScript(reply=CODE_REPLY))
    copied: list[str] = []
    app.copy_to_clipboard = copied.append  # OSC 52 goes nowhere in a headless test
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "code please")
        view = chat(app).query_one(Transcript).last_reply()
        view.focus()
        await pilot.press("y")
        await pilot.press("y")
        await pilot.press("c")
        assert copied == ["print('hi')\n", "ls -l\n", CODE_REPLY]


async def test_history_recall(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "one")
        await send(pilot, "two")
        composer = chat(app).query_one(Composer)
        composer.focus()
        await pilot.press("up")
        assert composer.text == "two"
        await pilot.press("up")
        assert composer.text == "one"
        await pilot.press("down", "down")
        assert composer.text == ""


async def test_switch_profile_in_settings(tmp_path):
    app, factory = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: chat(app).model_ready)
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        lst = app.screen.query_one("#profile-list")
        lst.highlighted = app.screen.names.index("spark-qwen38")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))  # a reload: asks
        await pilot.press("y")
        await pilot.pause()
        assert app.profile.name == "spark-qwen38" and active_profile_name() == "spark-qwen38"
        await until(pilot, lambda: len(factory.engines) == 2)
        assert factory.engines[-1].profile.name == "spark-qwen38"


async def test_settings_docs_show_their_brackets(tmp_path):
    """A field's doc is text: "[model]" and "velo-chat[remote]" are shown, not read as styles,
    also in the docs that end in the markup of their reload note."""
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        docs = [str(s.render()) for s in app.screen.query(".form-doc")]
        kind = next(d for d in docs if d.startswith('"local": llama.cpp in this process'))
        assert "([model] and [context] apply)" in kind and "'velo-chat[remote]'" in kind
        assert kind.endswith("(needs a model reload)")


async def test_sampling_edit_applies_without_reload(tmp_path):
    app, factory = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: chat(app).model_ready)
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#f-sampling--temperature").value = "0.7"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.profile.sampling.temperature == 0.7
        assert len(factory.engines) == 1 and not isinstance(app.screen, ConfirmDialog)


async def test_bad_value_is_refused_as_typed(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        screen = app.screen
        box = screen.query_one("#f-sampling--top_p")
        box.value = "7"
        await pilot.pause()
        error = str(screen.query_one("#f-sampling--top_p-error").render())
        assert "sampling.top_p" in error and "between 0.0 and 1.0" in error
        assert box.has_class("-invalid")
        box.value = "abc"
        await pilot.pause()
        assert "must be a number" in str(screen.query_one("#f-sampling--top_p-error").render())
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.profile.sampling.top_p == 1.0  # nothing saved
        box.value = "0.9"
        await pilot.pause()
        assert str(screen.query_one("#f-sampling--top_p-error").render()) == ""


async def test_keymap_rebinds_and_palette_lists_actions(tmp_path):
    from velo_chat.app.settings import AppSettings

    app, _ = fake_app(tmp_path)
    app.settings = AppSettings(keymap={"session.new": "f9"})
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello")
        assert chat(app).session is not None
        await pilot.press("f9")
        await pilot.pause()
        assert chat(app).session is None
        titles = {c.title for c in app.get_system_commands(chat(app))}
        for expected in (
            "New session",
            "Rename session",
            "Delete session",
            "Fork session",
            "Export session (Markdown)",
            "Copy the message",
            "Stop the reply",
            "Help: every key",
            "Settings: profiles",
        ):
            assert expected in titles


async def test_regenerate_answers_the_last_question_again_in_a_fork(tmp_path):
    app, factory = fake_app(tmp_path, FakeScript(reply="First answer."))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "one")
        await send(pilot, "two")
        session = app.store.list_sessions()[0]
        before = app.store.messages(session.id)
        chat(app).query_one(Composer).focus()
        await pilot.press("ctrl+r")
        await until(pilot, lambda: not chat(app).busy and not chat(app).workers)
        assert app.store.messages(session.id) == before  # the session keeps its answer
        fork = chat(app).session
        assert fork.id != session.id and fork.parent_session_id == session.id
        after = app.store.messages(fork.id)
        assert [m.content for m in after[:3]] == [m.content for m in before[:3]]
        assert len(after) == 4 and after[-1].content == "First answer."
        sent = factory.engines[0].turns[-1]
        assert [m.content for m in sent][-3:] == ["one", "First answer.", "two"]
        views = chat(app).query_one(Transcript).views()
        assert [v.role for v in views] == ["user", "assistant", "user", "assistant"]


async def test_saved_settings_take_effect_without_a_restart(tmp_path):
    """Display, reasoning display and checkpoint settings apply when saved: the live panel
    hides, reasoning boxes hide, and the running engine gets the new checkpoint settings (no
    reload, no restart)."""
    script = FakeScript(reply="Answer.", reasoning="Let me think.", thinking=None)
    app, factory = fake_app(tmp_path, script)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hi")
        screen = chat(app)
        reply = screen.query_one(Transcript).views()[-1]
        assert screen.query_one("#panel").display and reply.query_one(".thinking").display
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#f-display--show_live_panel").value = False
        app.screen.query_one("#f-reasoning--show_thinking").value = False
        app.screen.query_one("#f-checkpoints--ram_budget_mib").value = "123"
        await pilot.pause()
        await pilot.press("ctrl+s")
        engine = factory.engines[0]
        await until(pilot, lambda: engine.applied)
        assert not isinstance(app.screen, ConfirmDialog) and len(factory.engines) == 1
        assert engine.applied[-1].checkpoints.ram_budget_mib == 123
        assert not screen.query_one("#panel").display
        assert not reply.query_one(".thinking").display
