"""Decode speed of a qwen4exp model with llama.cpp's CPU PLE gather ("stock") or the GPU
provider ("gpu": decode gathers launched from C; "gpu-python": every gather through the Python
callback), every layer on the GPU, measured around each llama_decode call and the wait for
its logits (`llama_synchronize`): llama_decode returns once a CUDA step is queued, so timing the
call alone leaves out the GPU's tail of each token (runs before 2026-12-02 did: their tok/s were
15-20% above what a turn decodes, `velo-chat bench`).

    python benchmarks/ple_decode.py --model M.gguf --mode gpu [--tokens 512] [--threads 1]

Prints one JSON object (`argmax_digest`: a digest of each step's most likely next token, equal
across modes when the gathers agree): decode tok/s (tokens / summed step time), the median and 90th
percentile microseconds of one step, graphs reused, the graph splits of a decode step (from
llama.cpp's log when the context is made), the seconds of a prefill (`--prefill`, 512 tokens),
and for the provider the mean microseconds of a Python callback and how many gathers ran. Run
it once per process and mode: CUDA reads `GGML_CUDA_DISABLE_GRAPHS` at start-up.
`--debug-log FILE` writes llama.cpp's debug lines there (with `GGML_SCHED_DEBUG=2`: every graph
split and the backend of each node, which shows what splits a decode step).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
import statistics
import time
from pathlib import Path

import numpy as np

from velo_chat.engine.config import build_profile
from velo_chat.engine.diagnostics import LlamaContext, LlamaModel, PleProvider

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
    ap.add_argument("--mode", choices=("stock", "gpu", "gpu-python"), required=True)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prefill", type=int, default=512, help="tokens of the timed prefill")
    ap.add_argument("--debug-log", type=Path, help="write llama.cpp's debug lines to this file")
    args = ap.parse_args()
    if args.debug_log:
        debug = logging.FileHandler(args.debug_log, mode="w")
        debug.setLevel(logging.DEBUG)
        logging.getLogger("velo_chat.llama").addHandler(debug)
        logging.getLogger("velo_chat.llama").setLevel(logging.DEBUG)
    lines = _Lines()
    mode = "gpu" if args.mode.startswith("gpu") else args.mode
    PleProvider.NATIVE = args.mode != "gpu-python"
    logging.getLogger("velo_chat").addHandler(lines)
    logging.getLogger("velo_chat").setLevel(logging.INFO)
    profile = build_profile(
        "ple-decode",
        {
            "model": {"path": str(args.model), "n_gpu_layers": -1, "ple_gather": mode},
            "context": {
                "n_ctx": max(4096, args.prefill + 64),
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
    prompt = [int(t) for t in rng.integers(100, 8000, size=args.prefill)]
    t0 = time.perf_counter()
    ctx.decode(prompt)
    ctx.synchronize()
    prefill_s = time.perf_counter() - t0
    ctx.clear()
    ctx.decode(prompt[:64])
    busy0 = model.ple.busy_s if model.ple else 0.0
    calls0 = model.ple.calls if model.ple else 0
    launches0 = model.ple.launches if model.ple else 0
    steps = []
    tok = 1000
    argmax: list[int] = []
    for _ in range(args.tokens):
        t = time.perf_counter()
        rc = ctx.decode_one(tok)
        ctx.synchronize()  # the step's GPU work too (its logits are ready after this)
        steps.append(time.perf_counter() - t)
        assert rc == 0, rc
        argmax.append(int(np.argmax(ctx.logits_at(-1))))  # outside the timing
        tok = 100 + (tok * 7919) % 7900  # a fixed token stream: no sampling in the timing
    ple = model.ple
    out = {
        "mode": args.mode if model.ple_mode == "gpu" else model.ple_mode,
        "reason": model.ple_reason,
        "threads": args.threads,
        "tokens": args.tokens,
        "tok_s": round(args.tokens / sum(steps), 1),
        "step_us_median": round(statistics.median(steps) * 1e6, 1),
        "step_us_p90": round(sorted(steps)[int(0.9 * len(steps))] * 1e6, 1),
        "graphs_reused": ctx.perf().n_reused,
        "argmax_digest": hashlib.sha1(json.dumps(argmax).encode()).hexdigest()[:12],
        "splits_pp_tg": splits,
        "prefill_tokens": args.prefill,
        "prefill_s": round(prefill_s, 4),
    }
    if ple is not None:
        n = ple.calls - calls0
        out["callback_us_mean"] = round((ple.busy_s - busy0) / max(n, 1) * 1e6, 1)
        out["python_calls"] = n
        out["gathers"] = ple.launches - launches0
        out["unordered_calls"] = ple.unordered_calls
    print(json.dumps(out))
    ctx.close()
    model.close()


if __name__ == "__main__":
    main()
