"""Stand-ins for the live sequence that the shipped speculation stepper (`SpecStepper`) drives,
for the tests and the benchmarks that run the stepper without a model.

- `RecordedLive` answers each step and verify batch from a recorded greedy reply, on a virtual
  clock charged from a cost table (`simulate` runs the stepper over one reply with it;
  `benchmarks/spec_replies_sim.py` records the replies and prints what the stepper would do with
  them on the backend the table was measured on).
- `StandInLive` decodes nothing: sampling reads the next token of a given text
  (`benchmarks/spec_stepper_python.py` times the stepper's own Python with it).

Each must keep up with what `SpecStepper` reads from a `LiveSequence`: the tests run the stepper
over them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from velo_chat.engine.config.profile_schema import SpeculationSettings
from velo_chat.engine.live_sequence import LiveSequence
from velo_chat.engine.speculation.cost import CostModel
from velo_chat.engine.speculation.stepper import SpecStepper

Table = dict[int, float]

H200_SMOLLM2: tuple[Table, Table] = (
    # after a call of the same size (graph reused); 8 from the step search's runs (1.41-1.46)
    {1: 1.0, 2: 1.127, 3: 1.173, 5: 1.275, 8: 1.43, 9: 2.798, 17: 3.139},
    # after a call of another size (a new graph); 8 assumed 5's extra over back to back
    {1: 1.685, 2: 1.79, 3: 1.833, 5: 1.934, 8: 2.09, 9: 3.461, 17: 3.794},
)


def call_steps(table: Table, n: int) -> float:
    """A call of `n` tokens in one-token steps, interpolated between the table's sizes."""
    sizes = sorted(table)
    if n <= sizes[0]:
        return table[sizes[0]]
    for lo, hi in zip(sizes, sizes[1:], strict=False):
        if lo <= n <= hi:
            return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)
    return table[sizes[-1]] + (table[sizes[-1]] - table[sizes[-2]]) / (sizes[-1] - sizes[-2]) * (
        n - sizes[-1]
    )


def load_costs(name: str) -> tuple[Table, Table]:
    if name == "h200-smollm2":
        return H200_SMOLLM2
    data = json.loads(Path(name).read_text())
    spec = data.get("sections", {}).get("speculation", data)
    return (
        {int(k): float(v) for k, v in spec["cost"].items()},
        {int(k): float(v) for k, v in spec["cost_alternating"].items()},
    )


class RecordedLive:
    """The live sequence as `SpecStepper` uses it, answering from a recorded greedy reply:
    the token after position p of the reply is `reply[p + 1]`, whatever was drafted before it
    (the stepper stops reading a verify batch at its first wrong draft). Each decode call
    advances `now` by the table's cost of its size (in one-token steps)."""

    def __init__(
        self, prompt: int, reply: Sequence[int], costs: tuple[Table, Table], max_draft: int, warm: bool
    ) -> None:
        self.prompt, self.reply, self.costs = prompt, list(reply), costs
        self.n = prompt
        self.n_ctx = prompt + len(reply) + max_draft + 8
        self.max_draft = max_draft
        self.verified_sizes: set[int] = set(range(1, max_draft + 2)) if warm else set()
        self.spec_costs: CostModel | None = None  # what the context's earlier turns timed (`simulate`)
        self.gpu_resident = True  # the tables are a GPU's: a context keeps its costs where asked to
        # (the tables price a batch by size and switch only: no call's graph is stale here)
        self.now = 0.0
        self._last = 1
        self._base = 0

    def __len__(self) -> int:
        return self.n

    def _charge(self, size: int) -> None:
        same, other = self.costs
        self.now += call_steps(same if size == self._last else other, size)
        self._last = size

    def graph_stale(self, n: int) -> bool:
        return False

    def append(self, token: int) -> None:
        self._charge(1)
        self.n += 1

    def sample(self, sampler: object, i: int = -1) -> int:
        return self.reply[self.n - self.prompt]

    def verify(self, tokens: Sequence[int]) -> None:
        self._charge(len(tokens))
        self._base = self.n - self.prompt
        self.n += len(tokens)
        self.verified_sizes.add(len(tokens))

    def pick(self, sampler: object, i: int) -> int:
        return self.reply[self._base + 1 + i]

    def rollback(self, n: int) -> None:
        self.n -= n


class SimContext:
    """What a context keeps from one simulated turn to the next: its cost model."""

    def __init__(self) -> None:
        self.spec_costs: CostModel | None = None


def simulate(
    prompt: Sequence[int],
    reply: Sequence[int],
    costs: tuple[Table, Table],
    settings: SpeculationSettings,
    *,
    warm: bool,
    source: Sequence[int] = (),
    context: SimContext | None = None,
) -> dict:
    """The stepper over `reply` (its first token sampled after the prompt): the virtual time
    of the reply's tokens after the first, against as many one-token steps back to back.
    `source`: the draft source beyond the prompt (the replay row: the plain reply, as
    `Diagnostics.spec_replay` gives it). `context`: the turn is one of that context's, which
    keeps its cost model across them where `settings.keep_costs` says so (None: a fresh
    context)."""
    tokens = len(reply) - 1  # the last token is never decoded
    live = RecordedLive(len(prompt), reply, costs, settings.max_draft, warm)
    if context is not None:
        live.spec_costs = context.spec_costs
    stepper = SpecStepper(live, None, settings, [*prompt, *source])  # type: ignore[arg-type]
    stepper.clock = lambda: live.now
    produced, token = 1, reply[0]
    while produced < tokens:
        out = stepper.step(token, tokens - produced)
        produced += len(out)
        token = out[-1]
    if context is not None:
        context.spec_costs = live.spec_costs
    c = stepper.counters
    plain = (produced - 1) * costs[0][1]
    return {
        "tokens": produced,
        "speedup": round(plain / live.now, 3),
        "drafted": c.drafted,
        "accepted": c.accepted,
        "acceptance": round(c.accepted / c.drafted, 3) if c.drafted else 0.0,
        "tokens_per_call": round((produced - 1) / c.decode_calls, 2) if c.decode_calls else 0.0,
        "batches": {str(k): v for k, v in sorted(c.batches.items())},
        "declined": c.declined,
        "guarded": c.guarded,
    }


class StandInLive:
    """The parts of `LiveSequence` a plain step touches; decoding is free, sampling reads the
    next token of `text`."""

    hybrid = False
    gpu_resident = False  # a context's cost model is learnt per turn (`stepper.turn_costs`)
    max_draft = 16
    n_ctx = 1 << 30

    def __init__(self, text: Sequence[int]) -> None:
        self._text = text
        self._tokens: list[int] = []
        self._windows: dict[int, int] = {}
        self._last_window = 1 << 30
        self.verified_sizes: set[int] = set()
        self.spec_costs: CostModel | None = None

    def __len__(self) -> int:
        return len(self._tokens)

    def append(self, token: int) -> None:
        self._windows[1] = self._window(1)
        self._tokens.append(token)

    def sample(self, sampler: object, i: int = -1) -> int:
        return self._text[len(self._tokens)]

    # the live sequence's own window rule, run on this stand-in's `_tokens` and `_windows`
    def _window(self, n: int) -> int:
        return LiveSequence._window(cast(LiveSequence, self), n)

    def graph_stale(self, n: int) -> bool:
        return LiveSequence.graph_stale(cast(LiveSequence, self), n)
