"""The fit estimate against what llama.cpp allocates, over a sweep of context settings: JSON, one
row per (PLE gather, flash attention, n_ubatch, n_ctx) with each term estimated and measured.

    .venv/bin/python benchmarks/fit_sweep.py MODEL.gguf [--gpu-layers N] [--out FILE]

The model is loaded once per PLE gather mode (`--ple-gather`: "stock" and, with layers on a GPU,
"gpu" too); each row creates (and frees) one context and reads the buffer sizes llama.cpp logs
(engine/fit/llama_buffers.py). With `--out` the JSON goes to FILE and keeps, beside the
comparison, everything needed to fit the estimate again without the machine: each context's
settings, every term's formula, llama.cpp's log lines of the context's creation (buffer sizes,
graph nodes and splits, scheduler copies) and of the model's load, and for one context per mode
(`--sched-debug`) the scheduler's split assignment (GGML_SCHED_DEBUG=2: every node, its backend,
each split's inputs). Without `--out` it prints the comparison only. docs/fit.md quotes results.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

from velo_chat.engine.config import build_profile
from velo_chat.engine.diagnostics import (
    BufferComparison,
    LlamaContext,
    LlamaModel,
    captured_llama_buffers,
    compare_llama_buffers,
    estimate_terms,
    install_llama_log,
)
from velo_chat.engine.fit import probe_machine, read_facts

GRAPH = re.compile(r"graph.*: nodes = (?P<nodes>[\d /]+), splits = (?P<splits>[\d /]+)")
MIB = 1 << 20
COPIES = re.compile(r"sched copies = (?P<n>\d+)")


def graph_facts(lines: list[str]) -> dict[str, Any]:
    """The reserve's graph: nodes and splits (prefill / decode when they differ), sched copies."""
    out: dict[str, Any] = {}
    for line in lines:
        if m := GRAPH.search(line):
            out["nodes"] = m["nodes"].strip()
            out["splits"] = m["splits"].strip()
        if m := COPIES.search(line):
            out["sched_copies"] = int(m["n"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--ubatch", default="32,64,256,512", help="n_ubatch values")
    ap.add_argument("--ctx", default="512,2048,8192", help="n_ctx values")
    ap.add_argument("--flash-attn", default="on,off", help="flash_attn values")
    ap.add_argument(
        "--ple-gather",
        default=None,
        help='model.ple_gather values (default "stock", and "gpu" with --gpu-layers)',
    )
    ap.add_argument(
        "--sched-debug",
        default="off,512,8192;on,32,8192",
        help="flash_attn,n_ubatch,n_ctx of the contexts whose scheduler assignment is kept, ';' between",
    )
    ap.add_argument("--out", type=Path, help="write the full JSON here (else the comparison to stdout)")
    args = ap.parse_args()
    install_llama_log()
    facts = read_facts(args.model)
    probe = probe_machine()
    integrated = probe.gpu is not None and probe.gpu.integrated
    modes = (args.ple_gather or ("stock,gpu" if args.gpu_layers and facts.ple_bytes else "stock")).split(",")
    debug_keys = {tuple(k.split(",")) for k in args.sched_debug.split(";") if k}
    ubatches = [int(x) for x in args.ubatch.split(",")]
    contexts = [int(x) for x in args.ctx.split(",")]
    result: dict[str, Any] = {
        "model": str(args.model),
        "gpu_layers": args.gpu_layers,
        "machine": {
            "host": platform.node(),
            "gpu": None if probe.gpu is None else probe.gpu.name,
            "gpu_offload": probe.gpu_offload,
            "integrated": integrated,
        },
        "facts": {
            k: v
            for k, v in vars(facts).items()
            if isinstance(v, (int, float, str, bool, list, tuple)) and k not in ("shards", "spans")
        },
        "modes": [],
    }
    started = time.monotonic()
    for mode in modes:
        base = {"model": {"path": str(args.model), "n_gpu_layers": args.gpu_layers, "ple_gather": mode}}
        with captured_llama_buffers() as loaded:
            model = LlamaModel(args.model, build_profile("sweep", base).model)
        ple_gpu = model.ple_mode == "gpu"
        rows = []
        debug: list[dict[str, Any]] = []
        try:
            for fa, ub, n_ctx in itertools.product(args.flash_attn.split(","), ubatches, contexts):
                context = {
                    "flash_attn": fa,
                    "n_ubatch": ub,
                    "n_batch": max(ub, 256),
                    "n_ctx": n_ctx,
                    "n_threads": 2,
                }
                profile = build_profile("sweep", {**base, "context": context})
                terms = estimate_terms(
                    profile, facts, gpu_offload=probe.gpu_offload, integrated_gpu=integrated, ple_gpu=ple_gpu
                )
                sched = (fa, str(ub), str(n_ctx)) in debug_keys and args.out is not None
                if sched:
                    os.environ["GGML_SCHED_DEBUG"] = "2"  # read when the context makes its scheduler
                try:
                    with captured_llama_buffers(logging.DEBUG if sched else logging.INFO) as got:
                        LlamaContext(model, profile.context, n_gpu_layers=args.gpu_layers).close()
                finally:
                    os.environ.pop("GGML_SCHED_DEBUG", None)
                lines = got.log
                if sched:
                    debug.append({"flash_attn": fa, "n_ubatch": ub, "n_ctx": n_ctx, "lines": lines})
                    lines = [ln for ln in lines if "buffer size" in ln or "graph" in ln or "copies" in ln]
                compared = [c for c in compare_llama_buffers(terms, got) if c.what != "weights"]  # at load
                big = [abs(c.estimate / c.measured - 1) for c in compared if c.measured >= 1 << 20]
                row: dict[str, Any] = {
                    "ple_gather": model.ple_mode,
                    "flash_attn": fa,
                    "n_ubatch": ub,
                    "n_batch": context["n_batch"],
                    "n_ctx": n_ctx,
                    "terms": [
                        {"what": c.what, "device": c.device, "estimate": c.estimate, "llama_cpp": c.measured}
                        for c in compared
                    ],
                    "all_close": all(c.close for c in compared),  # within 10%, or the log's rounding
                    "worst_off_over_1mib": max(big, default=0.0),
                }
                if args.out is not None:
                    row["buffers"] = [{"kind": k, "buffer": b, "bytes": n} for k, b, n in got.lines]
                    row["graph"] = graph_facts(lines)
                    row["estimate"] = [t.to_json() for t in terms]
                    row["log"] = lines
                rows.append(row)
        finally:
            model.close()
        entry: dict[str, Any] = {
            "ple_gather": mode,
            "ple_mode": model.ple_mode,
            "ple_reason": model.ple_reason,
            "rows": rows,
        }
        if args.out is not None:
            entry["load_log"] = loaded.log
            entry["sched_debug"] = debug
        result["modes"].append(entry)
    result["seconds"] = round(time.monotonic() - started, 1)
    if args.out is None:
        print(json.dumps(result, indent=1))
        return
    args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    for entry in result["modes"]:  # a short summary on stdout
        worst = max((r["worst_off_over_1mib"] for r in entry["rows"]), default=0.0)
        bad = [r for r in entry["rows"] if not r["all_close"]]
        n = len(entry["rows"])
        print(f"{entry['ple_mode']}: {n} contexts, {len(bad)} with a term off, worst {worst:.1%}")
        for r in bad[:8]:
            off = [
                f"{t['what']} ({t['device']}) {t['estimate'] / MIB:.2f} vs {t['llama_cpp'] / MIB:.2f} MiB"
                for t in r["terms"]
                if not BufferComparison("", "", t["estimate"], t["llama_cpp"]).close
            ]
            print(f"  fa {r['flash_attn']} ub {r['n_ubatch']} ctx {r['n_ctx']}: {'; '.join(off)}")


if __name__ == "__main__":
    main()
