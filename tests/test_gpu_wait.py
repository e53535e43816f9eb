"""`[model] gpu_wait`: how the CPU thread waits for the GPU (CUDA's device scheduling flag).

On a CPU build the setting validates and every value loads and answers; on the GPU machine
(`VELO_TEST_GPU_LAYERS=-1`, a CUDA build: the `gpu` tests) each value is what CUDA reads back
after the load, and greedy output does not depend on it. Speed is measured by
`benchmarks/device/device_threads.sh`, not here.
"""

from __future__ import annotations

import os

import pytest

from velo_chat.engine.scheduling import gpu_wait
from velo_chat.engine.config.profiles import ProfileError, build_profile, profile_to_toml
from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import TokenDelta
from velo_chat.engine.diagnostics import diagnostics

from tests.support.engine_helpers import run_cli, test_profile

PROMPT = "Count from one to ten."


def greedy(engine: Engine, n: int) -> list[int]:
    diagnostics(engine).reset()
    events = diagnostics(engine).turn([ChatMessage("user", PROMPT)], max_tokens=n, ignore_eos=True)
    return [e.token_id for e in events if isinstance(e, TokenDelta)]


def on_cuda() -> bool:
    from llama_cpp import llama_cpp as ll

    return os.environ.get("VELO_TEST_GPU_LAYERS") == "-1" and bool(ll.llama_supports_gpu_offload())


def test_every_value_validates_and_round_trips_and_a_bad_one_says_what_is_allowed():
    assert build_profile("t", {}).model.gpu_wait == "auto"
    for value in gpu_wait.CHOICES:
        p = build_profile("t", {"model": {"gpu_wait": value}})
        assert p.model.gpu_wait == value
        assert f'gpu_wait = "{value}"' in profile_to_toml(p)
    with pytest.raises(
        ProfileError, match="model.gpu_wait must be one of auto, spin, yield, block; got 'busy'"
    ):
        build_profile("t", {"model": {"gpu_wait": "busy"}})


def test_a_bad_value_in_a_profile_file_is_one_line_and_exit_2(velo_home):
    profiles = velo_home / "config" / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "bad.toml").write_text('[model]\ngpu_wait = "sometimes"\n')
    proc = run_cli("--profile", "bad", "--print-config")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "gpu_wait must be one of auto, spin, yield, block" in proc.stderr


class Runtime:
    """Stands in for llama.cpp's CUDA runtime (no GPU here): device kinds and each device's
    scheduling flag, as `gpu_wait.CudaRuntime` reads and sets them."""

    path = "libcudart (stand-in)"

    def __init__(self, integrated: list[bool]) -> None:
        self.kinds = integrated
        self.flags: dict[int, str] = dict.fromkeys(range(len(integrated)), "auto")

    def device_count(self) -> int:
        return len(self.kinds)

    def integrated(self, device: int) -> bool:
        return self.kinds[device]

    def schedule(self, device: int) -> str:
        return self.flags[device]

    def set_schedule(self, device: int, mode: str | None) -> None:
        self.flags[device] = mode or "auto"


def test_auto_keeps_cudas_default_until_measured_and_values_are_used_as_written():
    rt = Runtime([False])
    auto = gpu_wait.resolve("auto", uses_gpu=True, runtime=rt)
    assert gpu_wait.AUTO_MODE is None and auto.mode is None
    assert auto.describe() == "GPU wait as CUDA sets it (auto: CUDA's default)"
    assert gpu_wait.resolve("spin", uses_gpu=True, runtime=rt).mode == "spin"
    assert gpu_wait.resolve("block", uses_gpu=True, runtime=rt).describe() == "GPU wait block"


def test_an_auto_mode_applies_to_a_discrete_gpu_only_and_cpu_loads_are_left_alone(monkeypatch):
    """The rule "auto" follows once it has a mode (AUTO_MODE): an integrated GPU stays as
    llama.cpp sets it (ggml spins on the GB10 on purpose)."""
    monkeypatch.setattr(gpu_wait, "AUTO_MODE", "block")
    rt = Runtime([False])
    assert gpu_wait.resolve("auto", uses_gpu=True, runtime=rt).describe() == "GPU wait block (auto)"
    spark = gpu_wait.resolve("auto", uses_gpu=True, runtime=Runtime([True]))
    assert spark.mode is None and "integrated" in spark.describe()
    assert gpu_wait.resolve("yield", uses_gpu=True, runtime=Runtime([True])).mode == "yield"
    for value in gpu_wait.CHOICES:  # nothing to set, nothing said
        for uses_gpu, runtime in ((False, rt), (True, None)):
            w = gpu_wait.resolve(value, uses_gpu=uses_gpu, runtime=runtime)
            assert w.mode is None and w.describe() == ""


def test_a_set_mode_holds_for_the_process_and_auto_puts_back_what_cuda_had(monkeypatch):
    rt = Runtime([False, False])
    monkeypatch.setattr(gpu_wait, "cuda_runtime", lambda: rt)
    monkeypatch.setattr(gpu_wait, "_ORIGINAL", {})
    assert gpu_wait.apply("block", uses_gpu=True).mode == "block"
    assert rt.flags == {0: "block", 1: "block"}
    gpu_wait.apply("spin", uses_gpu=True)
    assert rt.flags == {0: "spin", 1: "spin"} and gpu_wait._ORIGINAL == {0: "auto", 1: "auto"}
    assert gpu_wait.apply("auto", uses_gpu=True).mode is None
    assert rt.flags == {0: "auto", 1: "auto"}
    gpu_wait.apply("yield", uses_gpu=False)  # a CPU model: nothing to wait for, CUDA's default
    assert rt.flags == {0: "auto", 1: "auto"}


def test_a_load_with_each_value_answers_and_says_what_was_set(qwen_path):
    """On this build (CPU or CUDA) every value loads with every layer asked on the GPU and
    decodes the same greedy tokens; where nothing can be set (a build without CUDA) the threads
    line says nothing of it."""
    outputs = []
    for value in gpu_wait.CHOICES:
        engine = Engine(test_profile(qwen_path, model={"gpu_wait": value, "n_gpu_layers": -1}))
        loaded = engine.load()
        if gpu_wait.cuda_runtime() is None:  # no CUDA in this build
            assert "GPU wait" not in loaded.threads.plan
        elif value != "auto":
            assert loaded.threads.plan.endswith(f"; GPU wait {value}")
        else:
            mode = gpu_wait.AUTO_MODE
            said = f"GPU wait {mode} (auto)" if mode else "GPU wait as CUDA sets it (auto: CUDA's default)"
            assert loaded.threads.plan.endswith(f"; {said}")
        outputs.append(greedy(engine, 12))
        engine.close()
    assert all(o == outputs[0] for o in outputs)


@pytest.mark.gpu
def test_cuda_reads_back_the_flag_the_profile_asked_for(qwen_path):
    """On the GPU machine: after the load the device's scheduling flag is the profile's, and
    "auto" (while it has no mode of its own) puts back what CUDA had before."""
    if not on_cuda():
        pytest.skip("needs a CUDA build and VELO_TEST_GPU_LAYERS=-1")
    for value in ("spin", "yield", "block", "auto"):
        engine = Engine(test_profile(qwen_path, model={"gpu_wait": value}))
        engine.load()
        runtime = gpu_wait.cuda_runtime()
        assert runtime is not None
        want = value if value != "auto" else gpu_wait.AUTO_MODE or gpu_wait._ORIGINAL[0]
        assert runtime.schedule(0) == want
        assert len(greedy(engine, 8)) == 8
        engine.close()
