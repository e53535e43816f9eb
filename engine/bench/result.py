"""What a benchmark run produces, and the synthetic conversation every section measures with.

Kept apart from `run.py` so the sections (`load.py`, `resume.py`, `session.py`) can use them
without importing the runner that imports them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .. import ChatMessage, EngineAPI
from ..diagnostics import diagnostics

FILLER = (
    "The quick brown fox jumps over the lazy dog while a careful engineer reviews the diff, "
    "runs the tests again and writes down every number with the command that produced it. "
)


@dataclass
class BenchResult:
    model: str
    architecture: str
    profile: str
    n_ctx: int
    n_threads: int
    hybrid: bool
    machine: str
    threads: dict[str, Any] = field(default_factory=dict)  # the thread plan (scheduling/threads.py)
    prefill: list[dict[str, Any]] = field(default_factory=list)
    decode: dict[str, Any] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)  # later sections (e.g. resume)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def conversation_of(engine: EngineAPI, n_tokens: int) -> list[ChatMessage]:
    """A one-message conversation whose rendered prompt is about `n_tokens` tokens."""
    tokens_for = diagnostics(engine).tokens_for
    base = len(tokens_for([ChatMessage("user", "")]))
    per_filler = (len(tokens_for([ChatMessage("user", FILLER * 64)])) - base) / 64
    reps = max(0, round((n_tokens - base) / max(per_filler, 1.0)))
    return [ChatMessage("user", FILLER * reps)]
