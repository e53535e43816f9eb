"""`velo-chat` with the speculation cost model learnt again in each turn, as before the context
kept it (`CostModel.begin_turn`): each turn starts from `batch_cost_prior`, keeping only what a
stale graph costs. For side by side runs against the shipped stepper
(`SPEC_COSTS_AB=1 bash benchmarks/device_spec.sh`, or by hand):

    python benchmarks/cli_costs_per_turn.py bench --spec ...   (the arguments of `velo-chat`)
"""

from __future__ import annotations

import sys

from velo_chat.app.cli import main
from velo_chat.engine.spec_cost import CostModel
from velo_chat.engine.speculation import SpecStepper

_shipped = SpecStepper.__init__


def _per_turn(self: SpecStepper, live, sampler, settings, session) -> None:  # type: ignore[no-untyped-def]
    kept = live.spec_costs
    live.spec_costs = CostModel(slope=settings.batch_cost_prior, stale=kept.stale if kept else None)
    _shipped(self, live, sampler, settings, session)


if __name__ == "__main__":
    SpecStepper.__init__ = _per_turn  # type: ignore[method-assign]
    sys.exit(main())
