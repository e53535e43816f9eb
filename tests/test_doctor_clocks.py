"""`velo-chat doctor` reads the GPU's clocks (a fake `nvidia-smi` on PATH plays the GPU): the SM
clock now, its maximum and a cap below it, with what a cap costs; no GPU, a line that says so."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from velo_chat.engine.config import locations
from velo_chat.engine.fit.gpu_clock import GpuClocks

from tests.support.engine_helpers import run_cli

GB10 = ("NVIDIA GB10, [N/A], [N/A], 580.95.05", "NVIDIA GB10, 2100, 3003, 2200")
H100 = ("NVIDIA H100 80GB HBM3, 81559, 81000, 580.159.04", "NVIDIA H100 80GB HBM3, 1980, 1980, 1980")


def _fake_smi(folder: Path, gpu: tuple[str, str]) -> dict[str, str]:
    """A PATH whose only `nvidia-smi` answers the memory query and the clocks query."""
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text(
        f'#!/bin/sh\ncase "$*" in\n  *clocks*) echo "{gpu[1]}" ;;\n  *) echo "{gpu[0]}" ;;\nesac\n'
    )
    smi.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture
def profile(smollm2_path: Path) -> str:
    folder = locations.user_profiles_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "small.toml").write_text(f'[model]\npath = "{smollm2_path}"\n', encoding="utf-8")
    return "small"


def test_a_capped_gpu_clock_is_reported_with_what_it_costs(profile: str, tmp_path: Path) -> None:
    env = _fake_smi(tmp_path / "bin", GB10)
    text = run_cli("doctor", "--profile", profile, env=env)
    assert text.returncode == 0, text.stdout + text.stderr
    line = next(x for x in text.stdout.splitlines() if x.startswith("GPU clock"))
    assert line.split(None, 2)[2] == (
        "SM 2100 MHz now, max 3003 MHz, capped at 2200 MHz: a cap costs up to about a third "
        "of decode speed on a GB10 — see docs/fit.md"
    )
    assert any(
        x.startswith("advice:  the GPU's clock is held below its maximum") for x in text.stdout.splitlines()
    )
    d = json.loads(run_cli("doctor", "--profile", profile, "--json", env=env).stdout)
    clocks = d["gpu"]["clocks"]
    assert (clocks["sm_mhz"], clocks["max_sm_mhz"], clocks["applications_mhz"], clocks["cap_mhz"]) == (
        2100,
        3003,
        2200,
        2200,
    )
    assert d["fit"]["margin"] >= 4 << 30  # a GB10: the fit keeps the margin free


def test_an_uncapped_gpu_says_so_and_gets_no_advice(profile: str, tmp_path: Path) -> None:
    result = run_cli("doctor", "--profile", profile, env=_fake_smi(tmp_path / "bin", H100))
    assert "GPU clock      SM 1980 MHz now, max 1980 MHz, not capped" in result.stdout.splitlines()
    assert "clock is held below" not in result.stdout


def test_without_a_gpu_the_clock_line_says_none_is_present(profile: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("doctor", "--profile", profile, env={"PATH": str(empty)})
    assert "GPU clock      none: no GPU is present" in result.stdout.splitlines(), result.stdout
    assert (
        json.loads(run_cli("doctor", "--profile", profile, "--json", env={"PATH": str(empty)}).stdout)["gpu"]
        is None
    )


def test_clocks_nvidia_smi_does_not_report_give_no_cap() -> None:
    unknown = GpuClocks("NVIDIA GB10", 2100, 3003, None)
    assert unknown.cap is None and "cap unknown" in unknown.describe()
    assert GpuClocks("X", None, None, 1500).describe().startswith("SM unknown now, max unknown, cap unknown")
    assert GpuClocks("X", 900, 1980, 1980).describe() == "SM 900 MHz now, max 1980 MHz, not capped"
