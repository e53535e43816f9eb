"""The live panel's speculation line follows what the engine made of the setting on the loaded
model (`ModelLoaded.speculation.mode`, from `speculation_mode`), not only the profile's switch: a
setup where verify batches would round differently and the profile does not accept that shows
"off" with the reason, and the turn's drafts are not reported as if it drafted."""

from __future__ import annotations

import dataclasses

from velo_chat.app.widgets.telemetry.panel import LivePanel, speculation_line
from velo_chat.engine.config.profile_schema import SpeculationSettings
from velo_chat.engine.events import SpeculationInfo
from velo_chat.engine.speculation.stepper import mode_if_enabled, speculation_mode

from tests.support.tui_helpers import fake_app
from tests.test_tui_flows import SIZE, ready


def _mode(rounding: str, **settings: object) -> str:
    return speculation_mode(SpeculationSettings(**settings), rounding)[1]


def test_each_engine_mode_has_its_line() -> None:
    assert speculation_line(_mode("", enabled=True)) == (True, "on (exact)")
    assert speculation_line(_mode("layers on a GPU", enabled=True, allow_batch_rounding=True)) == (
        True,
        "on (batch rounding)",
    )
    assert speculation_line(_mode("layers on a GPU", enabled=True)) == (
        False,
        "off (needs allow_batch_rounding)",
    )
    assert speculation_line(_mode("", enabled=False)) == (False, "off")


async def test_the_panel_takes_the_engines_word_at_load(tmp_path) -> None:
    app, _factory = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        panel = screen.query_one(LivePanel)
        panel.set_speculation(True)  # the profile's switch
        refused = _mode("a hybrid model's recurrence takes its chunked path", enabled=True)
        panel.model_ready(dataclasses.replace(screen.model.info, speculation=SpeculationInfo(refused)), "m")
        await pilot.pause()
        assert not panel.speculation_enabled and panel.speculation == "off (needs allow_batch_rounding)"


async def test_the_engines_word_outlasts_the_profile_it_loaded(tmp_path) -> None:
    """When a load finishes, the screen adopts its profile (which tells every screen of the
    profile, speculation switch included) and hands the panel the engine's word: the engine's
    word is what stays. Seen in a real terminal: a profile with speculation on and decode on
    two threads showed "speculation on" while the engine had refused to draft."""
    from velo_chat.app.messages import ModelReady

    app, _factory = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        panel = screen.query_one(LivePanel)
        profile = app.profile
        on = dataclasses.replace(profile, speculation=dataclasses.replace(profile.speculation, enabled=True))
        refused = _mode("decode on 2 threads splits one token's attention otherwise", enabled=True)
        info = dataclasses.replace(screen.model.info, speculation=SpeculationInfo(refused))
        screen.on_model_ready(ModelReady(info=info, profile=on, load_id=screen.model.load_id))
        await pilot.pause()
        assert not panel.speculation_enabled and panel.speculation == "off (needs allow_batch_rounding)"
        panel.set_speculation(False)  # switched off in the settings: off at the next turn
        assert panel.speculation == "off"
        panel.set_speculation(True)  # on again, same model: still refused
        assert panel.speculation == "off (needs allow_batch_rounding)"


async def test_switched_on_after_load_the_panel_says_what_the_engine_would_do(tmp_path) -> None:
    """Loaded with speculation off, then switched on in the settings (no reload): the engine
    drafts only where the loaded context allows it (`Diagnostics.speculation_if_enabled`), and the
    panel says that, not "on". Seen in a real terminal: `default` (decode on 2 threads) loaded,
    `cpu-speculate` activated, the panel said "on · nothing drafted" while the engine refused."""
    app, _factory = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        panel = screen.query_one(LivePanel)
        rounding = "decode on 2 threads splits one token's attention otherwise"
        cases = (
            (_mode(rounding, enabled=True), False, "off (needs allow_batch_rounding)"),
            (
                mode_if_enabled(
                    SpeculationSettings(allow_batch_rounding=True), "recurrence", needs_reload=True
                ),
                False,
                "off (until a reload)",
            ),
            (_mode("", enabled=True), True, "on (exact)"),
        )
        for if_enabled, drafts, line in cases:
            info = dataclasses.replace(screen.model.info, speculation=SpeculationInfo("off", if_enabled))
            panel.model_ready(info, "m")
            assert panel.speculation == "off"
            panel.set_speculation(True)
            await pilot.pause()
            assert (panel.speculation_enabled, panel.speculation) == (drafts, line)
            panel.set_speculation(False)
            assert panel.speculation == "off"
