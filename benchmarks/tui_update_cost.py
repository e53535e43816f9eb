"""What one streamed update of a reply costs the UI thread, by kind of reply, in the real chat
screen (headless Textual at 120x40, the shipped stylesheet) fed by the scripted engine of the
tests: an update every 10 tokens, as the pacer gives on a fast machine, so the count of updates
is the same from run to run.

    .venv/bin/python benchmarks/tui_update_cost.py [--replies prose,code,list,table] [--size 120x40]

For each reply it prints the updates, the layouts of the screen and the compositor passes they
took (counts, the same from run to run within one: a timer's layout can fall either side of an
update), and the UI thread's CPU over the reply and per update (seconds, which vary: run it on a
quiet machine, and compare trees in the same run by putting one on PYTHONPATH). The layouts are
what `app/widgets/transcript/one_layout.py` halves; the list reply measures `lists.py`; tables
show what is left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from textual import _compositor, screen  # noqa: E402

from devkit import fake_engine  # noqa: E402
from devkit.fake_engine import FakeFactory, FakeScript  # noqa: E402
from velo_chat.app.app import make_app  # noqa: E402
from velo_chat.app.screens.chat import ChatScreen  # noqa: E402
from velo_chat.app.settings import AppSettings  # noqa: E402
from velo_chat.engine.config import build_profile  # noqa: E402
from velo_chat.store import SessionStore  # noqa: E402

CODE_BLOCK = '''class Account{i}:
    """A bank account number {i}, with a balance and an owner's name, kept in cents."""

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("the amount must be positive, and this line is long enough to wrap")
        self.balance += amount

'''
REPLIES = {
    "prose": " ".join(["The lighthouse keeper walked along the rocky coast every evening."] * 24),
    "code": "Here is the module:\n\n```python\n"
    + "".join(CODE_BLOCK.format(i=i) for i in range(6))
    + "```\n",
    "list": "Steps:\n\n"
    + "".join(f"- Step {i}: walk along the rocky coast while the storms gather.\n" for i in range(16)),
    "table": "| step | what |\n|---|---|\n"
    + "".join(f"| {i} | walk along the rocky coast |\n" for i in range(24)),
}
TOKEN_SECONDS = 0.01  # the scripted engine's pace, in real time: the UI keeps up with it


async def wait_until(done: Callable[[], bool], timeout: float = 120.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if done():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("the scripted reply did not end in time")


class Counts:
    """Layouts and compositor passes of the screen, counted by wrapping Textual's two methods."""

    def __init__(self) -> None:
        self.layouts = self.frames = 0
        real_layout, real_render = screen.Screen._refresh_layout, _compositor.Compositor.render_update

        def layout(this, *args, **kwargs):
            self.layouts += 1
            return real_layout(this, *args, **kwargs)

        def render(this, *args, **kwargs):
            self.frames += 1
            return real_render(this, *args, **kwargs)

        screen.Screen._refresh_layout = layout  # type: ignore[method-assign,assignment]
        _compositor.Compositor.render_update = render  # type: ignore[method-assign,assignment]


async def one_reply(kind: str, size: tuple[int, int], counts: Counts) -> dict[str, float | int | str]:
    real_delta = fake_engine.TokenDelta

    def paced_delta(*args, **kwargs):
        time.sleep(TOKEN_SECONDS)
        return real_delta(*args, **kwargs)

    fake_engine.TokenDelta = paced_delta  # type: ignore[misc,assignment]
    # Three characters a token, an update every 10 tokens of the scripted clock.
    script = FakeScript(reply=REPLIES[kind], dt=1 / 300)
    app = make_app(
        build_profile("default", {}),
        engine_factory=FakeFactory(script),
        store=SessionStore(Path(tempfile.mkdtemp(prefix="tui-update-cost-")) / "sessions.db"),
        settings=AppSettings(),
        memory_interval=None,
        cursor_blink=False,
        pace_stream=False,  # the scripted clock's pace instead: an update every 10 tokens
    )
    streamed = [0]
    async with app.run_test(size=size) as pilot:
        screen_ = next(s for s in app.screen_stack if isinstance(s, ChatScreen))
        await wait_until(lambda: screen_.model_ready)
        await pilot.pause(0.3)
        turn = screen_.turn_view
        real_tokens = turn.tokens

        async def tokens(msg):
            streamed[0] += 1
            await real_tokens(msg)

        turn.tokens = tokens  # type: ignore[method-assign]
        counts.layouts = counts.frames = 0
        cpu = time.thread_time()
        await pilot.press(*"go", "enter")
        await wait_until(lambda: streamed[0] > 0 and not screen_.busy)
        await pilot.pause(0.3)
        cpu = time.thread_time() - cpu
    fake_engine.TokenDelta = real_delta  # type: ignore[misc]
    n = streamed[0]
    return {
        "reply": kind,
        "updates": n,
        "layouts": counts.layouts,
        "frames": counts.frames,
        "ui_cpu_s": round(cpu, 3),
        "ui_cpu_ms_per_update": round(1000 * cpu / max(n, 1), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--replies", default="prose,code,list,table", help="comma-separated: " + ",".join(REPLIES)
    )
    parser.add_argument("--size", default="120x40", help="the terminal, COLSxROWS")
    args = parser.parse_args()
    kinds = [k for k in args.replies.split(",") if k]
    unknown = [k for k in kinds if k not in REPLIES]
    if unknown:
        parser.error(f"unknown reply kind(s): {', '.join(unknown)}")
    try:
        cols, rows = (int(x) for x in args.size.lower().split("x"))
    except ValueError:
        parser.error(f"--size: COLSxROWS, e.g. 120x40 (got {args.size!r})")
    if cols < 40 or rows < 12:
        parser.error(f"--size: at least 40x12 (got {args.size})")
    counts = Counts()
    rows_out = [asyncio.run(one_reply(kind, (cols, rows), counts)) for kind in kinds]
    for r in rows_out:
        print(
            f"{r['reply']:>6}: {r['updates']} updates, {r['layouts']} layouts, {r['frames']} frames; "
            f"UI CPU {r['ui_cpu_s']:.3f} s, {r['ui_cpu_ms_per_update']} ms an update"
        )
    print(json.dumps({"benchmark": "tui_update_cost", "size": args.size, "rows": rows_out}))


if __name__ == "__main__":
    main()
