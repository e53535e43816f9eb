"""Do a speculation verify batch's logits equal one-token decoding's on this backend?

    python benchmarks/spec_logits.py --model M.gguf --profile NAME [--positions 40] [--label L]

After the prompt of `bench --spec`'s novel workload, the model's greedy continuation is decoded
one token at a time, then verified again in batches of 2, 4, 8 and 16 tokens (those that fit
the profile's `max_draft`), the prompt prefilled alike (`Diagnostics.verify_logit_differences`).
Prints one JSON object: the largest absolute logit difference per batch size, at how many
positions the argmax differs, and the smallest gap between the two best logits of the
one-token chain (greedy output can only differ where a difference exceeds such a gap:
docs/speculation.md). The profile needs `speculation.enabled` and `allow_batch_rounding` on a
hybrid model (its context then keeps the snapshots a verify batch needs).
"""

from __future__ import annotations

import argparse
import json

from velo_chat.engine import make_engine
from velo_chat.engine.bench import workloads
from velo_chat.engine.config import load_profile
from velo_chat.engine.diagnostics import diagnostics

BATCHES = (2, 4, 8, 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--positions", type=int, default=40)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    engine = make_engine(load_profile(args.profile), model_path=args.model)
    try:
        engine.load()
        out = diagnostics(engine).verify_logit_differences(workloads()["novel"], args.positions, BATCHES)
    finally:
        engine.close()
    print(json.dumps({"label": args.label, **out}))


if __name__ == "__main__":
    main()
