"""The fit check before a command loads a model: refuse with the table (exit 2), or, under
`--force`, load anyway and say so on stderr.

`--force` is a flag of the whole command line (`velo-chat --force ask ...` or
`velo-chat ask --force ...`); `forced()` holds it for the command's run, so every load a
command makes is checked the same way without threading the flag through each one."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from contextvars import ContextVar

from velo_chat.engine import DoesNotFit, EngineAPI

_force: ContextVar[bool] = ContextVar("velo_chat_force_load", default=False)


@contextlib.contextmanager
def forced(force: bool) -> Iterator[None]:
    """Within this block, loads that do not fit go ahead (with a warning) when `force`."""
    token = _force.set(force)
    try:
        yield
    finally:
        _force.reset(token)


def check_fit(engine: EngineAPI) -> None:
    """`engine.check()`: a missing or bad file raises as ever; a model that does not fit raises
    `DoesNotFit` (the CLI prints its table and exits 2) unless the command runs `forced`."""
    try:
        engine.check()
    except DoesNotFit as exc:
        if not _force.get():
            raise
        print(f"velo-chat: warning: loading anyway (--force): {exc.report.summary()}", file=sys.stderr)
