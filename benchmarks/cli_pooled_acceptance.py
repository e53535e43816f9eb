"""`velo-chat` with one acceptance rate for a draft's first token and the tokens after it, as
the stepper priced drafts before `spec_cost.Acceptance` kept them apart: every tested token,
declined drafts' first tokens included, updates one rate per match bucket. For side by side
runs against the shipped stepper (`SPEC_POOLED_AB=1 bash benchmarks/device_spec.sh`):

    python benchmarks/cli_pooled_acceptance.py bench --spec ...   (the arguments of `velo-chat`)
"""

from __future__ import annotations

import sys

from velo_chat.app.cli import main
from velo_chat.engine.speculation import stepper as speculation
from velo_chat.engine.speculation.cost import Acceptance


class PooledAcceptance(Acceptance):
    """One rate per bucket for every tested token (the same prior, decay and trials)."""

    def rate(self, length: int) -> float:
        s, n = self._first[self.bucket(length)]
        return s / n

    continuation = rate

    def update(self, length: int, drafted: int, accepted: int) -> None:
        st = self._first[self.bucket(length)]
        st[0] = st[0] * self.decay + accepted
        st[1] = st[1] * self.decay + accepted + (1 if accepted < drafted else 0)


if __name__ == "__main__":
    speculation.Acceptance = PooledAcceptance  # type: ignore[misc]
    sys.exit(main())
