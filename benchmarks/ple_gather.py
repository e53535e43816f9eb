"""PLE gather: the stock CPU-gather-and-copy pattern against the in-place GPU kernel.

Prints one JSON object (and writes it to --json-out). Not a test; run on a CUDA machine:

    python benchmarks/ple_gather.py --table /tmp/ple_big.gguf --json-out ple_gather.json

The table is an IQ4_NL tensor of 160-value rows (as in Qwen3.8-Flash-Next) of >= 8 GiB, created
(and filled with random bytes) if missing. Per token (16 rows) and per 512-token batch (8192 rows):

  a_stock        CPU gather + dequant (C, OpenMP, as ggml's get_rows) into a pinned buffer,
                 cudaMemcpyAsync H2D, stream sync: what llama.cpp does today;
  a_stock_graph  the same, then the model's compute (a CUDA graph of a dummy consumer) + sync;
  b_inplace      the in-place gather kernel (row ids read from pinned memory) + sync;
  b_inplace_copy_ids  the same with the row ids copied H2D first;
  b_staged       CPU raw-row gather into pinned memory, H2D copy, dequant kernel + sync;
  c_graph        one CUDA graph: in-place gather + dummy consumer, replay + sync;
  c_graph_copy_ids / c_graph_staged  the graph forms of the two variants above;
  c_graph_hash   a graph fed with token ids: GPU hash, in-place gather, consumer;
  graph_dummy    the consumer graph alone (subtract it to get the PLE share of c_*);
  kernel_gpu_us  GPU time of one gather kernel (graph of 50, CUDA events): whole table, a
                 64 MiB window, and that window in device memory.
Times are host wall-clock microseconds per iteration (median, p10, p90), each iteration ending in a
stream synchronize, with row sets rotated over random rows of the whole table.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: devkit/, benchmarks/
from benchmarks._cpu_gather import load_cpu_gather  # noqa: E402
from devkit.ple_reference import gather_dequant, random_table, write_single_tensor_gguf  # noqa: E402

log = logging.getLogger("ple_gather")
PLE = "per_layer_token_embd.weight"
ROW_DIM, N_HEADS = 160, 16


def make_table(path: Path, n_rows: int) -> None:
    """Write the GGUF and fill it with a tiled 64 MiB random chunk (random data, fast to write)."""
    from velo_chat.kernels.dequant import GGML_TYPE_IQ4_NL

    loc = write_single_tensor_gguf(path, PLE, GGML_TYPE_IQ4_NL, (ROW_DIM, n_rows))
    rng = np.random.default_rng(1)
    rb = loc.row_bytes
    chunk_rows = (64 << 20) // rb
    chunk = random_table(GGML_TYPE_IQ4_NL, chunk_rows, ROW_DIM, rng).tobytes()
    t0 = time.perf_counter()
    with open(path, "r+b") as f:
        f.seek(loc.offset)
        left = loc.nbytes
        while left > 0:
            f.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
    log.info("wrote %.2f GiB table in %.1f s", loc.nbytes / 2**30, time.perf_counter() - t0)


def stats(samples_ns: list[int]) -> dict[str, float]:
    a = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return {
        "median": round(float(np.median(a)), 2),
        "p10": round(float(np.percentile(a, 10)), 2),
        "p90": round(float(np.percentile(a, 90)), 2),
        "n": int(a.size),
    }


def timeit(fn: Callable[[int], None], iters: int, warmup: int) -> dict[str, float]:
    for i in range(warmup):
        fn(i)
    out = []
    for i in range(iters):
        t0 = time.perf_counter_ns()
        fn(i)
        out.append(time.perf_counter_ns() - t0)
    return stats(out)


def run_case(table: Any, n_tokens: int, iters: int, rng: np.random.Generator) -> dict[str, Any]:
    import cupy
    import cupyx

    from velo_chat.kernels.cuda_kernels import DeviceHashSpec, GatherLaunch, kernel
    from velo_chat.kernels.ple_hash import PleHashSpec, ple_rows

    gather_c, gather_raw_c = load_cpu_gather()
    n_out = n_tokens * N_HEADS
    n_sets = 64 if n_tokens > 1 else 2048
    row_sets = rng.integers(0, table.n_rows, size=(n_sets, n_tokens, N_HEADS)).astype(np.int32)
    row_ptrs = [row_sets[k].ctypes.data for k in range(n_sets)]
    rb, host = table.row_bytes, table.host
    host_ptr = host.ctypes.data
    s = cupy.cuda.Stream(non_blocking=True)
    sp = s.ptr
    shape = (n_tokens, N_HEADS * ROW_DIM)
    out = cupy.empty(shape, dtype=cupy.float32)
    pinned_out = cupyx.empty_pinned(shape, dtype=np.float32)
    pageable_out = np.empty(shape, dtype=np.float32)
    idx_pinned = cupyx.empty_pinned(n_out, dtype=np.int32)
    idx_dev = cupy.empty(n_out, dtype=cupy.int32)
    raw_pinned = cupyx.empty_pinned((n_out, rb), dtype=np.uint8)
    raw_dev = cupy.empty((n_out, rb), dtype=cupy.uint8)
    err = cupy.zeros(3, dtype=cupy.int32)
    out_p, idx_pin_p, idx_dev_p = out.data.ptr, idx_pinned.ctypes.data, idx_dev.data.ptr
    raw_pin_p, raw_dev_p = raw_pinned.ctypes.data, raw_dev.data.ptr
    pin_out_p, page_out_p = pinned_out.ctypes.data, pageable_out.ctypes.data
    n_blocks = max(1, min(264, (n_out * ROW_DIM) // 4096))
    y = cupy.empty(n_blocks, dtype=cupy.float32)
    consumer, consumer_args = kernel("dummy_consumer"), (out, np.int64(out.size), y)
    memcpy = cupy.cuda.runtime.memcpyAsync
    nbytes_out = n_out * ROW_DIM * 4
    dev_ptr, n_rows, gtype = table.device_ptr, table.n_rows, table.ggml_type
    inplace_zc = GatherLaunch(dev_ptr, n_rows, gtype, ROW_DIM, idx_pin_p, n_out, out, err)  # zero-copy ids
    inplace = GatherLaunch(dev_ptr, n_rows, gtype, ROW_DIM, idx_dev, n_out, out, err)
    staged = GatherLaunch(raw_dev_p, n_out, gtype, ROW_DIM, None, n_out, out, err)

    def consume() -> None:
        consumer((n_blocks,), (256,), consumer_args, stream=s)

    def a_stock(i: int, dst: int = pin_out_p) -> None:
        gather_c(host_ptr, rb, ROW_DIM, row_ptrs[i % n_sets], n_out, dst)
        memcpy(out_p, dst, nbytes_out, 1, sp)
        s.synchronize()

    def feed_idx(i: int) -> None:
        ctypes.memmove(idx_pin_p, row_ptrs[i % n_sets], n_out * 4)

    def feed_raw(i: int) -> None:
        gather_raw_c(host_ptr, rb, row_ptrs[i % n_sets], n_out, raw_pin_p)

    def b_inplace(i: int) -> None:  # ids read by the kernel from pinned memory
        feed_idx(i)
        inplace_zc(sp)
        s.synchronize()

    def b_inplace_copy_ids(i: int) -> None:  # ids copied to the device first
        feed_idx(i)
        memcpy(idx_dev_p, idx_pin_p, n_out * 4, 1, sp)
        inplace(sp)
        s.synchronize()

    def b_staged(i: int) -> None:
        feed_raw(i)
        memcpy(raw_dev_p, raw_pin_p, n_out * rb, 1, sp)
        staged(sp)
        s.synchronize()

    def capture(*steps: Callable[[], None]) -> Any:
        s.begin_capture()
        for step in steps:
            step()
        return s.end_capture()

    def copy_ids() -> None:
        memcpy(idx_dev_p, idx_pin_p, n_out * 4, 1, sp)

    def copy_raw() -> None:
        memcpy(raw_dev_p, raw_pin_p, n_out * rb, 1, sp)

    # GPU hash from the token ids of one sequence; 16 heads (n-gram orders 2..5) over the table
    spec = PleHashSpec(
        ngram_size=5,
        heads_per_ngram=4,
        eos_token_id=0,
        layer_multipliers=tuple(int(x) for x in rng.integers(1, 2**63, size=5)),
        head_offsets=tuple(h * (n_rows // 16) for h in range(16)),
        head_vocab_sizes=(n_rows // 16,) * 16,
    )
    n_seq = n_tokens + spec.n_prev
    tok_sets = rng.integers(1, 150_000, size=(n_sets, n_seq)).astype(np.int32)
    tok_pinned = cupyx.empty_pinned(n_seq, dtype=np.int32)
    hash_zc = DeviceHashSpec(spec).launch(tok_pinned.ctypes.data, None, spec.n_prev, n_tokens, idx_dev)

    def feed_tok(i: int) -> None:
        tok_pinned[:] = tok_sets[i % n_sets]

    g_dummy = capture(consume)
    g_inplace = capture(lambda: inplace_zc(sp), consume)
    g_copy_ids = capture(copy_ids, lambda: inplace(sp), consume)
    g_staged = capture(copy_raw, lambda: staged(sp), consume)
    g_hash = capture(lambda: hash_zc(sp), lambda: inplace(sp), consume)

    def graph_run(g: Any, feed: Callable[[int], None] | None = None) -> Callable[[int], None]:
        def run(i: int) -> None:
            if feed:
                feed(i)
            g.launch(s)
            s.synchronize()

        return run

    def a_stock_graph(i: int) -> None:
        a_stock(i)
        g_dummy.launch(s)
        s.synchronize()

    # every path must reproduce the reference bit for bit before it is timed
    ref = gather_dequant(host, gtype, ROW_DIM, row_sets[0])
    bits = ref.view(np.uint32)
    a_stock(0)
    assert np.array_equal(out.get().view(np.uint32), bits), "stock path != reference"
    for name, fn in (
        ("b_inplace", b_inplace),
        ("b_inplace_copy_ids", b_inplace_copy_ids),
        ("b_staged", b_staged),
        ("c_graph", graph_run(g_inplace, feed_idx)),
        ("c_graph_copy_ids", graph_run(g_copy_ids, feed_idx)),
        ("c_graph_staged", graph_run(g_staged, feed_raw)),
    ):
        out.fill(0)
        fn(0)
        assert np.array_equal(out.get().view(np.uint32), bits), f"{name} != reference"
    graph_run(g_hash, feed_tok)(3)
    want = gather_dequant(
        host, gtype, ROW_DIM, ple_rows(spec, tok_sets[3][spec.n_prev :], tok_sets[3][: spec.n_prev])
    )
    assert np.array_equal(out.get().view(np.uint32), want.view(np.uint32)), "c_graph_hash != reference"

    warm = max(20, iters // 10)
    res: dict[str, Any] = {
        "n_tokens": n_tokens,
        "rows": n_out,
        "bytes_gathered": n_out * rb,
        "bytes_out_f32": nbytes_out,
    }
    timed = {
        "a_stock": a_stock,
        "a_stock_pageable_dst": lambda i: a_stock(i, page_out_p),
        "a_cpu_gather_only": lambda i: gather_c(
            host_ptr, rb, ROW_DIM, row_ptrs[i % n_sets], n_out, pin_out_p
        ),
        "b_inplace": b_inplace,
        "b_inplace_copy_ids": b_inplace_copy_ids,
        "b_staged": b_staged,
        "graph_dummy": graph_run(g_dummy),
        "a_stock_graph": a_stock_graph,
        "c_graph": graph_run(g_inplace, feed_idx),
        "c_graph_copy_ids": graph_run(g_copy_ids, feed_idx),
        "c_graph_hash": graph_run(g_hash, feed_tok),
        "c_graph_staged": graph_run(g_staged, feed_raw),
    }
    for name, fn in timed.items():
        res[name] = timeit(fn, iters, warm)
    assert not int(err.get()[0]), "a timed gather saw an out-of-range row"
    res["kernel_gpu_us"] = kernel_times(table, n_tokens, rng, out, err, s)
    dummy = res["graph_dummy"]["median"]
    res["ple_share_c_graph_us"] = round(res["c_graph"]["median"] - dummy, 2)
    res["ple_share_a_stock_graph_us"] = round(res["a_stock_graph"]["median"] - dummy, 2)
    return res


def kernel_times(
    table: Any, n_tokens: int, rng: np.random.Generator, out: Any, err: Any, s: Any
) -> dict[str, Any]:
    """GPU time of one gather kernel (a graph of 50 back-to-back gathers, timed with events),
    for rows spread over the whole table, rows within a 64 MiB window of it, and the same window
    copied to device memory: separates PCIe latency, GPU TLB misses on host pages, and the kernel."""
    import cupy

    from velo_chat.kernels.cuda_kernels import GatherLaunch

    n_out, reps = n_tokens * N_HEADS, 50
    window = (64 << 20) // table.row_bytes
    dev_window = cupy.asarray(table.host[:window])
    cases = {
        "host_random_whole_table": (table.device_ptr, table.n_rows),
        "host_64MiB_window": (table.device_ptr, window),
        "device_64MiB_window": (dev_window.data.ptr, window),
    }
    res: dict[str, Any] = {}
    for name, (ptr, span) in cases.items():
        ids = cupy.asarray(rng.integers(0, span, size=(reps, n_out)).astype(np.int32))
        plans = [
            GatherLaunch(ptr, span, table.ggml_type, ROW_DIM, ids[k], n_out, out, err) for k in range(reps)
        ]
        s.begin_capture()
        for p in plans:
            p(s.ptr)
        g = s.end_capture()
        g.launch(s)
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(5):
            e0.record(s)
            g.launch(s)
            e1.record(s)
            e1.synchronize()
            times.append(cupy.cuda.get_elapsed_time(e0, e1) * 1e3 / reps)
        us = float(np.median(times))
        res[name] = {"us": round(us, 2), "GBps": round(n_out * table.row_bytes / (us * 1e3), 2)}
    return res


def calibrate(iters: int) -> dict[str, Any]:
    import cupy

    from velo_chat.kernels.cuda_kernels import _Launch, kernel

    s = cupy.cuda.Stream(non_blocking=True)
    x, y = cupy.zeros(256, cupy.float32), cupy.zeros(1, cupy.float32)
    k, args = kernel("dummy_consumer"), (x, np.int64(256), y)
    prepared = _Launch(
        "dummy_consumer", 256, [ctypes.c_uint64(x.data.ptr), ctypes.c_int64(256), ctypes.c_uint64(y.data.ptr)]
    )

    def cupy_launch_sync(i: int) -> None:
        k((1,), (256,), args, stream=s)
        s.synchronize()

    def ctypes_launch_sync(i: int) -> None:
        prepared(s.ptr)
        s.synchronize()

    return {
        "sync_idle_stream": timeit(lambda i: s.synchronize(), iters, 50),
        "tiny_kernel_cupy_launch_and_sync": timeit(cupy_launch_sync, iters, 50),
        "tiny_kernel_prepared_launch_and_sync": timeit(ctypes_launch_sync, iters, 50),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=Path, default=Path(tempfile.gettempdir()) / "ple_big.gguf")
    ap.add_argument("--rows", type=int, default=96_000_000, help="table rows if it must be made (x90 B)")
    ap.add_argument("--make-table-only", action="store_true")
    ap.add_argument("--mode", default="auto", choices=["auto", "pageable", "registered", "staged"])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    if not args.table.exists():
        make_table(args.table, args.rows)
    if args.make_table_only:
        return 0

    import cupy

    from velo_chat.engine.diagnostics import locate_tensor
    from velo_chat.kernels.ple_table import PleTable

    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    result: dict[str, Any] = {
        "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "cupy": cupy.__version__,
        "cpu_gather_impl": "c-openmp",
        "cpu_threads": os.cpu_count(),
    }
    try:
        result["nvidia_smi"] = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=driver_version,clocks.sm,clocks.mem,pcie.link.gen.current,"
                "pcie.link.width.current",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    t0 = time.perf_counter()
    with PleTable(locate_tensor(args.table, PLE), mode=args.mode, max_register_fraction=0.9) as table:
        result["table_open_s"] = round(time.perf_counter() - t0, 2)
        result["table"] = table.describe()
        result["calibration_us"] = calibrate(args.iters)
        result["per_token"] = run_case(table, 1, args.iters, rng)
        result["batch_64"] = run_case(table, 64, max(50, args.iters // 4), rng)  # the staging threshold
        result["batch_512"] = run_case(table, 512, max(50, args.iters // 10), rng)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        args.json_out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
