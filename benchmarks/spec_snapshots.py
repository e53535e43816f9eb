"""What a hybrid model's rollback snapshots cost plain decoding, side by side in one process.

    python benchmarks/spec_snapshots.py --model M.gguf --profile NAME [--drafts 0,4,16]
        [--tokens 256] [--repeats 4] [--kernels]

A context made for speculation on a hybrid model keeps `max_draft` recurrent-state snapshots
(llama.cpp's `n_rs_seq`). This loads the model once per value in `--drafts` (0: speculation
off, no snapshots; the others: speculation on with that `max_draft`, drafting switched off for
the measured turns, so every step is a plain one) and decodes the same reply in each context in
turn, `--repeats` rounds, so every context sees the same machine. Prints one JSON object: each
context's decode rates and median, and the median's ratio to the context without snapshots.

`--kernels` (a CUDA build, with PyTorch installed for its profiler) also times one turn of
each context kernel by kernel (CUPTI records the kernels of a launched CUDA graph too; run with
GGML_CUDA_DISABLE_GRAPHS=1 to see them launched one by one) and prints, per context, the
kernels per token, their GPU time per token, and the kernels that add most time against the
context without snapshots.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections import Counter
from typing import Any

from velo_chat.engine import make_engine
from velo_chat.engine.bench import with_speculation, workloads
from velo_chat.engine.config import load_profile
from velo_chat.engine.diagnostics import Diagnostics, diagnostics


def _engine(profile_name: str, model: str, max_draft: int) -> Diagnostics:
    profile = load_profile(profile_name)
    spec = dataclasses.replace(
        profile.speculation,
        enabled=max_draft > 0,
        max_draft=max(max_draft, 1),
        allow_batch_rounding=True,
    )
    engine = make_engine(dataclasses.replace(profile, speculation=spec), model_path=model)
    engine.load()
    with_speculation(engine, False)  # the snapshots stay (they are the context's), no drafts
    return diagnostics(engine)


def _plain_rate(engine: Diagnostics, tokens: int) -> float:
    engine.reset()
    with engine.checkpoints_at(None):
        done = engine.complete(workloads()["novel"], max_tokens=tokens, ignore_eos=True)
    return done.stats.decode_tok_s


def _kernels(engine: Diagnostics, tokens: int) -> tuple[Counter[str], Counter[str]]:
    """CUDA kernel time (µs) and launches by kernel name over one plain turn."""
    from torch.profiler import ProfilerActivity, profile

    engine.reset()
    with engine.checkpoints_at(None), profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.complete(workloads()["novel"], max_tokens=tokens, ignore_eos=True)
    time_us: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for e in prof.key_averages():
        if e.device_time_total > 0:
            time_us[e.key[:80]] += e.device_time_total
            calls[e.key[:80]] += e.count
    return time_us, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--drafts", default="0,4,16", help="max_draft of each context (0: no snapshots)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--kernels", action="store_true")
    args = ap.parse_args()
    drafts = [int(d) for d in args.drafts.split(",")]
    engines = {d: _engine(args.profile, args.model, d) for d in drafts}
    out: dict[str, Any] = {"tokens": args.tokens}
    try:
        rates: dict[int, list[float]] = {d: [] for d in drafts}
        for _ in range(args.repeats):
            for d, engine in engines.items():
                rates[d].append(_plain_rate(engine, args.tokens))
        base = statistics.median(rates[drafts[0]])
        out["plain_tok_s"] = {
            str(d): {
                "runs": [round(r, 1) for r in rs],
                "median": round(statistics.median(rs), 1),
                "ratio": round(statistics.median(rs) / base, 3),
            }
            for d, rs in rates.items()
        }
        if args.kernels:
            try:
                import torch.profiler  # noqa: F401
            except ImportError:
                out["kernels"] = "not measured: needs PyTorch (its profiler)"
                args.kernels = False
        if args.kernels:
            n = 64
            profiles = {d: _kernels(engine, n) for d, engine in engines.items()}
            t0 = profiles[drafts[0]][0]
            kernels: dict[str, Any] = {}
            for d, (t, c) in profiles.items():
                diff = Counter({k: t[k] - t0.get(k, 0) for k in set(t) | set(t0)})
                kernels[str(d)] = {
                    "kernels_per_token": round(sum(c.values()) / n, 1),
                    "gpu_us_per_token": round(sum(t.values()) / n, 1),
                    "most_added_us_per_token": {k: round(v / n, 2) for k, v in diff.most_common(8) if v > 0},
                }
            out["kernels"] = kernels
    finally:
        for engine in engines.values():
            engine.engine.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
