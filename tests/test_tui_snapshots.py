"""Snapshot tests of the main screens and states (pytest-textual-snapshot), on the fake engine
with fixed clocks, fixed memory, no cursor blink and a fixed terminal size.

Update after an intended visual change: `pytest tests/test_tui_snapshots.py --snapshot-update`,
then `python -m tests.support.readme_image` (the README's screenshot is one of these snapshots).
"""

from __future__ import annotations


import pytest

from velo_chat.app.dialogs.message import MessageDialog
from velo_chat.app.widgets.composer.composer import Composer
from velo_chat.engine.llama.gguf_file import GGUFError
from velo_chat.engine.prompt.thinking import ThinkingSupport

from tests.support import readme_image
from devkit.fake_engine import FakeScript
from tests.support.tui_helpers import chat, fake_app, wait_for

pytestmark = pytest.mark.usefixtures("bare_home")
SIZE = (100, 30)
CODE_REPLY = (
    "Use a list comprehension:\n\n```python\nsquares = [n * n for n in range(10)]\n"
    "print(squares)\n```\n\nIt builds the list in one pass."
)


def sender(text: str, *, until_idle: bool = True):
    async def run(pilot) -> None:
        screen = chat(pilot.app)
        await wait_for(lambda: screen.model_ready)
        screen.query_one(Composer).load_text(text)
        await pilot.press("enter")
        if until_idle:
            await wait_for(lambda: not screen.busy)
        await pilot.pause(0.2)

    return run


def test_empty_state(snap_compare, tmp_path):
    app, _ = fake_app(tmp_path)

    async def ready(pilot):
        await wait_for(lambda: chat(pilot.app).model_ready)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=ready)


def test_session_with_code_answer(snap_compare, tmp_path):
    app, _ = fake_app(tmp_path, FakeScript(reply=CODE_REPLY))
    assert snap_compare(app, terminal_size=SIZE, run_before=sender("squares of 0..9 in python"))


def test_thinking_reply(snap_compare, tmp_path):
    """A thinking model's reply: its reasoning collapsed above the answer, the panel's thinking
    and answer tokens and time to the first answer, and the thinking state on the preview line."""
    script = FakeScript(
        reasoning="The user asks for squares. A comprehension is shortest.",
        reply=CODE_REPLY,
        thinking=ThinkingSupport(switch="enable_thinking", default_on=True),
    )
    app, _ = fake_app(tmp_path, script)
    assert snap_compare(app, terminal_size=SIZE, run_before=sender("squares of 0..9 in python"))


def test_streaming_with_live_panel(snap_compare, tmp_path):
    script = FakeScript(reply=CODE_REPLY * 3, pause_after=60, dt=0.004)
    app, _ = fake_app(tmp_path, script)

    async def run(pilot):
        await sender("stream please", until_idle=False)(pilot)
        screen = chat(pilot.app)
        await wait_for(lambda: screen.turn_view.reply is not None and len(screen.turn_view.reply.text) >= 120)
        await pilot.pause(0.3)

    try:
        assert snap_compare(app, terminal_size=SIZE, run_before=run)
    finally:
        script.gate.set()


CALC = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
SUBTRACT_REPLY = (
    "Add it beside `add`:\n\n```python\ndef sub(a, b):\n    return a - b\n```\n\n"
    "and a test for each function in `test_calc.py`."
)


def coding_session(tmp_path, monkeypatch) -> tuple:
    """A coding session mid-reply: a question with a file attached (folded above it), the reply
    streaming, and a message queued behind it with the next file attached to it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calc.py").write_text(CALC)
    (tmp_path / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )
    script = FakeScript(reply=SUBTRACT_REPLY, pause_after=24)
    app, _ = fake_app(tmp_path, script)

    async def run(pilot):
        screen = chat(pilot.app)
        await wait_for(lambda: screen.model_ready)
        composer = screen.query_one(Composer)
        for text in ("/read calc.py", "Add a subtract function", "/read test_calc.py", "Now write its test"):
            composer.load_text(text)
            await pilot.press("enter")
            await pilot.pause()
            if text.startswith("Add"):
                await wait_for(
                    lambda: screen.turn_view.reply is not None and len(screen.turn_view.reply.text) >= 48
                )
        await wait_for(lambda: len(screen.queue) == 1)
        await pilot.pause(0.3)

    return app, script, run


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
def test_coding_session(snap_compare, tmp_path, monkeypatch, size):
    app, script, run = coding_session(tmp_path, monkeypatch)
    try:
        assert snap_compare(app, terminal_size=size, run_before=run)
    finally:
        script.gate.set()


def test_prefill_progress(snap_compare, tmp_path):
    script = FakeScript(pause_in_prefill=True)
    app, _ = fake_app(tmp_path, script)

    async def run(pilot):
        await sender("a long document " * 40, until_idle=False)(pilot)
        await wait_for(lambda: chat(pilot.app).query_one("#panel-prefill").display)
        await pilot.pause(0.2)

    try:
        assert snap_compare(app, terminal_size=SIZE, run_before=run)
    finally:
        script.gate.set()


def test_settings_screen(snap_compare, tmp_path):
    app, _ = fake_app(tmp_path)

    async def run(pilot):
        await wait_for(lambda: chat(pilot.app).model_ready)
        await pilot.press("f2")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=SIZE, run_before=run)


def test_error_dialog(snap_compare, tmp_path):
    script = FakeScript(
        load_error=GGUFError("/models/broken.gguf: not a GGUF file (bad magic b'PK\\x03\\x04')")
    )
    app, _ = fake_app(tmp_path, script)

    async def run(pilot):
        await wait_for(lambda: isinstance(pilot.app.screen, MessageDialog))
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run)


def test_readme_image_is_the_snapshot():
    """The README's screenshot (`docs/images/tui.svg`) is `test_session_with_code_answer`'s
    snapshot, which that test keeps equal to what the TUI draws: a stale copy fails here."""
    assert readme_image.IMAGE.read_bytes() == readme_image.SNAPSHOT.read_bytes(), (
        "docs/images/tui.svg differs from the snapshot it is taken from: "
        "run `.venv/bin/python -m tests.support.readme_image`"
    )
