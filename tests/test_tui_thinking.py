"""Pilot tests of thinking in the TUI, on the fake engine (layout and flow only): the reasoning
streams into its collapsed block apart from the answer, the live panel counts thinking and
answer tokens apart, and the thinking key flips thinking for the turns that follow."""

from __future__ import annotations

import dataclasses

import pytest
from textual.widgets import Collapsible, Static

from velo_chat.app.widgets.transcript.transcript import Transcript
from velo_chat.engine.config.profiles import build_profile
from velo_chat.engine.prompt.thinking import ThinkingSupport

from devkit.fake_engine import FakeScript
from tests.support.tui_helpers import fake_app
from tests.test_tui_flows import SIZE, chat, send, until

pytestmark = pytest.mark.usefixtures("bare_home")
QWEN3 = ThinkingSupport(switch="enable_thinking", default_on=True)


def thinking_app(tmp_path, thinking: ThinkingSupport | None = QWEN3, **profile):
    script = FakeScript(
        reasoning="First, the light scatters.", reply="Rayleigh scattering.", thinking=thinking
    )
    return fake_app(tmp_path, script, profile=build_profile("default", profile))


def line(app, selector: str) -> str:
    return str(chat(app).query_one(selector, Static).render())


async def test_reasoning_streams_apart_and_is_stored_apart(tmp_path):
    app, _ = thinking_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "why is the sky blue?")
        reply = chat(app).query_one(Transcript).last_reply()
        assert (reply.text, reply.reasoning) == ("Rayleigh scattering.", "First, the light scatters.")
        box = reply.query_one(".thinking", Collapsible)
        assert box.display and box.collapsed  # shown, collapsed
        stored = app.store.messages(chat(app).session.id)[-1]
        assert (stored.content, stored.reasoning) == (reply.text, reply.reasoning)
        # the panel: 9 reasoning pieces and 7 answer pieces of 3 characters, 10 ms apart
        assert line(app, "#panel-thinking") == "thinking 9 · answer 7 tok"
        assert "first answer 0.14 s" in line(app, "#panel-ttft")
        # reopened from the store, the reasoning is still in its own block
        await chat(app).query_one(Transcript).show_messages(app.store.messages(chat(app).session.id))
        await pilot.pause()
        again = chat(app).query_one(Transcript).last_reply()
        assert again.reasoning == reply.reasoning and again.query_one(".thinking").display


async def test_the_thinking_key_flips_thinking_for_the_next_turns(tmp_path):
    app, factory = thinking_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "one")
        screen = chat(app)
        assert factory.engines[0].reasoning[-1].enabled == "auto"
        await until(pilot, lambda: line(app, "#preview-line").startswith("thinking on"))
        await pilot.press("ctrl+g")
        await until(pilot, lambda: line(app, "#preview-line").startswith("thinking off"))
        await send(pilot, "two")
        assert factory.engines[0].reasoning[-1].enabled == "off"
        assert screen.query_one(Transcript).last_reply().reasoning == ""
        assert not screen.query_one("#panel-thinking").display  # no reasoning this time
        assert app.profile.reasoning.enabled == "auto"  # the profile is not changed
        await pilot.press("ctrl+g")
        await send(pilot, "three")
        assert factory.engines[0].reasoning[-1].enabled == "on"
        # a profile saved with another `reasoning.enabled` since the key was pressed wins
        app.adopt_profile(
            dataclasses.replace(
                app.profile, reasoning=dataclasses.replace(app.profile.reasoning, enabled="off")
            )
        )
        await send(pilot, "four")
        assert factory.engines[0].reasoning[-1].enabled == "off"


async def test_a_template_without_a_switch_says_so(tmp_path):
    app, factory = thinking_app(tmp_path, thinking=ThinkingSupport())
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "one")
        said = []
        chat(app).notify = lambda message, **kw: said.append(message)
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert said == ["This model's chat template has no thinking switch."]
        assert not line(app, "#preview-line").startswith("thinking")
        await send(pilot, "two")
        assert factory.engines[0].reasoning[-1].enabled == "auto"
