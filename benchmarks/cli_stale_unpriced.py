"""`velo-chat` with stale graphs not priced: `LiveSequence.graph_stale` always False, so the
speculation stepper prices every verify batch as it did before stale graphs were told apart
(a new graph's `rebuild` only) and times stale one-token steps as ordinary ones. For side by
side runs against the shipped stepper (`SPEC_STALE_AB=1 bash benchmarks/device_spec.sh`):

    python benchmarks/cli_stale_unpriced.py bench --spec ...   (the arguments of `velo-chat`)
"""

from __future__ import annotations

import sys

from velo_chat.app.cli import main
from velo_chat.engine.live_sequence import LiveSequence


def _never_stale(self: LiveSequence, n: int) -> bool:
    return False


if __name__ == "__main__":
    LiveSequence.graph_stale = _never_stale  # type: ignore[method-assign]
    sys.exit(main())
