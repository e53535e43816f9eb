"""The PLE table's page-cache residency in the live panel: read from the model's own headers
and mincore, shown under the memory, with the command that warms the table when a file copy
has evicted it. The TUI part runs on the fake engine pointed at the real tiny qwen4exp GGUF."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from velo_chat.app.ple_watch import PleWatch
from velo_chat.app.widgets.telemetry.panel import LivePanel
from velo_chat.engine.events import ModelLoaded, PleInfo
from velo_chat.engine.fit import residency

from tests.support.tui_helpers import fake_app
from tests.test_tui_flows import SIZE, ready, until

pytestmark = pytest.mark.usefixtures("bare_home")


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_the_watch_finds_the_table_and_says_none_without_one(
    qwen_path: Path, smollm2_path: Path, tmp_path: Path
):
    assert PleWatch(smollm2_path).fraction() is None  # no PLE table
    assert PleWatch(tmp_path / "missing.gguf").fraction() is None
    _evict(qwen_path)
    evicted = PleWatch(qwen_path).fraction()  # reading the headers reads ahead a little, not as far
    assert evicted is not None and evicted < 0.5
    residency.warm(qwen_path)
    assert PleWatch(qwen_path).fraction() == 1.0


def _memory_line(screen) -> str:
    return screen.query_one(LivePanel)._lines["#panel-memory"]


async def test_the_panel_shows_the_residency_and_warns_when_it_dropped(tmp_path, qwen_path: Path):
    app, _factory = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        assert "PLE" not in _memory_line(screen)  # the fake model has no table
        _evict(qwen_path)
        screen.model.info = dataclasses.replace(screen.model.info, path=str(qwen_path))
        screen.model.ple.watch(screen.model.info)
        await until(pilot, lambda: "PLE cache" in _memory_line(screen))
        assert "PLE cache 0%" in _memory_line(screen) and "velo-chat doctor --warm-ple" in _memory_line(
            screen
        )
        residency.warm(qwen_path)
        screen.query_one(LivePanel).ple_residency(PleWatch(qwen_path).fraction())
        await pilot.pause()
        assert _memory_line(screen).endswith("\nPLE cache 100%")


def with_ple(info: ModelLoaded, gather: str, *, splits: int, table: bool = True) -> ModelLoaded:
    """The fake model's `ModelLoaded` with a PLE path and the decode graph's splits."""
    assert info.local is not None
    local = dataclasses.replace(info.local, graph_splits=splits)
    return dataclasses.replace(info, local=local, ple=PleInfo(gather, "", table))


async def test_the_panel_says_the_ple_path_and_the_decode_graphs_splits(tmp_path):
    """A qwen4exp model's block in the panel names where its PLE rows are gathered and how many
    graph splits a decode step has; a model without a PLE table shows neither."""
    from textual.widgets import Static

    app, _factory = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot)
        panel = screen.query_one(LivePanel)

        def model_block() -> str:
            return str(panel.query_one("#panel-model", Static).content)

        assert "PLE" not in model_block()  # the fake model has no PLE table
        info = screen.model.info
        panel.model_ready(with_ple(info, "gpu", splits=1), "m")
        await pilot.pause()
        assert model_block().endswith("\nPLE gpu · 1 split")
        panel.model_ready(with_ple(info, "stock", splits=2), "m")
        await pilot.pause()
        assert model_block().endswith("\nPLE stock · 2 splits")
        panel.model_ready(with_ple(info, "stock", splits=1, table=False), "m")
        await pilot.pause()
        assert "PLE" not in model_block()
