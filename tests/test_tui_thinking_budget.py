"""Pilot tests of the thinking budget in the TUI, on the fake engine (layout and flow only): the
settings screen edits `reasoning.budget_tokens` and `reasoning.budget_message` (generated from
the schema) without a reload, the live panel counts thinking against the budget, and says when
the budget cut the reasoning."""

from __future__ import annotations

import dataclasses

import pytest
from textual.widgets import Static

from velo_chat.app.screens.settings import SettingsScreen
from velo_chat.app.widgets.telemetry.panel import LivePanel
from velo_chat.engine import TurnStats
from velo_chat.engine.config.profiles import build_profile
from velo_chat.engine.prompt.thinking import ThinkingSupport

from devkit.fake_engine import FakeScript
from tests.support.tui_helpers import fake_app
from tests.test_tui_flows import SIZE, chat, send, until

pytestmark = pytest.mark.usefixtures("bare_home")
QWEN3 = ThinkingSupport(switch="enable_thinking", default_on=True, markers_found=True)


def thinking_app(tmp_path, **profile):
    script = FakeScript(reasoning="First, the light scatters.", reply="Rayleigh scattering.", thinking=QWEN3)
    return fake_app(tmp_path, script, profile=build_profile("default", profile))


def thinking_line(app) -> str:
    return str(chat(app).query_one("#panel-thinking", Static).render())


async def test_the_panel_counts_thinking_against_the_budget(tmp_path):
    app, _ = thinking_app(tmp_path, reasoning={"budget_tokens": 16})
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "why is the sky blue?")
        # the fake engine streams 9 reasoning pieces and 7 answer pieces
        assert thinking_line(app) == "thinking 9 / 16\nanswer 7 tok"
        panel = chat(app).query_one(LivePanel)
        stats = app.store.messages(chat(app).session.id)[-1].stats
        assert "reasoning_budget_hit" not in stats  # the fake turn was not cut
        # a turn the budget cut says so
        panel.turn_ended(dataclasses.replace(TurnStats.from_json(stats), reasoning_budget_hit=True))
        await pilot.pause()
        assert thinking_line(app) == "thinking 9 / 16 · cut\nanswer 7 tok"
        panel.turn_sent()  # the next turn starts uncut
        await pilot.pause()
        assert not panel.budget_hit


async def test_settings_edit_the_budget_without_a_reload(tmp_path):
    app, factory = thinking_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "one")
        assert thinking_line(app) == "thinking 9 · answer 7 tok"  # no budget: one line
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        screen = app.screen
        box = screen.query_one("#f-reasoning--budget_tokens")
        box.value = "many"
        await pilot.pause()
        assert "whole number" in str(screen.query_one("#f-reasoning--budget_tokens-error").render())
        box.value = "32"
        screen.query_one("#f-reasoning--budget_message").value = "Time is up."
        await pilot.pause()
        await pilot.press("ctrl+s")
        engine = factory.engines[0]
        await until(pilot, lambda: engine.applied)
        assert len(factory.engines) == 1  # applies to the next turn: no reload
        applied = engine.applied[-1].reasoning
        assert (applied.budget_tokens, applied.budget_message) == (32, "Time is up.")
        assert app.profile.reasoning.budget_tokens == 32
        await until(pilot, lambda: chat(app).query_one(LivePanel).thinking_budget == 32)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is chat(app))
        await send(pilot, "two")
        assert engine.reasoning[-1].budget_tokens == 32  # the turn ran with it
        assert thinking_line(app) == "thinking 9 / 32\nanswer 7 tok"
