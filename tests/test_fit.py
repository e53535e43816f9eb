"""The fit check: its estimate against what llama.cpp really allocates (the buffer sizes it logs)
for SmolLM2 and the tiny qwen4exp on the CPU, and on the GPU machine with every layer offloaded
(stock and GPU PLE gather), term by term within 10%; a profile that cannot fit refused by the
CLI with its table (exit 2) and loaded with --force."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import pytest

from velo_chat.engine import DoesNotFit
from velo_chat.engine.config import locations
from velo_chat.engine.engine import Engine
from velo_chat.engine.fit import estimate, llama_buffers, machine, report
from velo_chat.engine.fit.model_facts import read_facts
from velo_chat.engine.llama.gguf_file import GGUFError
from velo_chat.engine.llama.context import LlamaContext
from velo_chat.engine.llama.model import LlamaModel
from velo_chat.engine.diagnostics import diagnostics

from tests.support.engine_helpers import run_cli, test_profile
from devkit.gguf_split import split_gguf

CASES = {
    "smol-test": ("smol", {}),
    "smol-long-nofa-nommap": (
        "smol",
        {
            "context": {"n_ctx": 8192, "n_batch": 512, "n_ubatch": 512, "flash_attn": "off"},
            "model": {"use_mmap": False},
        },
    ),
    "smol-q8-kv": (
        "smol",
        {"context": {"n_ctx": 4096, "type_k": "q8_0", "type_v": "q8_0", "flash_attn": "on"}},
    ),
    "qwen-test": ("qwen", {}),
    "qwen-lazy-nofa": (
        "qwen",
        {"context": {"n_ctx": 8192, "n_ubatch": 256, "flash_attn": "off"}, "model": {"lazy_ple": "on"}},
    ),
    "qwen-long": ("qwen", {"context": {"n_ctx": 16384, "n_batch": 512, "n_ubatch": 512}}),
}


@pytest.fixture
def model_path(request) -> Path:
    # each model's fixture only when asked for: the GPU machine has the tiny qwen4exp but no SmolLM2
    return request.getfixturevalue("smollm2_path" if request.param == "smol" else "qwen_path")


def _measure(model_path: Path, profile) -> llama_buffers.Buffers:
    """Load the model and make a context, keeping the buffer sizes llama.cpp logs."""
    return _measure_with_mode(model_path, profile)[0]


def _measure_with_mode(model_path: Path, profile) -> tuple[llama_buffers.Buffers, str]:
    """The buffer sizes, and the PLE gather the load took ("gpu" or "stock")."""
    with llama_buffers.captured() as got:
        model = LlamaModel(model_path, profile.model)
        try:
            LlamaContext(model, profile.context, n_gpu_layers=profile.model.n_gpu_layers).close()
        finally:
            model.close()
    return got, model.ple_mode


@pytest.mark.parametrize(
    ("model_path", "sections"), list(CASES.values()), ids=list(CASES), indirect=["model_path"]
)
def test_each_term_is_within_ten_percent_of_what_llama_cpp_allocates(model_path: Path, sections: dict):
    profile = test_profile(
        model_path,
        model={"n_gpu_layers": 0, **sections.get("model", {})},
        **{k: v for k, v in sections.items() if k != "model"},
    )
    facts = read_facts(model_path)
    # a CUDA build runs large micro-batches on the GPU even with no layer there (op offload)
    gpu_offload = machine.probe().gpu_offload
    terms = estimate.estimate(profile, facts, gpu_offload=gpu_offload)
    got = _measure(model_path, profile)

    compared = {(c.what, c.device): c for c in llama_buffers.compare(terms, got)}
    want = {"weights", "KV", "output", "compute"} | ({"recurrent"} if facts.hybrid else set())
    want_gpu = {"compute"} if gpu_offload else set()
    # a term for every buffer, a buffer for every term
    assert set(compared) == {(w, "CPU") for w in want} | {(w, "GPU") for w in want_gpu}, got.lines
    for c in compared.values():
        assert c.close, c.describe()
    ple = next((t for t in terms if t.key == "ple"), None)
    if ple is not None and ple.place == estimate.CACHE:  # the lazy table has its own mapping
        assert any(llama_buffers.Comparison("ple", "CPU", ple.bytes, n).close for n in got.sizes("model"))


# What llama.cpp's CUDA build allocated for the tiny qwen4exp with `n_gpu_layers = 0` on an
# H100 (2026-12-07, docs/results/scale.md): the GPU's compute buffer and the pinned host one, MiB.
OP_OFFLOAD_ON_AN_H100 = {
    "qwen-test": (3.02, 0.45),
    "qwen-lazy-nofa": (51.59, 10.36),
    "qwen-long": (89.68, 24.59),
}


@pytest.mark.parametrize("case", list(OP_OFFLOAD_ON_AN_H100))
def test_with_no_layer_on_the_gpu_a_cuda_build_still_computes_there(qwen_path: Path, case: str):
    """Checked here against what a CUDA build allocated (the table above), so that a machine
    without a GPU keeps the op-offload terms right; the GPU machine checks them live in
    `test_each_term_is_within_ten_percent_of_what_llama_cpp_allocates`."""
    sections = CASES[case][1]
    profile = test_profile(
        qwen_path,
        model={"n_gpu_layers": 0, **sections.get("model", {})},
        **{k: v for k, v in sections.items() if k != "model"},
    )
    terms = {t.key: t for t in estimate.estimate(profile, read_facts(qwen_path), gpu_offload=True)}
    gpu, host = OP_OFFLOAD_ON_AN_H100[case]
    for key, measured in (("compute_gpu", gpu), ("compute_cpu", host)):
        got = terms[key].bytes / 2**20
        assert abs(got - measured) <= 0.1 * measured, (key, got, measured, terms[key].formula)
    assert terms["compute_gpu"].place == estimate.GPU and "cuda" in terms
    # without a GPU in the build, the same profile computes on the CPU only
    cpu_only = {t.key: t for t in estimate.estimate(profile, read_facts(qwen_path))}
    assert "compute_gpu" not in cpu_only and "cuda" not in cpu_only


# SmolLM2 ties its output head to `token_embd` (no `output.weight`): the logits' product reads
# that table, the largest weight a product reads. What the CUDA build allocated on the GPU with
# `n_gpu_layers = 0` on an H100 (2026-12-07, docs/results/scale.md), MiB.
TIED_HEAD_OP_OFFLOAD_ON_AN_H100 = {"smol-test": 41.87, "smol-q8-kv": 41.87}


@pytest.mark.parametrize("case", list(TIED_HEAD_OP_OFFLOAD_ON_AN_H100))
def test_a_tied_output_head_is_the_weight_an_offloaded_batch_copies(smollm2_path: Path, case: str):
    sections = CASES[case][1]
    profile = test_profile(smollm2_path, model={"n_gpu_layers": 0}, **sections)
    facts = read_facts(smollm2_path)
    assert facts.largest_matmul[1:] == (facts.n_embd, 49152)  # token_embd, read by the head
    terms = {t.key: t for t in estimate.estimate(profile, facts, gpu_offload=True)}
    got, measured = terms["compute_gpu"].bytes / 2**20, TIED_HEAD_OP_OFFLOAD_ON_AN_H100[case]
    assert abs(got - measured) <= 0.1 * measured, (got, measured, terms["compute_gpu"].formula)


GPU_CASES = {
    "smol": ("smol", "auto", {}),
    "qwen-stock": ("qwen", "stock", {}),
    "qwen-gpu-gather": ("qwen", "gpu", {}),
    "qwen-long-nofa": ("qwen", "auto", {"n_ctx": 8192, "n_ubatch": 512, "n_batch": 512, "flash_attn": "off"}),
    # flash attention forced on for heads CUDA's kernels do not take: that op runs on the CPU
    "qwen-fa-on-cpu": ("qwen", "stock", {"n_ctx": 8192, "n_ubatch": 32, "flash_attn": "on"}),
}


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("model_path", "ple_gather", "context"),
    list(GPU_CASES.values()),
    ids=list(GPU_CASES),
    indirect=["model_path"],
)
def test_on_the_gpu_each_term_is_within_ten_percent(model_path: Path, ple_gather: str, context: dict):
    """On the GPU machine: every layer offloaded; the GPU's buffers and the host ones (pinned
    CUDA_Host) against the estimate, with llama.cpp's CPU PLE gather and with the GPU one."""
    gpu = machine.probe()
    if not gpu.gpu_offload or os.environ.get("VELO_TEST_GPU_LAYERS") != "-1":
        pytest.skip("needs a GPU build and VELO_TEST_GPU_LAYERS=-1")
    profile = test_profile(model_path, model={"n_gpu_layers": -1, "ple_gather": ple_gather}, context=context)
    facts = read_facts(model_path)
    ple_gpu = report.ple_gather_on_gpu(profile, facts, gpu)
    got, mode = _measure_with_mode(model_path, profile)
    assert ple_gpu == (mode == "gpu")  # the estimate foresaw the load's PLE path
    integrated = gpu.gpu is not None and gpu.gpu.integrated
    terms = estimate.estimate(profile, facts, gpu_offload=True, integrated_gpu=integrated, ple_gpu=ple_gpu)
    compared = llama_buffers.compare(terms, got)
    assert any(c.device == "GPU" for c in compared)
    off = [c.describe() for c in compared if not c.close]
    assert not off, (mode, off, got.lines)


def test_the_hybrid_model_keeps_a_kv_cache_for_its_attention_layers_only(qwen_path: Path):
    facts = read_facts(qwen_path)
    assert facts.kv_layers == (3,) and facts.recurrent_layers == (0, 1, 2)
    assert "full_attention_interval 4 agrees" in facts.attention_pattern_note


def _small_machine(available: int) -> machine.Machine:
    mem = machine.MemInfo(total=available * 2, available=available, swap_total=0, swap_free=0, cached=0)
    return machine.Machine(mem, gpu_offload=False, gpu=None)


def test_a_profile_that_does_not_fit_gets_settings_that_would_make_it_fit(smollm2_path: Path):
    profile = test_profile(smollm2_path, context={"n_ctx": 65536}, checkpoints={"ram_budget_mib": 256})
    small = _small_machine(2 << 30)
    refused = report.check(profile, smollm2_path, small)
    assert not refused.fits and refused.verdict == "does not fit"
    assert refused.suggestions, refused.table()
    assert "to fit: " in refused.table() and "does not fit" in str(DoesNotFit(refused))
    for suggestion in refused.suggestions:  # each one is enough on its own
        changed = profile
        for part in suggestion.split(" and "):
            key, _, value = part.partition(" = ")
            section, name = key.split(".")
            typed = int(value) if value.isdigit() else value.strip('"')
            sub = dataclasses.replace(getattr(changed, section), **{name: typed})
            changed = dataclasses.replace(changed, **{section: sub})
        assert report.check(changed, smollm2_path, small).fits, suggestion


def _huge_profile(model: Path) -> None:
    """A profile whose checkpoint budget (1 TiB) no machine has: refused, yet loadable."""
    folder = locations.user_profiles_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "huge.toml").write_text(
        f'[model]\npath = "{model}"\n[context]\nn_ctx = 2048\nn_threads = 2\n'
        "[checkpoints]\nram_budget_mib = 1048576\n[sampling]\nmax_tokens = 4\n",
        encoding="utf-8",
    )


def test_the_cli_refuses_a_model_that_does_not_fit_with_its_table_and_exit_2(smollm2_path: Path):
    _huge_profile(smollm2_path)
    result = run_cli("ask", "--profile", "huge", "hello")
    assert result.returncode == 2, result.stderr
    assert "checkpoints in RAM" in result.stderr and "verdict: does not fit" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("velo-chat: error: the model does not fit in memory") and "--force" in last
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize("where", ["ask --force", "--force ask"])
def test_force_loads_it_anyway(smollm2_path: Path, where: str):
    _huge_profile(smollm2_path)
    result = run_cli(*where.split(), "--profile", "huge", "hello")
    assert result.returncode == 0, result.stderr
    assert "loading anyway (--force)" in result.stderr and result.stdout.strip()


def test_print_config_shows_the_fit_table(velo_home):
    config = run_cli("--print-config")
    assert config.returncode == 0, config.stderr
    lines = config.stdout.splitlines()
    assert any(line.startswith("# Memory for profile 'default'") for line in lines)
    assert "#   verdict: fits" in lines


def test_a_checked_load_logs_each_term_next_to_what_llama_cpp_allocated(qwen_path: Path, caplog):
    engine = Engine(test_profile(qwen_path, model={"n_gpu_layers": 0}, checkpoints={"enabled": False}))
    engine.check()
    assert diagnostics(engine).fit is not None and diagnostics(engine).fit.fits
    with caplog.at_level(logging.INFO, logger="velo_chat.engine.engine"):
        engine.load()
    engine.close()
    said = [r for r in caplog.records if r.getMessage().startswith("fit estimate vs llama.cpp: ")]
    what = {r.getMessage().split(": ", 1)[1].split(" (")[0] for r in said}
    assert what == {"weights", "KV", "recurrent", "output", "compute"}
    assert all(r.levelno == logging.INFO for r in said)  # a term more than 10% off is a WARNING


def _gpu_machine(ram: int, gpu_free: int | None, *, integrated: bool) -> machine.Machine:
    mem = machine.MemInfo(total=ram * 2, available=ram, swap_total=0, swap_free=0, cached=0)
    total = None if gpu_free is None else gpu_free * 2
    gpu = machine.Gpu("NVIDIA GB10" if integrated else "NVIDIA H200", total, gpu_free, "580.00", integrated)
    return machine.Machine(mem, gpu_offload=True, gpu=gpu)


def test_on_a_discrete_gpu_the_gpu_terms_go_against_its_free_memory(smollm2_path: Path):
    profile = test_profile(smollm2_path, model={"n_gpu_layers": -1}, checkpoints={"enabled": False})
    roomy = report.check(profile, smollm2_path, _gpu_machine(8 << 30, 8 << 30, integrated=False))
    keys = {t.key: t for t in roomy.terms}
    assert roomy.separate_gpu and roomy.fits
    assert keys["weights_gpu"].place == estimate.GPU and keys["kv_gpu"].place == estimate.GPU
    assert "kv_cpu" not in keys  # every layer's cache on the GPU
    assert roomy.gpu_needed == sum(t.bytes for t in roomy.terms if t.place == estimate.GPU)

    small = report.check(profile, smollm2_path, _gpu_machine(8 << 30, 600 << 20, integrated=False))
    assert not small.fits and "GPU free" in small.table()
    fix = next(s for s in small.suggestions if s.startswith("model.n_gpu_layers = "))
    layers = int(fix.split(" = ")[1])
    assert 0 < layers < 31
    changed = dataclasses.replace(profile, model=dataclasses.replace(profile.model, n_gpu_layers=layers))
    assert report.check(changed, smollm2_path, _gpu_machine(8 << 30, 600 << 20, integrated=False)).fits


def test_n_gpu_layers_places_the_last_layers_and_then_the_output_as_llama_cpp_does(smollm2_path: Path):
    facts = read_facts(smollm2_path)  # 30 layers
    for ngl, cpu_layers, output_on_gpu in ((30, 1, True), (31, 0, True), (5, 26, True), (1, 30, True)):
        profile = test_profile(smollm2_path, model={"n_gpu_layers": ngl})
        terms = {t.key: t for t in estimate.estimate(profile, facts, gpu_offload=True)}
        assert f"({cpu_layers} layers + input)" in terms["weights_cpu"].label, (
            ngl,
            terms["weights_cpu"].label,
        )
        assert ("+ output" in terms["weights_gpu"].label) == output_on_gpu


def test_on_unified_memory_everything_goes_against_mem_available(smollm2_path: Path):
    profile = test_profile(smollm2_path, model={"n_gpu_layers": -1}, checkpoints={"enabled": False})
    found = report.check(profile, smollm2_path, _gpu_machine(8 << 30, None, integrated=True))
    assert not found.separate_gpu and found.gpu_needed == 0
    assert (
        found.ram_needed == sum(t.bytes for t in found.terms if t.place != estimate.CACHE) + estimate.RESERVE
    )
    assert "GPU (unified RAM)" in found.table()


def test_check_refuses_a_missing_shard_and_a_truncated_file_with_one_line(smollm2_path: Path, tmp_path: Path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm2_path.read_bytes()[: 5 << 20])
    with pytest.raises(GGUFError, match="truncated GGUF"):
        Engine(test_profile(cut)).check()
    with pytest.raises(GGUFError, match="model file not found"):
        Engine(test_profile(tmp_path / "gone.gguf")).check()
    shards = split_gguf(smollm2_path, tmp_path / "split", max_tensors=100)
    assert len(shards) == 3
    whole, one = read_facts(shards[0]), read_facts(smollm2_path)  # every shard's tensors counted once
    assert whole.file_bytes == sum(p.stat().st_size for p in shards)
    assert whole.layer_bytes == one.layer_bytes and whole.input_bytes + whole.output_bytes == (
        one.input_bytes + one.output_bytes
    )
    shards[2].unlink()
    with pytest.raises(GGUFError, match="shard 3 of 3 is missing"):
        Engine(test_profile(shards[0])).check()
