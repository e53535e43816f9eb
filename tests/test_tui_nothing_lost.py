"""Nothing the user typed is lost, whatever the timing: keys that arrive faster than the app
handles them, Enter before the model is ready, a failed profile switch, a store or settings error,
an engine that fails at the start or in the middle of a turn. Pilot tests on the fake engine:
these are the app's paths (the engine's own are tested on real models in test_turn_contract.py).
"""

from __future__ import annotations

import sqlite3
import threading

import pytest
from textual import events

from velo_chat.app.dialogs.message import MessageDialog
from velo_chat.app.generation import TurnRequest
from velo_chat.app.screens.settings import SettingsScreen
from velo_chat.app.widgets.composer.composer import Composer
from velo_chat.app.widgets.sessions.sidebar import SessionList
from velo_chat.app.widgets.transcript.transcript import Transcript
from velo_chat.engine.config import locations
from velo_chat.engine.llama.gguf_file import GGUFError
from velo_chat.engine.llama.model import ModelLoadError
from velo_chat.engine.config.profiles import active_profile_name, load_profile
from velo_chat.store import SessionStore

from devkit.fake_engine import FakeScript
from tests.support.tui_helpers import FIXED_NOW, fake_app
from tests.test_tui_flows import SIZE, chat, ready, until

pytestmark = pytest.mark.usefixtures("bare_home")

LONG = "Explain the difference between a list and a tuple in Python, with examples please."
_NAMES = {" ": "space", ",": "comma", ".": "full_stop", "?": "question_mark"}


def burst(app, text: str) -> None:
    """Queue every key of `text` on the app at once, as a terminal delivers a fast typist or
    `tmux send-keys` on a busy machine: the app reads them all before the input handles one."""
    for ch in text:
        if ch == "\n":
            app.post_message(events.Key("enter", "\r"))
        else:
            app.post_message(events.Key(_NAMES.get(ch, ch), ch))


def user_messages(app) -> list[str]:
    return [
        m.content for s in app.store.list_sessions() for m in app.store.messages(s.id) if m.role == "user"
    ]


async def test_keys_faster_than_the_app_handles_them_are_all_sent(tmp_path):
    app, factory = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        burst(app, LONG + "\n")
        await until(pilot, lambda: user_messages(app) and not screen.busy)
        assert user_messages(app) == [LONG]
        assert factory.engines[0].turns[0][-1].content == LONG
        assert screen.query_one(Composer).text == ""


async def test_typing_on_after_enter_keeps_the_next_draft(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        burst(app, "first question\nsecond draft, not sent yet")
        await until(pilot, lambda: user_messages(app) and not screen.busy)
        assert user_messages(app) == ["first question"]
        assert screen.query_one(Composer).text == "second draft, not sent yet"


async def test_enter_before_the_model_is_ready_keeps_the_text(tmp_path):
    gate = threading.Event()
    app, _ = fake_app(tmp_path, FakeScript(load_gates={"default": gate}))
    async with app.run_test(size=SIZE) as pilot:
        screen = chat(app)
        burst(app, LONG + "\n")
        await until(pilot, lambda: screen.query_one(Composer).text == LONG)
        await pilot.pause()
        assert user_messages(app) == [] and screen.query_one(Composer).text == LONG
        gate.set()
        await until(pilot, lambda: screen.model_ready)
        await pilot.press("enter")
        await until(pilot, lambda: user_messages(app) and not screen.busy)
        assert user_messages(app) == [LONG] and screen.query_one(Composer).text == ""


async def test_a_rejected_message_goes_back_in_front_of_the_new_draft(tmp_path):
    script = FakeScript(prompt_limit=10)
    app, _ = fake_app(tmp_path, script)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        burst(app, "x" * 200 + "\nnext")
        await until(pilot, lambda: isinstance(app.screen, MessageDialog))
        assert "context holds" in app.screen.body
        await pilot.press("escape")
        assert screen.query_one(Composer).text == "x" * 200 + "\n\nnext"
        assert app.store.list_sessions() == []


async def test_an_unexpected_error_at_the_start_of_a_turn_gives_the_text_back(tmp_path):
    app, _ = fake_app(tmp_path, FakeScript(turn_error=RuntimeError("boom in turn()")))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        burst(app, "keep me\n")
        await until(pilot, lambda: isinstance(app.screen, MessageDialog))
        assert "RuntimeError: boom in turn()" in app.screen.body
        await pilot.press("escape")
        assert screen.query_one(Composer).text == "keep me"
        assert screen.query_one(Transcript).views() == [] and app.store.list_sessions() == []
        assert not screen.busy and app.is_running


async def test_an_engine_crash_mid_reply_keeps_what_streamed(tmp_path):
    script = FakeScript(reply="one two three four five six", crash_after=3)
    app, _ = fake_app(tmp_path, script)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        burst(app, "count\n")
        await until(pilot, lambda: user_messages(app) and not screen.busy)
        view = screen.query_one(Transcript).views()[-1]
        assert view.text == "one two t" and view.status == "error"
        stored = app.store.messages(app.store.list_sessions()[0].id)
        assert [m.content for m in stored] == ["count", "one two t"]
        burst(app, "again\n")  # the app still works
        await until(pilot, lambda: len(user_messages(app)) == 2 and not screen.busy)


async def test_a_failed_activation_keeps_the_running_profile_and_saves_nothing(tmp_path):
    missing = GGUFError("model file not found: /models/Qwen3.8-Flash-Next-00001-of-00004.gguf")
    app, factory = fake_app(tmp_path, FakeScript(check_errors={"spark-qwen38": missing}))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#profile-list").highlighted = app.screen.names.index("spark-qwen38")
        await pilot.press("enter", "y")  # activate, then "Reload now?"
        await until(pilot, lambda: isinstance(app.screen, MessageDialog))
        assert "model file not found" in app.screen.body
        assert "Still running profile 'default'" in app.screen.body
        assert not factory.engines[0].closed  # the running model was never closed
        assert app.profile.name == "default" and active_profile_name() == "default"
        assert not (locations.config_dir() / "settings.toml").exists()
        await pilot.press("escape", "escape")
        assert screen.model_ready and screen.query_one(Composer).accepting
        assert "profile default" in str(screen.query_one("#session-header").render())
        burst(app, "still here?\n")
        await until(pilot, lambda: user_messages(app) and not screen.busy)
        assert factory.engines[0].turns  # the old engine answered


async def test_a_load_that_fails_after_closing_reloads_the_previous_profile(tmp_path):
    oom = ModelLoadError("llama.cpp could not load /m.gguf: failed to allocate buffer")
    app, factory = fake_app(tmp_path, FakeScript(load_errors={"spark-qwen38": oom}))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        app.use_profile(load_profile("spark-qwen38"), ask=False, activate=True)
        await until(pilot, lambda: isinstance(app.screen, MessageDialog))
        assert "failed to allocate" in app.screen.body and "Still running" in app.screen.body
        assert [e.profile.name for e in factory.engines] == ["default", "spark-qwen38", "default"]
        assert app.host.loaded_profile.name == "default" and app.host.loaded
        assert app.profile.name == "default" and active_profile_name() == "default"
        await pilot.press("escape")
        assert screen.model_ready


async def test_a_superseded_load_never_announces_itself(tmp_path):
    gate = threading.Event()  # spark-qwen38's load hangs until cancelled
    app, factory = fake_app(tmp_path, FakeScript(load_gates={"spark-qwen38": gate}))
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        screen.reload_model(load_profile("spark-qwen38"))
        await until(pilot, lambda: len(factory.engines) == 2)
        screen.reload_model(load_profile("default"))
        await until(pilot, lambda: screen.model_ready and len(factory.engines) == 3)
        await pilot.pause()
        assert not isinstance(app.screen, MessageDialog)  # the cancelled load said nothing
        assert app.host.loaded_profile.name == "default" and app.profile.name == "default"


async def test_settings_save_errors_are_dialogs(tmp_path):
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: chat(app).model_ready)
        profiles = locations.config_dir() / "profiles"
        profiles.parent.mkdir(parents=True, exist_ok=True)
        profiles.write_text("a file where the profiles folder should be")
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#f-sampling--temperature").value = "0.7"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, MessageDialog))
        assert app.screen.title_text == "Not saved"
        assert app.profile.sampling.temperature != 0.7 and app.is_running


async def test_a_locked_store_in_session_actions_is_a_dialog(tmp_path):
    store = SessionStore(tmp_path / "sessions.db", busy_timeout_s=0.05, clock=lambda: FIXED_NOW)
    app, _ = fake_app(tmp_path, store=store)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        burst(app, "hello\n")
        await until(pilot, lambda: user_messages(app) and not screen.busy)
        holder = sqlite3.connect(tmp_path / "sessions.db", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            screen.query_one(SessionList).focus()
            await pilot.press("f")  # fork: writes
            await until(pilot, lambda: isinstance(app.screen, MessageDialog))
            assert app.screen.title_text == "Fork failed" and "locked" in app.screen.body
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        await pilot.press("escape")
        assert app.is_running and len(app.store.list_sessions()) == 1
    store.close()


async def test_a_failing_store_in_the_session_filter_is_said_not_swallowed(tmp_path):
    store = SessionStore(tmp_path / "sessions.db", clock=lambda: FIXED_NOW)
    app, _ = fake_app(tmp_path, store=store)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        store.close()  # any store failure: reads now raise StoreError
        screen.query_one("#session-filter").value = "tuple"
        await until(pilot, lambda: isinstance(app.screen, MessageDialog))
        assert app.screen.title_text == "Cannot list the sessions"
        assert "closed" in app.screen.body and app.is_running


async def test_preview_failures_are_logged_once_per_kind(tmp_path, caplog):
    app, _ = fake_app(tmp_path, FakeScript(preview_error=ValueError("template broke")))
    with caplog.at_level("INFO", logger="velo_chat.app.generation"):
        async with app.run_test(size=SIZE) as pilot:
            screen = chat(app)
            await until(pilot, lambda: screen.model_ready)
            for draft in ("a", "ab", "abc"):
                screen._preview(TurnRequest(draft, None, app.profile))
                await until(pilot, lambda: not screen.workers)
    failures = [r for r in caplog.records if "resume preview failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].levelname == "WARNING"
    assert "template broke" in failures[0].getMessage()
