"""The TUI's side of the fit check: a profile that does not fit is refused with its table in a
dialog that offers "Load anyway". The running model is closed first to make room, and Cancel
loads it again. Pilot tests on the fake engine; the check itself runs on real models in
test_fit.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from velo_chat.app.dialogs.confirm import ConfirmDialog
from velo_chat.engine import DoesNotFit
from velo_chat.engine.config.profiles import active_profile_name, load_profile
from velo_chat.engine.fit import machine, report

from tests.support.engine_helpers import test_profile
from devkit.fake_engine import FakeScript
from tests.support.tui_helpers import fake_app
from tests.test_tui_flows import SIZE, ready, until

pytestmark = pytest.mark.usefixtures("bare_home")


def _refusal(model: Path) -> DoesNotFit:
    """A real fit report for SmolLM2 on a machine with 1 GiB available: it does not fit."""
    mem = machine.MemInfo(total=2 << 30, available=1 << 30, swap_total=0, swap_free=0, cached=0)
    found = report.check(test_profile(model), model, machine.Machine(mem, gpu_offload=False, gpu=None))
    assert not found.fits
    return DoesNotFit(found)


def _app(tmp_path: Path, model: Path):
    return fake_app(tmp_path, FakeScript(check_errors={"spark-qwen38": _refusal(model)}))


async def _switch_refused(pilot):
    """Switch from the running default profile to spark-qwen38, which the fit check refuses."""
    screen = await ready(pilot)
    pilot.app.use_profile(load_profile("spark-qwen38"), ask=False, activate=True)
    await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmDialog))
    return screen


async def test_a_refused_profile_loads_anyway_when_the_user_says_so(tmp_path, smollm2_path):
    app, factory = _app(tmp_path, smollm2_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _switch_refused(pilot)
        body = app.screen.body
        assert "verdict: does not fit" in body and "checkpoints in RAM" in body
        assert "Profile 'default' was closed to make room" in body
        assert factory.engines[0].closed  # closed, and the check made again without it
        await pilot.press("y")
        await until(pilot, lambda: screen.model_ready and app.profile.name == "spark-qwen38")
        assert app.host.loaded_profile.name == "spark-qwen38"
        assert active_profile_name() == "spark-qwen38"


async def test_cancel_loads_the_closed_profile_again(tmp_path, smollm2_path):
    app, factory = _app(tmp_path, smollm2_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _switch_refused(pilot)
        await pilot.press("n")
        await until(pilot, lambda: screen.model_ready)
        assert app.host.loaded_profile.name == "default" and app.profile.name == "default"
        assert [e.profile.name for e in factory.engines] == ["default", "spark-qwen38", "default"]
        assert active_profile_name() == "default"
