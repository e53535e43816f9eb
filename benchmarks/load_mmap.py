"""Model load time with and without mmap, from a cold and a warm page cache: prints JSON.

    .venv/bin/python benchmarks/load_mmap.py MODEL.gguf [--repeats 3] [--gpu-layers N]

"Cold" evicts the model's files from the page cache first (posix_fadvise DONTNEED, which drops
only clean pages: the file is not written to). Each time is one `LlamaModel` load: llama.cpp's
load plus velo-chat's fingerprint and chat-template preparation. On a Spark, pass
--gpu-layers -1 to time what the spark-qwen38 profile does (docs/fit.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from velo_chat.engine.config import build_profile
from velo_chat.engine.diagnostics import LlamaModel, gguf_shard_paths, install_llama_log, read_gguf_header


def evict(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpu-layers", type=int, default=0)
    args = ap.parse_args()
    install_llama_log()
    shards = gguf_shard_paths(read_gguf_header(args.model))
    results = []
    for cold in (True, False):
        for mmap in (True, False):
            profile = build_profile(
                "bench",
                {"model": {"path": str(args.model), "use_mmap": mmap, "n_gpu_layers": args.gpu_layers}},
            )
            times = []
            for _ in range(args.repeats):
                if cold:
                    evict(shards)
                t0 = time.perf_counter()
                LlamaModel(args.model, profile.model).close()
                times.append(time.perf_counter() - t0)
            results.append(
                {
                    "page_cache": "cold" if cold else "warm",
                    "use_mmap": mmap,
                    "median_ms": round(statistics.median(times) * 1000),
                    "ms": [round(t * 1000) for t in times],
                }
            )
    print(json.dumps({"model": str(args.model), "gpu_layers": args.gpu_layers, "results": results}, indent=2))


if __name__ == "__main__":
    main()
