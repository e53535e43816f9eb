"""Unit tests of the TUI's pure parts: the decode meter, code-block parsing, the
keymap catalogue (every binding documented and in the palette), reload decisions, settings, the
stream pacer and the full-collection hold."""

from __future__ import annotations

import dataclasses
import gc

import pytest

from velo_chat.app import keymap
from velo_chat.app.app import reload_needed
from velo_chat.app.gc_hold import HELD_THRESHOLD, FullCollectionHold
from velo_chat.app.screens.help import help_text
from velo_chat.app.settings import load_app_settings
from velo_chat.app.stream_pacer import StreamPacer
from velo_chat.app.widgets.telemetry.meter import DecodeMeter
from velo_chat.app.widgets.transcript.text import code_blocks
from velo_chat.engine.config.profiles import build_profile


def test_meter_samples_windows_of_token_time():
    m = DecodeMeter(interval=0.25)
    for n in range(1, 101):  # 100 tokens at 100 tok/s
        m.update(n, 0.0, (n - 1) * 0.01)
    assert len(m.samples) == 3 and all(abs(s - 100) < 1e-6 for s in m.samples)
    assert abs(m.average - 100) < 1e-6 and m.peak == m.current == m.samples[-1]
    m.reset()
    assert m.average == 0 and m.samples == []


def test_code_blocks():
    text = "a\n\n```py\nx = 1\n```\n\n    indented\n\n```\ny\n```\n"
    assert code_blocks(text) == ["x = 1\n", "indented\n", "y\n"]


def test_every_action_has_an_id_and_is_in_help():
    ids = [a.id for a in keymap.ACTIONS]
    assert len(ids) == len(set(ids))
    text = help_text({"session.new": "ctrl+k"})
    for a in keymap.ACTIONS:
        assert a.id in text
    assert "ctrl+k" in text


def test_reload_needed():
    base = build_profile("p", {})
    hot = dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, temperature=1.0))
    assert reload_needed(base, hot) is None
    ctx = dataclasses.replace(base, context=dataclasses.replace(base.context, n_ctx=4096))
    assert reload_needed(base, ctx) == "context"
    model = dataclasses.replace(base, model=dataclasses.replace(base.model, path="/x.gguf"))
    assert reload_needed(base, model) == "model"


def test_keymap_setting(tmp_path):
    path = tmp_path / "settings.toml"
    path.write_text(
        'active_profile = "default"\n[keymap]\n"session.new" = "ctrl+k"\nbogus = "x"\n', encoding="utf-8"
    )
    s = load_app_settings(path)
    assert s.keymap == {"session.new": "ctrl+k"} and "bogus" in s.problems[0]


def test_pacer_keeps_the_ui_within_its_share_of_a_core():
    cpu = [0.0]
    pacer = StreamPacer(None, ui_has_own_core=False, cpu_clock=lambda: cpu[0])
    assert pacer.due(0.0)
    pacer.posted(0.0)  # the first token: nothing measured an update yet, the ceiling
    assert pacer.interval == StreamPacer.MAX_INTERVAL and not pacer.due(0.05)
    cpu[0] += 0.004  # one cheap update: 4 ms of UI time
    pacer.posted(0.1)
    assert pacer.interval == 0.004 / StreamPacer.SHARED_CORES_SHARE
    assert not pacer.due(0.1 + pacer.interval / 2) and pacer.due(0.1 + pacer.interval)
    cpu[0] += 0.015  # an update of a long session on a 2-core machine: 15 ms, 1.5 s apart
    pacer.posted(0.5)
    assert pacer.interval == pytest.approx(1.5) and not pacer.due(1.9) and pacer.due(2.0)
    cpu[0] += 1.0  # an update that costs a second: the pace stops at the ceiling
    pacer.posted(4.0)
    assert pacer.interval == StreamPacer.MAX_INTERVAL
    own = StreamPacer(None, ui_has_own_core=True, cpu_clock=lambda: cpu[0])
    cpu[0] += 0.001
    own.posted(0.0)
    assert own.interval == StreamPacer.MIN_INTERVAL  # a core of its own: 30 updates a second


def test_full_collection_hold_defers_only_the_oldest_generation_and_restores_it():
    before = gc.get_threshold()
    hold = FullCollectionHold()
    try:
        hold.hold()
        hold.hold()  # idempotent: the saved threshold stays the original one
        assert hold.held and gc.get_threshold() == (*before[:2], HELD_THRESHOLD)
    finally:
        hold.release()
    hold.release()
    assert not hold.held and gc.get_threshold() == before


def test_pacer_without_a_cpu_clock_streams_at_the_fastest_pace():
    pacer = StreamPacer(None, ui_has_own_core=False)
    pacer.posted(0.0)
    assert pacer.interval == StreamPacer.MIN_INTERVAL and pacer.due(StreamPacer.MIN_INTERVAL)


async def test_panel_lines_follow_every_update_with_or_without_a_layout():
    from textual.app import App
    from textual.widgets import Static

    from velo_chat.app.widgets.telemetry.panel import LivePanel

    class PanelApp(App):
        def compose(self):
            yield LivePanel(clock=lambda: 0.0, memory_probe=lambda: (2**20, None), memory_interval=None)

    app = PanelApp()
    async with app.run_test(size=(40, 30)) as pilot:
        panel = app.query_one(LivePanel)
        decode = app.query_one("#panel-decode", Static)
        panel.turn_sent()
        for n in range(1, 101):  # 100 tok/s: the same two lines, other numbers
            panel.tokens(n, 0.0, (n - 1) * 0.01)
        await pilot.pause()
        assert "avg 100.0" in str(decode.render()) and "100 tok" in str(decode.render())
        height = app.query_one("#panel-ttft", Static).size.height
        panel.tokens(101, 0.0, 1.0, n_reasoning=40)  # the TTFT line gains a second line
        await pilot.pause()
        assert app.query_one("#panel-ttft", Static).size.height == height + 1
        assert "thinking 40" in str(app.query_one("#panel-thinking", Static).render())


async def test_panel_speculation_line_shows_the_last_turns_drafts():
    from textual.app import App
    from textual.widgets import Static

    from velo_chat.app.widgets.telemetry.panel import LivePanel
    from velo_chat.engine.events import SpeculationStats, TurnStats

    class PanelApp(App):
        def compose(self):
            yield LivePanel(clock=lambda: 0.0, memory_probe=lambda: (2**20, None), memory_interval=None)

    def stats(drafted: int, accepted: int, calls: int) -> TurnStats:
        return TurnStats(
            0.1, 10, 0, 10, 0.1, 100.0, 41, 1.0, 40.0, 1.0, "stop",
            speculation=SpeculationStats(drafted=drafted, accepted=accepted, decode_calls=calls),
        )  # fmt: skip

    app = PanelApp()
    async with app.run_test(size=(40, 40)) as pilot:
        panel = app.query_one(LivePanel)
        panel.turn_ended(stats(30, 24, 16))
        assert panel.speculation == "off"  # off: nothing to show
        panel.set_speculation(True)
        panel.turn_sent()
        panel.turn_ended(stats(30, 24, 16))
        await pilot.pause()
        assert panel.speculation == "on · 24/30 accepted (80%) · 2.50 tok/call"
        assert "24/30 accepted" in " ".join(str(w.render()) for w in app.query(Static))
        panel.turn_ended(stats(0, 0, 40))
        assert panel.speculation == "on · nothing drafted"


async def test_panel_memory_line_waits_for_the_next_streamed_update_while_tokens_stream():
    """While tokens stream, the memory timer draws no frame of its own (each frame is taken from
    the decode on a small machine): the next streamed update shows the new figure; between
    replies the timer draws it again."""
    from textual.app import App
    from textual.widgets import Static

    from velo_chat.app.widgets.telemetry.panel import LivePanel

    rss = [100 << 20]

    class PanelApp(App):
        def compose(self):
            yield LivePanel(clock=lambda: 0.0, memory_probe=lambda: (rss[0], None), memory_interval=0.05)

    def memory(app) -> str:
        return str(app.query_one("#panel-memory", Static).render())

    app = PanelApp()
    async with app.run_test(size=(40, 30)) as pilot:
        panel = app.query_one(LivePanel)
        assert "100 MiB" in memory(app)
        panel.turn_sent()
        panel.tokens(1, 0.0, 0.0)
        rss[0] = 200 << 20
        await pilot.pause(0.2)  # several ticks of the timer
        assert "100 MiB" in memory(app)
        panel.tokens(2, 0.0, 0.01)
        await pilot.pause()
        assert "200 MiB" in memory(app)
        panel.turn_ended(None)
        rss[0] = 300 << 20
        await pilot.pause(0.2)
        assert "300 MiB" in memory(app)
