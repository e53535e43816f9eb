"""`velo-chat doctor`: every field of its JSON on this (CPU) machine, its exit codes, and the
page-cache residency check on a file evicted with posix_fadvise(DONTNEED)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from velo_chat.engine.fit.residency import drop_from_page_cache
from velo_chat.engine.config import locations
from velo_chat.engine.fit import residency

from tests.support.engine_helpers import run_cli

FIELDS = {
    "llama_cpp",
    "gpu",
    "host_access",
    "pageable_memory_access",
    "cupy",
    "memory",
    "cpu",
    "profile",
    "model",
    "fit",
    "ple_residency",
    "usable",
    "problems",
    "recommendations",
}


def _profile(name: str, model: Path, extra: str = "") -> None:
    folder = locations.user_profiles_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text(f'[model]\npath = "{model}"\n{extra}', encoding="utf-8")


def test_doctor_json_has_every_field_and_the_fit_table(qwen_path: Path):
    _profile("tiny", qwen_path)
    result = run_cli("doctor", "--profile", "tiny", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    d = json.loads(result.stdout)
    assert set(d) == FIELDS
    assert {"version", "gpu_offload", "cuda", "ple_patch", "system_info"} <= set(d["llama_cpp"])
    assert d["memory"]["available"] > 0 and d["memory"]["total"] >= d["memory"]["available"]
    assert d["cpu"]["cores"] >= 1 and d["cpu"]["load1"] >= 0
    assert {"path", "cpu_separated", "others", "shared", "others_cores"} == set(d["cpu"]["cgroup"])
    assert d["model"]["ok"] and d["model"]["shards"][0]["bytes"] == qwen_path.stat().st_size
    assert d["fit"]["fits"] and "verdict: fits" in d["fit"]["table"]
    assert {t["key"] for t in d["fit"]["terms"]} >= {"weights_cpu", "ple", "kv_cpu", "rs_cpu", "compute_cpu"}
    ple = d["ple_residency"]  # the tiny model has a PLE table
    assert ple["bytes"] > 0 and 0 <= ple["resident"] <= ple["bytes"]
    assert d["usable"] and d["problems"] == []


def test_doctor_exits_1_with_the_reason_when_the_model_is_missing(tmp_path: Path):
    _profile("gone", tmp_path / "missing.gguf")
    result = run_cli("doctor", "--profile", "gone")
    assert result.returncode == 1
    assert "model file not found" in result.stdout and "NOT usable" in result.stdout


def test_doctor_exits_1_when_the_model_does_not_fit(smollm2_path: Path):
    _profile("huge", smollm2_path, "[checkpoints]\nram_budget_mib = 1048576\n")
    result = run_cli("doctor", "--profile", "huge", "--json")
    assert result.returncode == 1
    d = json.loads(result.stdout)
    assert not d["fit"]["fits"] and d["problems"] and d["problems"][0].startswith("fit: ")


def test_residency_sees_a_file_read_and_then_evicted(tmp_path: Path):
    path = tmp_path / "table.bin"
    path.write_bytes(os.urandom(4 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # written back: clean pages are what DONTNEED drops
        while os.read(fd, 1 << 20):  # read it all: in the page cache now
            pass
        whole = residency.resident(path)
        assert whole.length == 4 << 20 and whole.fraction == 1.0
        part = residency.resident(path, offset=1000, length=10_000)  # a range inside pages
        assert part.resident == 10_000
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert residency.resident(path).fraction < 0.5


def _evict(path: Path) -> None:
    drop_from_page_cache([path])


def test_warm_reads_an_evicted_range_back_with_progress(tmp_path: Path):
    path = tmp_path / "table.bin"
    path.write_bytes(os.urandom(3 << 20))
    _evict(path)
    assert residency.resident(path).fraction < 0.5
    seen: list[tuple[int, int]] = []
    after = residency.warm(path, 4096, 2 << 20, lambda done, total: seen.append((done, total)), chunk=1 << 19)
    assert after.resident == after.length == 2 << 20
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1] == (2 << 20, 2 << 20)
    assert len(seen) == 4  # 2 MiB in 512 KiB reads


def test_doctor_warm_ple_reads_the_table_into_the_page_cache(qwen_path: Path):
    _profile("tiny", qwen_path)
    _evict(qwen_path)
    result = run_cli("doctor", "--profile", "tiny", "--json", "--warm-ple")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["ple_residency"]["fraction"] == 1.0


def test_doctor_reports_a_default_model_not_downloaded_as_a_problem(bare_home: Path):
    """The embedded default model not fetched yet (a fresh machine): a finding with exit 1."""
    result = run_cli("doctor", "--json")
    assert result.returncode == 1, result.stderr
    d = json.loads(result.stdout)
    assert not d["usable"] and "not downloaded" in d["model"]["error"]


def test_busy_cores_get_advice_and_the_load_is_read(tmp_path: Path):
    from velo_chat.engine.fit.machine import LoadAverage, load_average

    assert LoadAverage(16, 3.0).busy_advice is None
    assert LoadAverage(16, 15.4).busy_advice is None
    busy = LoadAverage(16, 16.0).busy_advice
    assert busy is not None and "make -j15" in busy and "nice" in busy
    assert "make -j1" in (LoadAverage(1, 2.0).busy_advice or "")
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("7.25 6.00 5.00 9/500 1234\n")
    assert load_average(loadavg).load1 == 7.25
    assert load_average(tmp_path / "missing").load1 == 0.0


def test_doctor_says_when_the_cpu_has_more_than_the_build_uses():
    """The bootstrap builds x86_64 for x86-64-v3: on a CPU with AVX-512 or AMX, doctor says
    how to build for it, unless every layer is on the GPU; a build that has them says nothing."""
    from llama_cpp import llama_cpp as ll

    from velo_chat.app.commands.doctor import cpu_build_advice
    from velo_chat.engine.fit.machine import cpu_flags

    flags = cpu_flags()
    assert flags, "/proc/cpuinfo names this CPU's instruction sets"
    info = ll.llama_print_system_info().decode()  # this build's, e.g. "CPU : SSE3 = 1 | ..."
    built = "AVX512 = 1" in info
    wide = flags | {"avx512f"}
    advice = cpu_build_advice(wide, info, n_gpu_layers=0)
    assert (advice is None) == built
    if not built:
        assert advice is not None and "AVX-512" in advice and "NATIVE_CPU=1 make bootstrap" in advice
        assert "AMX" in (cpu_build_advice(wide | {"amx_int8"}, info, 0) or "")
    assert cpu_build_advice(wide, info, n_gpu_layers=-1) is None
    narrow = flags - {"avx512f", "amx_int8"}
    assert cpu_build_advice(narrow, info, 0) is None
    native = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | "
    assert cpu_build_advice(wide | {"amx_int8"}, native, 0) is None


def test_doctor_says_when_speculation_cannot_be_exact_for_the_weights(smollm2_path: Path, tmp_path: Path):
    """A profile that speculates exactly on the CPU with a model whose weight types round a
    verify batch (a Q4_K_M GGUF, made here by llama.cpp's quantizer) gets advice naming them and
    `velo-chat requantize`; the shipped Q4_1 model, whose batches are exact, gets none."""
    from llama_cpp import llama_cpp as ll

    k_quant = tmp_path / "smol-Q4_K_M.gguf"
    params = ll.llama_model_quantize_default_params()
    params.ftype = ll.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.allow_requantize = True
    assert ll.llama_model_quantize(str(smollm2_path).encode(), str(k_quant).encode(), params) == 0
    for name, model in (("kq", k_quant), ("q41", smollm2_path)):
        _profile(name, model, "[speculation]\nenabled = true\n")
        result = run_cli("doctor", "--profile", name, "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        advice = [
            a for a in json.loads(result.stdout)["recommendations"] if a.startswith("speculation is on")
        ]
        if name == "kq":
            assert (
                len(advice) == 1 and "Q4_K, Q6_K weights" in advice[0] and "velo-chat requantize" in advice[0]
            )
        else:
            assert advice == []


def test_spec_weights_advice_applies_only_where_requantizing_helps():
    from velo_chat.app.commands.doctor import spec_weights_advice
    from velo_chat.engine.config.profiles import build_profile

    def profile(**spec: object):
        return build_profile("p", {"speculation": {"enabled": True, **spec}})

    k = frozenset({12, 14})
    on_cpu = {"hybrid": False, "gpu_offload": False, "arch": "x86_64"}
    assert "Q4_K, Q6_K" in (spec_weights_advice(profile(), k, **on_cpu) or "")
    assert spec_weights_advice(profile(), frozenset({3, 8}), **on_cpu) is None  # exact types
    assert spec_weights_advice(profile(enabled=False), k, **on_cpu) is None
    assert spec_weights_advice(profile(allow_batch_rounding=True), k, **on_cpu) is None
    assert spec_weights_advice(profile(), k, **{**on_cpu, "hybrid": True}) is None
    assert spec_weights_advice(profile(), k, **{**on_cpu, "arch": "aarch64"}) is None
    gpu = build_profile("g", {"model": {"n_gpu_layers": -1}, "speculation": {"enabled": True}})
    assert spec_weights_advice(gpu, k, **{**on_cpu, "gpu_offload": True}) is None
    assert spec_weights_advice(gpu, k, **on_cpu) is not None  # a CPU build runs it on the CPU
