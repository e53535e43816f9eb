"""Decode tok/s inside the TUI vs the headless engine, same model, same run, printed as JSON.

The app runs headless (Textual's test driver: it renders every frame, it just writes nowhere)
with the real SmolLM2 engine; each TUI turn decodes a fixed number of greedy tokens
(`ignore_eos`), streamed into the transcript and the live panel. Two references, same run:
the same engine turn driven by a plain loop in this process, alternated with the TUI turns so
both see the same machine, and `velo-chat bench`'s decode figure from its own process.

    .venv/bin/python benchmarks/tui_decode.py [--tokens 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


async def tui_turn(pilot, screen, prompt: str) -> float:
    from velo_chat.app.widgets.composer.composer import Composer

    screen.query_one(Composer).load_text(prompt)
    await pilot.press("enter")
    while not screen.busy:
        await asyncio.sleep(0.01)
    while screen.busy:
        await asyncio.sleep(0.02)
    await pilot.pause()
    reply = pilot.app.store.messages(screen.session.id)[-1]
    return float(reply.stats["decode_tok_s"])


def headless_turn(engine, prompt: str, tokens: int) -> float:
    from velo_chat.engine.chat_template import ChatMessage
    from velo_chat.engine.events import TurnDone

    engine.reset()
    for event in engine.turn([ChatMessage("user", prompt)], max_tokens=tokens, ignore_eos=True):
        if isinstance(event, TurnDone):
            return event.stats.decode_tok_s
    raise RuntimeError("no TurnDone")


def cli_bench_decode(tokens: int, repeats: int) -> float:
    """Decode tok/s from `velo-chat bench` in its own process (median of its repeats)."""
    import subprocess

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "velo_chat.app.cli",
            "bench",
            "--json",
            "--no-resume",
            "--prefill-sizes",
            "64",
            "--decode-tokens",
            str(tokens),
            "--repeats",
            str(repeats),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(proc.stdout)["decode"]["tok_s"])


async def main(args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from velo_chat.app.app import make_app
    from velo_chat.app.screens.chat import ChatScreen
    from velo_chat.app.settings import AppSettings
    from velo_chat.engine.setup import default_model
    from velo_chat.engine.engine import Engine
    from velo_chat.engine.config.profiles import build_profile
    from velo_chat.store import SessionStore

    model = default_model.require_default_model()
    profile = build_profile(
        "bench",
        {
            "model": {"path": str(model)},
            "context": {"n_ctx": 2048, "n_threads": args.threads},
            "sampling": {"temperature": 0.0, "max_tokens": args.tokens},
        },
    )
    home = Path(tempfile.mkdtemp(prefix="velo-tui-bench-"))
    store = SessionStore(home / "sessions.db")
    app = make_app(
        profile,
        store=store,
        settings=AppSettings(),
        memory_interval=2.0,
        turn_kwargs={"ignore_eos": True, "max_tokens": args.tokens},
    )
    headless_engine = Engine(profile)
    headless_engine.load()
    prompt = "Write a long story about a lighthouse keeper."
    tui, headless = [], []
    t0 = time.perf_counter()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = next(s for s in app.screen_stack if isinstance(s, ChatScreen))
        while not screen.model_ready:
            await asyncio.sleep(0.05)
        headless_turn(headless_engine, prompt, 16)  # warm-up both
        await tui_turn(pilot, screen, "warm up")
        for _ in range(args.repeats):
            await pilot.press("ctrl+n")
            await pilot.pause()
            await asyncio.sleep(1.0)
            headless.append(headless_turn(headless_engine, prompt, args.tokens))
            tui.append(await tui_turn(pilot, screen, prompt))
    headless_engine.close()
    store.close()
    cli = cli_bench_decode(args.tokens, args.repeats)
    t_med, h_med = statistics.median(tui), statistics.median(headless)
    return {
        "benchmark": "tui_decode",
        "model": model.name,
        "decode_tokens": args.tokens,
        "repeats": args.repeats,
        "n_threads": args.threads,
        "cpus": os.cpu_count(),
        "tui_decode_tok_s": [round(x, 1) for x in tui],
        "headless_decode_tok_s": [round(x, 1) for x in headless],
        "tui_median": round(t_med, 1),
        "headless_median": round(h_med, 1),
        "ratio": round(t_med / h_med, 3),
        "target": 0.95,
        "cli_bench_decode_tok_s": cli,
        "ratio_vs_cli_bench": round(t_med / cli, 3),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
