"""The fit check: its estimate against what llama.cpp really allocates (the buffer sizes it logs)
for SmolLM2 and the tiny qwen4exp on the CPU, term by term within 10%; a profile that cannot
fit refused by the CLI with its table (exit 2) and loaded with --force."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from velo_chat.engine.config import locations
from velo_chat.engine.fit import estimate, llama_buffers, machine, report
from velo_chat.engine.fit.model_facts import read_facts
from velo_chat.engine.llama_context import LlamaContext
from velo_chat.engine.llama_model import LlamaModel

from tests.support.engine_helpers import run_cli, test_profile

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


def close_enough(est: int, measured: int) -> bool:
    """Within 10%, or within the log line's own rounding (two decimals of a MiB)."""
    return abs(est - measured) <= max(0.10 * measured, llama_buffers.ROUNDING)


@pytest.fixture
def model_path(request, smollm2_path: Path) -> Path:
    return smollm2_path if request.param == "smol" else request.getfixturevalue("qwen_path")


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
    terms = {t.key: t for t in estimate.estimate(profile, facts)}
    with llama_buffers.captured() as got:
        model = LlamaModel(model_path, profile.model)
        try:
            LlamaContext(model, profile.context).close()
        finally:
            model.close()

    ple = terms.get("ple")
    weights = terms["weights_cpu"].bytes + (ple.bytes if ple else 0)
    assert close_enough(weights, got.total("model")), (weights, got.lines)
    if ple is not None and ple.place == estimate.CACHE:  # its own mapped buffer
        assert any(close_enough(ple.bytes, n) for n in got.sizes("model")), (ple, got.lines)
    assert close_enough(terms["kv_cpu"].bytes, got.total("KV")), (terms["kv_cpu"], got.lines)
    if facts.hybrid:
        assert close_enough(terms["rs_cpu"].bytes, got.total("RS")), (terms["rs_cpu"], got.lines)
    else:
        assert "rs_cpu" not in terms and got.total("RS") == 0
    assert close_enough(terms["output"].bytes, got.total("output")), (terms["output"], got.lines)
    assert close_enough(terms["compute_cpu"].bytes, got.total("compute")), (terms["compute_cpu"], got.lines)


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
    assert "to fit: " in refused.table() and "does not fit" in str(report.DoesNotFit(refused))
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


def test_force_loads_it_anyway(smollm2_path: Path):
    _huge_profile(smollm2_path)
    result = run_cli("ask", "--profile", "huge", "--force", "hello")
    assert result.returncode == 0, result.stderr
    assert "loading anyway (--force)" in result.stderr and result.stdout.strip()


def test_print_config_shows_the_fit_table(velo_home):
    config = run_cli("--print-config")
    assert config.returncode == 0, config.stderr
    lines = config.stdout.splitlines()
    assert any(line.startswith("# Memory for profile 'default'") for line in lines)
    assert "#   verdict: fits" in lines
