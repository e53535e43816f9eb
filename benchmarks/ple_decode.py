"""Decode speed of a qwen4exp model with llama.cpp's CPU PLE gather ("stock") or the GPU
provider ("gpu"), every layer on the GPU, measured around each llama_decode call.

    python benchmarks/ple_decode.py --model M.gguf --mode gpu [--tokens 512] [--threads 1]

Prints one JSON object: decode tok/s (tokens / summed llama_decode time), the median and 90th
percentile microseconds of one step, graphs reused, the graph splits of a decode step (from
llama.cpp's log when the context is made), a 512-token prefill's seconds, and for the provider
the mean microseconds spent in its callback. Run it once per process and mode: CUDA reads
`GGML_CUDA_DISABLE_GRAPHS` at start-up.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import time
from pathlib import Path

import numpy as np

from velo_chat.engine.config.profiles import build_profile
from velo_chat.engine.llama_context import LlamaContext
from velo_chat.engine.llama_model import LlamaModel

SPLITS = re.compile(r"graph.*splits = (\d+)(?: / (\d+))?")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--mode", choices=("stock", "gpu"), required=True)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    lines = _Lines()
    logging.getLogger("velo_chat").addHandler(lines)
    logging.getLogger("velo_chat").setLevel(logging.INFO)
    profile = build_profile(
        "ple-decode",
        {
            "model": {"path": str(args.model), "n_gpu_layers": -1, "ple_gather": args.mode},
            "context": {
                "n_ctx": 4096,
                "n_batch": 512,
                "n_ubatch": 512,
                "n_threads": args.threads,
                "n_threads_batch": args.threads,
                "adapt_threads": False,
                "flash_attn": "on",
            },
        },
    )
    model = LlamaModel(args.model, profile.model)
    ctx = LlamaContext(model, profile.context, n_gpu_layers=-1)
    found = [m for m in (SPLITS.search(x) for x in lines.lines) if m]
    splits = [int(found[-1].group(1)), int(found[-1].group(2) or found[-1].group(1))] if found else None
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 8000, size=512)]
    t0 = time.perf_counter()
    ctx.decode(prompt)
    ctx.synchronize()
    prefill_s = time.perf_counter() - t0
    ctx.clear()
    ctx.decode(prompt[:64])
    busy0 = model.ple.busy_s if model.ple else 0.0
    calls0 = model.ple.calls if model.ple else 0
    steps = []
    tok = 1000
    for _ in range(args.tokens):
        t = time.perf_counter()
        rc = ctx.decode_one(tok)
        steps.append(time.perf_counter() - t)
        assert rc == 0, rc
        tok = 100 + (tok * 7919) % 7900  # a fixed token stream: no sampling in the timing
    ple = model.ple
    out = {
        "mode": model.ple_mode,
        "reason": model.ple_reason,
        "threads": args.threads,
        "tokens": args.tokens,
        "tok_s": round(args.tokens / sum(steps), 1),
        "step_us_median": round(statistics.median(steps) * 1e6, 1),
        "step_us_p90": round(sorted(steps)[int(0.9 * len(steps))] * 1e6, 1),
        "graphs_reused": ctx.perf().n_reused,
        "splits_pp_tg": splits,
        "prefill_512_s": round(prefill_s, 4),
    }
    if ple is not None:
        n = ple.calls - calls0
        out["callback_us_mean"] = round((ple.busy_s - busy0) / max(n, 1) * 1e6, 1)
        out["unordered_calls"] = ple.unordered_calls
    print(json.dumps(out))
    ctx.close()
    model.close()


if __name__ == "__main__":
    main()
