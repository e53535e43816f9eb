"""The line under the composer follows the turn: prefill progress while the prompt is read,
then "replying" once tokens stream (not the last prefill figures, "prefilling N/N · ETA 0.0 s",
left standing for the whole reply)."""

from __future__ import annotations

from textual.widgets import Static

from devkit.fake_engine import FakeScript
from tests.support.tui_helpers import fake_app
from tests.test_tui_flows import SIZE, ready, until
from velo_chat.app.widgets.composer.composer import Composer


def _line(screen) -> str:
    return str(screen.query_one("#preview-line", Static).render())


async def test_the_line_says_replying_once_tokens_stream(tmp_path):
    script = FakeScript(reply="one two three four five six", pause_after=3)
    app, _ = fake_app(tmp_path, script)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        screen.query_one(Composer).load_text("count")
        await pilot.press("enter")  # the script holds the reply after 3 tokens
        await until(pilot, lambda: screen.turn_view.reply is not None and screen.turn_view.reply.text)
        await pilot.pause()
        assert _line(screen).startswith("replying"), _line(screen)
        assert "prefilling" not in _line(screen)
        script.gate.set()
        await until(pilot, lambda: not screen.busy)
        assert not _line(screen).startswith("replying")  # the next turn's preview again
