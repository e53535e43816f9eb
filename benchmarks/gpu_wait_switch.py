"""Does a CUDA wait mode set after the model has loaded take effect? (docs/threads.md)

Loads a model on the GPU with `gpu_wait = "spin"`, decodes idle and beside `--load` busy
processes, then sets "block" on the live CUDA context and decodes beside them again. Each row
has tok/s and the CPU this process used per second of decoding (a spinning wait keeps ~1 core
busy; a blocking one much less). One JSON object per row on stdout.

    python benchmarks/gpu_wait_switch.py MODEL.gguf --load 16
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from velo_chat.engine import ChatMessage, make_engine
from velo_chat.engine.bench import busy_processes
from velo_chat.engine.config import build_profile
from velo_chat.engine.diagnostics import Diagnostics, apply_gpu_wait, diagnostics

PROMPT = [ChatMessage("user", "Tell a long story about a fox who learns to write tests.")]


def decode(diag: Diagnostics, label: str, tokens: int, repeats: int) -> dict:
    rates, cpu, wall = [], 0.0, 0.0
    for _ in range(repeats):
        diag.reset()
        ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        stats = diag.complete(PROMPT, max_tokens=tokens, ignore_eos=True).stats
        ru1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        rates.append(round(stats.decode_tok_s, 1))
        cpu += (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
        wall += t1 - t0
    return {"row": label, "tok_s_runs": rates, "own_cores": round(cpu / wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--load", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    profile = build_profile(
        "switch",
        {
            "model": {"path": args.model, "n_gpu_layers": -1, "gpu_wait": "spin"},
            "context": {"n_ctx": 4096, "flash_attn": "on"},
        },
    )
    engine = make_engine(profile)
    engine.load()
    diag = diagnostics(engine)
    rows = [decode(diag, "spin idle", args.tokens, args.repeats)]
    with busy_processes(args.load):
        rows.append(decode(diag, "spin busy", args.tokens, args.repeats))
        switched = apply_gpu_wait("block", uses_gpu=True)
        rows.append(decode(diag, f"{switched.describe()} after load, busy", args.tokens, args.repeats))
    rows.append(decode(diag, "block after load, idle", args.tokens, args.repeats))
    engine.close()
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
