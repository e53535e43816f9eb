"""`velo-chat doctor`: is this machine ready for the active profile? The llama.cpp build, the
GPU and its clocks, CuPy, memory and swap, the model's files, the fit table and the PLE table's
page-cache residency, with what to do about each problem. Exit 0 when usable, 1 with the reasons.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from velo_chat.engine import DefaultModelMissing, GGUFError
from velo_chat.engine.config import Profile
from velo_chat.engine.fit import (
    WARM_BELOW,
    X86_64,
    CpuGroup,
    Machine,
    ModelFacts,
    check_profile,
    cpu_flags,
    fmt,
    gpu_clocks,
    gpus,
    llama_bindings,
    load_average,
    meminfo,
    model_weight_types,
    neighbours_cores,
    probe_cpu_group,
    read_facts,
    resident,
    warm_page_cache,
    weight_rounding,
)
from velo_chat.engine.setup import resolve_model_path
from velo_chat.kernels import cudart

from .common import resolve_profile

log = logging.getLogger(__name__)

PLE_SYMBOL = "llama_model_set_ple_provider"  # the velo-chat PLE patch (packaging/patches)


def _build() -> dict[str, Any]:
    ll = llama_bindings()  # our log first: the system info starts CUDA, which logs a banner
    import llama_cpp

    lib = ll._lib
    info = ll.llama_print_system_info().decode("utf-8", errors="replace")
    return {
        "version": llama_cpp.__version__,
        "gpu_offload": bool(ll.llama_supports_gpu_offload()),
        "cuda": "CUDA" in info or hasattr(lib, "ggml_backend_cuda_init"),
        "ple_patch": hasattr(lib, PLE_SYMBOL),
        "system_info": info.strip(" |"),
    }


NATIVE_ADVICE = (
    "this CPU has {extra}, which the x86-64-v3 build leaves unused: `NATIVE_CPU=1 make "
    "bootstrap` builds for it (prefill and layers on the CPU gain; packaging/README.md)"
)


def cpu_build_advice(flags: frozenset[str], system_info: str, n_gpu_layers: int) -> str | None:
    """Advice where the CPU runs instructions the llama.cpp build was not made for (the
    bootstrap targets x86-64-v3 on x86_64: no AVX-512, no AMX) and the profile keeps layers
    on the CPU; None otherwise (every layer on the GPU: the CPU's part is an embedding row)."""
    if n_gpu_layers == -1:
        return None
    # "CPU : SSE3 = 1 | AVX2 = 1 | ..." (a CUDA build puts "CUDA : ARCHS = 900 | ..." first)
    parts = (part.split(":")[-1].strip() for part in system_info.split("|"))
    built = {part.split("=")[0].strip() for part in parts if part.endswith("= 1")}
    extra = []
    if "avx512f" in flags and "AVX512" not in built:
        extra.append("AVX-512")
    if "amx_int8" in flags and "AMX_INT8" not in built:
        extra.append("AMX")
    return NATIVE_ADVICE.format(extra=" and ".join(extra)) if extra else None


def spec_weights_advice(
    profile: Profile, weight_types: frozenset[int], *, hybrid: bool, gpu_offload: bool, arch: str
) -> str | None:
    """Advice where the profile speculates on the CPU, exactly, but the model's weight types
    make a CPU verify batch round otherwise than one token (docs/speculation.md), so the
    engine will not draft: a Q8_0 copy is exact. None where it does not apply (speculation
    off or rounding allowed, layers on a GPU, a hybrid model (its recurrence rounds whatever
    the weights), another CPU: nothing measured to offer)."""
    spec = profile.speculation
    if not spec.enabled or spec.allow_batch_rounding or hybrid or arch not in X86_64:
        return None
    if gpu_offload and profile.model.n_gpu_layers != 0:
        return None
    why = weight_rounding(weight_types)
    if not why:
        return None
    return f"speculation is on but will not draft: {why} (or set speculation.allow_batch_rounding = true)"


def _host_access() -> dict[str, Any] | None:
    """What the GPU can do with host memory (`cudaDevAttrPageableMemoryAccess`: ATS/HMM, the
    GPU reads mmap'd memory in place; host registration), or None without a usable CUDA GPU."""
    if not cudart.cuda_available():
        return None
    try:
        return cudart.host_access().as_dict()
    except Exception as exc:  # noqa: BLE001 - an old driver, a GPU in a bad state
        return {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}


def _cupy() -> dict[str, Any]:
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - not installed, or its CUDA libraries missing
        return {"installed": False, "version": None, "nvrtc": False, "error": str(exc).splitlines()[0]}
    out: dict[str, Any] = {"installed": True, "version": cupy.__version__, "nvrtc": False, "error": None}
    try:
        kernel = cupy.RawKernel(
            'extern "C" __global__ void velo_probe(float *x) { x[0] = 1.0f; }', "velo_probe"
        )
        kernel.compile()
        out["nvrtc"] = True
    except Exception as exc:  # noqa: BLE001 - no GPU, no NVRTC, an arch NVRTC does not know
        out["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return out


def collect(profile_name: str | None, warm: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Everything doctor reports, as one JSON-able dict (every key always present). `warm`:
    read the PLE table into the page cache first, reporting (bytes done, total) to it."""
    profile = resolve_profile(profile_name)
    build = _build()
    found_gpus = gpus()
    machine = Machine(meminfo(), build["gpu_offload"], found_gpus[0] if found_gpus else None)
    clocks = gpu_clocks() if found_gpus else []
    load = load_average()
    group = probe_cpu_group()
    neighbours = neighbours_cores() if load.busy_advice else None
    cpu = {
        "cores": load.cores,
        "load1": load.load1,
        "cgroup": {**group.to_json(), "others_cores": neighbours},
    }
    out: dict[str, Any] = {
        **_machine(build, machine, cpu, clocks[0].to_json() if clocks else None),
        "profile": profile.name,
        "model": {"path": None, "shards": [], "ok": False, "error": None},
        "fit": None,
        "ple_residency": None,
    }
    problems: list[str] = []
    advice = _machine_advice(profile, build, machine, load.busy_advice, group, neighbours)
    if clocks and clocks[0].cap is not None:
        advice.append(f"the GPU's clock is held below its maximum: {clocks[0].describe()}")
    if profile.backend.kind == "remote":
        out["model"]["error"] = f"a remote server ({profile.backend.base_url}) runs the model"
        advice.append("a remote profile: the server's machine is not checked here")
    else:
        _check_model(profile, machine, warm, out, problems, advice)
    return _finish(out, problems, advice)


def _machine(
    build: dict[str, Any], machine: Machine, cpu: dict[str, Any], clocks: dict[str, Any] | None
) -> dict[str, Any]:
    """The machine's part of the report: the llama.cpp build, the GPU (and its clocks, None
    where nvidia-smi gave none), memory and the CPU."""
    gpu, mem = machine.gpu, machine.mem
    host = _host_access() if build["cuda"] else None
    return {
        "llama_cpp": build,
        "gpu": None
        if gpu is None
        else {
            "name": gpu.name,
            "driver": gpu.driver,
            "total": gpu.total,
            "free": gpu.free,
            "integrated": gpu.integrated,
            "clocks": clocks,
        },
        "host_access": host,
        "pageable_memory_access": None if host is None else host.get("pageable_memory_access"),
        "cupy": _cupy()
        if build["cuda"]
        else {"installed": None, "version": None, "nvrtc": None, "error": "no CUDA"},
        "memory": {
            "total": mem.total,
            "available": mem.available,
            "swap_total": mem.swap_total,
            "swap_free": mem.swap_free,
        },
        "cpu": cpu,
    }


def _machine_advice(
    profile: Profile,
    build: dict[str, Any],
    machine: Machine,
    busy_advice: str | None,
    group: CpuGroup,
    neighbours: float | None,
) -> list[str]:
    """What to change on this machine (or in its llama.cpp build) for the profile:
    `busy_advice` is the load average's, `neighbours` the cores the cgroup's other processes
    use (None: not measured)."""
    gpu, mem = machine.gpu, machine.mem
    advice: list[str] = []
    if busy_advice:
        advice.append(busy_advice)
        if group.path is not None and (neighbours is None or neighbours >= 0.5):
            advice.append(SHARED_GROUP_ADVICE)
    if profile.model.n_gpu_layers != 0 and not build["gpu_offload"]:
        advice.append(
            "this llama.cpp build is CPU-only: n_gpu_layers is ignored (packaging/ builds a CUDA one)"
        )
    native = cpu_build_advice(cpu_flags(), build["system_info"], profile.model.n_gpu_layers)
    if native and profile.backend.kind != "remote":
        advice.append(native)
    if gpu is not None and gpu.integrated and mem.swap_total:
        advice.append(
            "swap is on: on unified memory a model that overflows swaps instead of failing (swapoff -a)"
        )
    return advice


def _check_model(
    profile: Profile,
    machine: Machine,
    warm: Callable[[int, int], None] | None,
    out: dict[str, Any],
    problems: list[str],
    advice: list[str],
) -> None:
    """The model's part of the report, into `out`, `problems` and `advice`: its files, its
    weight types for speculation, whether it fits, and its PLE table in the page cache."""
    try:
        path = resolve_model_path(profile)
        facts = read_facts(path)
    except (GGUFError, OSError, ValueError, DefaultModelMissing) as exc:  # a finding, not a crash
        out["model"]["error"] = str(exc).splitlines()[0]
        problems.append(f"model: {out['model']['error']}")
        return
    out["model"] = {
        "path": str(path),
        "shards": [{"path": str(s.path), "present": s.path.exists(), "bytes": s.size} for s in facts.shards],
        "ok": True,
        "error": None,
    }
    spec = spec_weights_advice(
        profile,
        model_weight_types(path),
        hybrid=facts.hybrid,
        gpu_offload=machine.gpu_offload,
        arch=platform.machine(),
    )
    if spec:
        advice.append(spec)
    found = check_profile(profile, path, machine)
    out["fit"] = found.to_json()
    out["fit"]["table"] = found.table()
    if not found.fits:
        problems.append(f"fit: {found.summary()}")
        advice.extend(f"to fit: {s}" for s in found.suggestions)
    elif found.page_cache and not found.cache_fits:
        advice.append(
            "the PLE table cannot stay in the page cache beside the rest: decode will read it from disk"
        )
    if facts.ple_bytes and facts.ple_shard is not None:
        _check_ple(facts.ple_shard, facts, warm, out, advice)


def _check_ple(
    shard: Path,
    facts: ModelFacts,
    warm: Callable[[int, int], None] | None,
    out: dict[str, Any],
    advice: list[str],
) -> None:
    """How much of the PLE table (in `shard`) is in the page cache (`warm`: read it in first)."""
    if warm is not None:
        warm_page_cache(shard, facts.ple_offset, facts.ple_bytes, warm)
    res = resident(shard, facts.ple_offset, facts.ple_bytes)
    out["ple_residency"] = res.to_json()
    if res.fraction < WARM_BELOW:
        advice.append(
            f"the PLE table is {res.fraction:.0%} in the page cache: the first turns read it from "
            "disk (`velo-chat doctor --warm-ple` reads it in)"
        )


SHARED_GROUP_ADVICE = (
    "busy processes share velo-chat's cgroup, so their threads compete with its decode thread "
    "one for one; in a cgroup of its own (its own terminal tab on a desktop, or "
    "`systemd-run --user --scope velo-chat`) it keeps most of a core beside the same load"
)


def _group_fields(j: dict[str, Any]) -> dict[str, Any]:
    return {k: j[k] for k in ("path", "cpu_separated", "others")}


def _finish(out: dict[str, Any], problems: list[str], advice: list[str]) -> dict[str, Any]:
    out["usable"] = not problems
    out["problems"] = problems
    out["recommendations"] = advice
    return out


def _text(d: dict[str, Any]) -> str:
    b = d["llama_cpp"]
    kind = "CUDA" if b["cuda"] else "CPU"
    lines = [
        f"llama.cpp      {b['version']} ({kind} build, PLE patch {'yes' if b['ple_patch'] else 'no'})",
        f"               {b['system_info']}",
    ]
    g = d["gpu"]
    if g is None:
        lines.append("GPU            none found (nvidia-smi)")
    else:
        mem = "unified memory" if g["integrated"] else f"{fmt(g['free'] or 0)} free of {fmt(g['total'] or 0)}"
        lines.append(f"GPU            {g['name']}, driver {g['driver']}, {mem}")
    lines.append(f"GPU clock      {_clock_line(g)}")
    if d["pageable_memory_access"] is not None:
        lines.append(f"pageable mem   {'yes (ATS/HMM)' if d['pageable_memory_access'] else 'no'}")
    c = d["cupy"]
    if c["installed"] is not None:
        cupy = (
            f"{c['version']}, NVRTC {'compiles' if c['nvrtc'] else 'fails'}"
            if c["installed"]
            else "not installed"
        )
        lines.append(f"CuPy           {cupy}" + (f" ({c['error']})" if c["error"] and c["installed"] else ""))
    m = d["memory"]
    lines.append(
        f"memory         {fmt(m['available'])} available of {fmt(m['total'])}; swap "
        + (f"{fmt(m['swap_free'])} free of {fmt(m['swap_total'])}" if m["swap_total"] else "off")
    )
    lines.append(f"CPU            {d['cpu']['cores']} cores, load {d['cpu']['load1']:.2f} (1 min)")
    cg = d["cpu"]["cgroup"]
    busy = (
        f"; its other processes used {cg['others_cores']:.2f} cores" if cg["others_cores"] is not None else ""
    )
    lines.append(f"cgroup         {CpuGroup(**_group_fields(cg)).describe()}{busy}")
    lines.append(f"profile        {d['profile']}")
    model = d["model"]
    if model["ok"]:
        for s in model["shards"]:
            lines.append(f"model file     {s['path']} ({fmt(s['bytes'])})")
    else:
        lines.append(f"model          {model['error']}")
    if d["fit"] is not None:
        lines.append(d["fit"]["table"])
    r = d["ple_residency"]
    if r is not None:
        lines.append(
            f"PLE table      {r['fraction']:.0%} in the page cache "
            f"({fmt(r['resident'])} of {fmt(r['bytes'])})"
        )
    lines.extend(f"problem: {p}" for p in d["problems"])
    lines.extend(f"advice:  {a}" for a in d["recommendations"])
    lines.append("usable" if d["usable"] else "NOT usable")
    return "\n".join(lines)


def _clock_line(gpu: dict[str, Any] | None) -> str:
    if gpu is None:
        return "none: no GPU is present"
    return str(gpu["clocks"]["summary"]) if gpu["clocks"] else "not reported (nvidia-smi)"


class _WarmProgress:
    """`warming the PLE table  45%  1.21 GiB/s` on stderr, when it is a terminal."""

    def __init__(self) -> None:
        self.show = sys.stderr.isatty()
        self.t0 = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if not self.show:
            return
        rate = done / max(time.monotonic() - self.t0, 1e-6)
        sys.stderr.write(f"\rwarming the PLE table {done / total:4.0%}  {fmt(rate)}/s")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.show:
            sys.stderr.write("\r\033[K")


def run(args: argparse.Namespace) -> int:
    progress = _WarmProgress() if args.warm_ple else None
    try:
        d = collect(args.doctor_profile or args.profile, progress)
    finally:
        if progress is not None:
            progress.finish()
    print(json.dumps(d, indent=2) if args.json else _text(d))
    return 0 if d["usable"] else 1
