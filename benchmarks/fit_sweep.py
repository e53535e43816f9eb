"""The fit estimate against what llama.cpp allocates, over a sweep of context settings: prints
JSON, one row per (flash attention, n_ubatch, n_ctx) with each term estimated and measured.

    .venv/bin/python benchmarks/fit_sweep.py MODEL.gguf [--gpu-layers N]

The model is loaded once; each row creates (and frees) one context and reads the buffer sizes
llama.cpp logs (engine/fit/llama_buffers.py). docs/fit.md quotes its results.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from velo_chat.engine import llama_log
from velo_chat.engine.config.profiles import build_profile
from velo_chat.engine.fit import estimate, llama_buffers, machine
from velo_chat.engine.fit.model_facts import read_facts
from velo_chat.engine.llama_context import LlamaContext
from velo_chat.engine.llama_model import LlamaModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--ubatch", default="32,64,256,512", help="n_ubatch values")
    ap.add_argument("--ctx", default="512,2048,8192", help="n_ctx values")
    args = ap.parse_args()
    llama_log.install()
    facts = read_facts(args.model)
    probe = machine.probe()
    integrated = probe.gpu is not None and probe.gpu.integrated
    base = {"model": {"path": str(args.model), "n_gpu_layers": args.gpu_layers}}
    model = LlamaModel(args.model, build_profile("sweep", base).model)
    rows = []
    try:
        ubatches = [int(x) for x in args.ubatch.split(",")]
        contexts = [int(x) for x in args.ctx.split(",")]
        for fa, ub, n_ctx in itertools.product(("on", "off"), ubatches, contexts):
            context = {
                "flash_attn": fa,
                "n_ubatch": ub,
                "n_batch": max(ub, 256),
                "n_ctx": n_ctx,
                "n_threads": 2,
            }
            profile = build_profile("sweep", {**base, "context": context})
            terms = estimate.estimate(
                profile, facts, gpu_offload=probe.gpu_offload, integrated_gpu=integrated
            )
            with llama_buffers.captured() as got:
                LlamaContext(model, profile.context, n_gpu_layers=args.gpu_layers).close()
            compared = [c for c in llama_buffers.compare(terms, got) if c.what != "weights"]  # logged at load
            big = [abs(c.estimate / c.measured - 1) for c in compared if c.measured >= 1 << 20]
            rows.append(
                {
                    "flash_attn": fa,
                    "n_ubatch": ub,
                    "n_ctx": n_ctx,
                    "terms": [
                        {"what": c.what, "device": c.device, "estimate": c.estimate, "llama_cpp": c.measured}
                        for c in compared
                    ],
                    "all_close": all(c.close for c in compared),  # within 10%, or the log's rounding
                    "worst_off_over_1mib": max(big, default=0.0),
                }
            )
    finally:
        model.close()
    print(json.dumps({"model": str(args.model), "gpu_layers": args.gpu_layers, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
