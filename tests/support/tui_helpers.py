"""Building the TUI for tests: a fake or real engine, a store on a temp path, and every source
of variation pinned (clocks, memory, cursor blink) so snapshots are deterministic."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from velo_chat.app.app import VeloChatApp, make_app
from velo_chat.app.screens.chat import ChatScreen
from velo_chat.app.settings import AppSettings
from velo_chat.engine.config.profile_schema import Profile
from velo_chat.engine.config.profiles import build_profile
from velo_chat.store import SessionStore

from devkit.fake_engine import FakeFactory, FakeScript

FIXED_NOW = 1_800_000_000.0


def fixed_store(path: Path) -> SessionStore:
    """A store whose clock ticks one second per call from a fixed start (stable order/ages)."""
    t = [FIXED_NOW - 3600]

    def clock() -> float:
        t[0] += 1.0
        return t[0]

    return SessionStore(path, clock=clock)


def fake_app(
    tmp_path: Path,
    script: FakeScript | None = None,
    *,
    profile: Profile | None = None,
    store: SessionStore | None = None,
    cursor_blink: bool = False,
    **kwargs,
) -> tuple[VeloChatApp, FakeFactory]:
    factory = FakeFactory(script)
    app = make_app(
        profile or build_profile("default", {}),
        engine_factory=factory,
        store=store or fixed_store(tmp_path / "sessions.db"),
        settings=AppSettings(),
        clock=lambda: 100.0,
        wall_clock=lambda: FIXED_NOW,
        memory_probe=lambda: (300 << 20, None),
        memory_interval=None,
        cursor_blink=cursor_blink,
        pace_stream=False,
        **kwargs,
    )
    return app, factory


def chat(app) -> ChatScreen:
    """The app's chat screen, under any dialog or screen pushed over it."""
    return next(s for s in app.screen_stack if isinstance(s, ChatScreen))


async def wait_for(cond: Callable[[], bool], timeout: float = 60.0) -> None:  # generous: a loaded machine
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")
