"""Do a speculation verify batch's logits equal one-token decoding's on this backend?

    python benchmarks/spec_logits.py --model M.gguf --profile NAME [--positions 40] [--label L]

After the prompt of `bench --spec`'s novel workload, the model's greedy continuation is decoded
one token at a time (the logits of every position kept), then verified again in batches of 2, 4,
8 and 16 tokens (those that fit the profile's `max_draft`), the prompt prefilled alike. Prints
one JSON object: the largest absolute logit difference per batch size, at how many positions
the argmax differs, and the smallest gap between the two best logits of the one-token chain
(greedy output can only differ where a difference exceeds such a gap: docs/speculation.md).
The profile needs `speculation.enabled` on a hybrid model (its context keeps the snapshots a
verify batch needs). A measuring tool: it reads the engine's live sequence, as the tests do.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from velo_chat.engine.bench.spec import workloads
from velo_chat.engine.config.profiles import load_profile
from velo_chat.engine.engine import Engine

BATCHES = (2, 4, 8, 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--positions", type=int, default=40)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    with Engine(load_profile(args.profile), model_path=args.model) as engine:
        engine.load()
        live = engine._require()[2]  # noqa: SLF001 - a measuring tool, like the tests
        prompt = engine.tokens_for(workloads()["novel"])

        def prefill() -> None:
            live.clear()
            for pos in range(0, len(prompt), live.n_ubatch):
                live.extend(prompt[pos : pos + live.n_ubatch])

        prefill()
        chain: list[int] = []
        ref: list[np.ndarray] = []
        for _ in range(args.positions):
            logits = live.logits()
            ref.append(logits)
            chain.append(int(np.argmax(logits)))
            live.append(chain[-1])
        ref.append(live.logits())  # after the last chain token
        top2 = [np.sort(r)[-2:] for r in ref]
        out: dict = {
            "label": args.label,
            "positions": args.positions,
            "min_top2_gap": float(min(t[1] - t[0] for t in top2)),
            "max_abs_diff": {},
            "argmax_differs": {},
        }
        for b in (b for b in BATCHES if b - 1 <= live.max_draft):
            prefill()
            diff, differs = 0.0, 0
            for start in range(0, args.positions, b):
                batch = chain[start : start + b]
                live.verify(batch)
                for i in range(len(batch)):
                    got, want = live.logits(i), ref[start + i + 1]
                    diff = max(diff, float(np.max(np.abs(got - want))))
                    differs += int(np.argmax(got) != np.argmax(want))
            out["max_abs_diff"][b] = diff
            out["argmax_differs"][b] = differs
        live.clear()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
