"""End to end on the real SmolLM2 engine: send, watch the reply stream into the transcript and
the live panel show a non-zero decode rate, follow up with the live context reused, then reopen
the app on the same store and continue the session."""

from __future__ import annotations

import asyncio

from velo_chat.app.app import make_app
from velo_chat.app.screens.chat import ChatScreen
from velo_chat.app.settings import AppSettings
from velo_chat.app.widgets.composer.composer import Composer
from velo_chat.app.widgets.telemetry.panel import LivePanel
from velo_chat.app.widgets.transcript.transcript import Transcript
from velo_chat.store import SessionStore

from tests.support.engine_helpers import test_profile


async def wait_for(cond, timeout: float = 120.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def build(profile, db):
    return make_app(
        profile, store=SessionStore(db), settings=AppSettings(), memory_interval=None, cursor_blink=False
    )


async def turn(pilot, screen: ChatScreen, text: str) -> None:
    await wait_for(lambda: screen.model_ready)
    screen.query_one(Composer).load_text(text)
    await pilot.press("enter")
    await wait_for(lambda: not screen.busy)
    await pilot.pause()


async def test_real_engine_stream_resume_and_reopen(velo_home, smollm2_path, tmp_path):
    profile = test_profile(smollm2_path, sampling={"max_tokens": 24})
    db = tmp_path / "sessions.db"
    app = build(profile, db)
    streamed: list[int] = []
    async with app.run_test(size=(100, 30)) as pilot:
        screen = next(s for s in app.screen_stack if isinstance(s, ChatScreen))
        panel = screen.query_one(LivePanel)
        original = panel.tokens

        def spy(n_tokens: int, t_first: float, t_last: float, **kw) -> None:
            streamed.append(n_tokens)
            original(n_tokens, t_first, t_last, **kw)

        panel.tokens = spy  # the screen calls the panel once per streamed update
        await turn(pilot, screen, "Name three colours.")
        reply = screen.query_one(Transcript).last_reply()
        assert reply.status in ("complete", "interrupted") and reply.text.strip()
        assert len(streamed) >= 2 and streamed == sorted(streamed)  # arrived in pieces
        assert panel.meter.average > 0
        assert "avg 0.0" not in str(panel.query_one("#panel-decode").render())
        session_id = screen.session.id
        await turn(pilot, screen, "And three fruits?")
        follow_up = app.store.messages(session_id)[-1]
        assert follow_up.stats["cached_tokens"] > 0  # the live context was reused
        await pilot.press("ctrl+r")  # regenerate, in a fork: resumes from the state before the question
        await wait_for(lambda: not screen.busy and not screen.workers)
        assert app.store.messages(session_id)[-1] == follow_up  # the session keeps its answer
        fork_id = screen.session.id
        regen = app.store.messages(fork_id)
        assert fork_id != session_id and len(regen) == 4
        assert regen[-1].content == follow_up.content  # greedy: the same answer again
        assert regen[-1].stats["cached_tokens"] >= follow_up.stats["prompt_tokens"] - 16
        follow_up = regen[-1]
        session_id = fork_id
    app.store.close()

    app2 = build(profile, db)
    async with app2.run_test(size=(100, 30)) as pilot:
        screen = next(s for s in app2.screen_stack if isinstance(s, ChatScreen))
        await screen.open_session(session_id)
        assert len(screen.query_one(Transcript).views()) == 4
        await turn(pilot, screen, "Thanks!")
        messages = app2.store.messages(session_id)
        assert len(messages) == 6 and messages[-1].content.strip()
        # A reopened app has no live context: the turn resumes from the disk checkpoint.
        assert messages[-1].stats["prompt_tokens"] > follow_up.stats["prompt_tokens"]
        assert messages[-1].stats["cached_tokens"] > follow_up.stats["prompt_tokens"]
        assert messages[-1].stats["checkpoint"]["source"] == "disk"
    app2.store.close()
