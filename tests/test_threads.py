"""Threads: what `auto` resolves to, the busy-machine governor (on scripted loads), persistent
thread pools and thread changes on a real model, and where the choice is shown.

Nothing here measures speed (that is `velo-chat bench --threads/--load`); the governor is driven
by recorded CPU counters, never by this machine's real load.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from velo_chat.engine.scheduling import threads
from velo_chat.engine import turn_runner
from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import ModelLoaded, TokenDelta, TurnDone
from velo_chat.engine.config.profiles import ProfileError, build_profile, load_profile, profile_to_toml
from velo_chat.engine.scheduling.threads import CpuLoad, LoadSample, ThreadGovernor, plan_threads
from velo_chat.engine.diagnostics import diagnostics

from tests.support.engine_helpers import run_cli, test_profile
from tests.support.spec_helpers import forcing_stepper, oracle_session, run_turn, spec_engine

STORY = [ChatMessage("user", "Tell a long story about a fox who learns to write tests.")]


@pytest.fixture
def sixteen_cores(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 16)


# -- the plan ------------------------------------------------------------------------------------


def test_auto_decodes_a_gpu_model_with_few_threads_and_prefills_with_the_cores(sixteen_cores):
    gpu = plan_threads("auto", "auto", gpu_resident=True)
    assert (gpu.decode, gpu.batch) == (threads.GPU_DECODE_THREADS, 16)
    cpu = plan_threads("auto", "auto", gpu_resident=False)
    assert (cpu.decode, cpu.batch) == (16, 16)
    assert "every layer on the GPU" in gpu.describe() and "(auto)" in gpu.describe()


def test_numbers_are_kept_zero_is_the_cores_and_nothing_exceeds_them(sixteen_cores):
    p = plan_threads(4, 0, gpu_resident=True)
    assert (p.decode, p.batch) == (4, 16)
    assert plan_threads(64, 10_000, gpu_resident=False).decode == 16
    assert "decode 4," in p.describe() and "(auto)" not in p.describe()


@pytest.mark.parametrize(
    "layers,n_layer,gpu,want",
    [
        (-1, 30, True, True),
        (31, 30, True, True),
        (30, 30, True, False),
        (0, 30, True, False),
        (-1, 30, False, False),
    ],
)
def test_gpu_residency_needs_every_layer_and_the_output_on_a_gpu(layers, n_layer, gpu, want):
    assert threads.is_gpu_resident(layers, n_layer, gpu) is want


def test_profiles_take_auto_or_a_number_and_round_trip():
    p = build_profile("t", {"context": {"n_threads": 3, "n_threads_batch": "auto"}})
    assert (p.context.n_threads, p.context.n_threads_batch) == (3, "auto")
    assert build_profile("t", {}).context.n_threads == "auto"
    text = profile_to_toml(p)
    assert "n_threads = 3" in text and 'n_threads_batch = "auto"' in text
    import tomllib

    assert build_profile("t", tomllib.loads(text.split("\n", 1)[1])) == p
    with pytest.raises(ProfileError, match=r'context.n_threads must be int or "auto"'):
        build_profile("t", {"context": {"n_threads": "fast"}})
    with pytest.raises(ProfileError, match="context.thread_poll must be between 0 and 100"):
        build_profile("t", {"context": {"thread_poll": 101}})


# -- the governor, on recorded counters ------------------------------------------------------------


def install_governor(ctx, governor: ThreadGovernor) -> None:
    """Give a loaded context `governor`, starting from the counts the governor starts from:
    the real governor it replaces may have lowered them already (on a busy machine), and a
    governor only sets counts that differ from the ones it believes in place."""
    ctx._governor = governor
    ctx._set_threads(governor.decode, governor.batch)


class Machine(CpuLoad):
    """`CpuLoad` over a simulated machine instead of /proc/stat: busy processes and our threads
    share the cores fairly, as the kernel's scheduler does."""

    def __init__(self, cores: int) -> None:
        super().__init__(cpus=set(range(cores)), stat_path="/nonexistent")
        self.available = True
        self.now = LoadSample(0.0, 0.0, 0.0, 0.0)

    def run(self, busy_processes: int, our_threads: float, span: float = 0.25) -> None:
        cores = len(self.cpus)
        share = min(1.0, cores / max(busy_processes + our_threads, 1e-9))
        others, ours = busy_processes * share, our_threads * share
        n = self.now
        self.now = LoadSample(
            n.t + span,
            n.busy + span * (others + ours),
            n.idle + span * (cores - others - ours),
            n.own + span * ours,
        )

    def sample(self) -> LoadSample | None:
        return self.now


def test_others_counts_what_they_got_and_what_our_threads_held_them_back_from():
    probe = CpuLoad(cpus={0, 1}, stat_path="/nonexistent")
    a = LoadSample(0.0, 0.0, 0.0, 0.0)
    idle_left = LoadSample(1.0, 1.4, 0.6, 1.0)  # they used 0.4 of a core, cores were free
    assert probe.others(a, idle_left, threads=2) == pytest.approx(0.4)
    # Two busy processes and our two threads share two cores: each gets half a core, so the
    # others got one core and wanted two.
    shared = LoadSample(1.0, 2.0, 0.0, 1.0)
    assert probe.others(a, shared, threads=2) == pytest.approx(2.0)


@pytest.mark.parametrize("cores", [2, 16])
def test_the_governor_drops_to_the_free_cores_and_comes_back(cores, monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    machine = Machine(cores)
    gov = ThreadGovernor(plan_threads("auto", "auto", gpu_resident=False), probe=machine)
    counts = []
    for busy in [0] * 4 + [cores] * 8 + [cores // 2] * 8 + [0] * 12:
        machine.run(busy, gov.decode + 0.02)  # + this process's other threads
        changed = gov.update(gov.decode)
        assert changed is None or changed == (gov.decode, gov.batch)
        counts.append(gov.decode)
    assert counts[:4] == [cores] * 4
    assert counts[4:12] == [1] * 8  # at once, and it stays there
    assert counts[19] == cores - cores // 2  # half the cores taken: the other half
    assert counts[-1] == cores  # back to every core once the load is gone


def test_a_first_look_before_the_first_step_sees_a_busy_machine(sixteen_cores):
    plan = plan_threads("auto", "auto", gpu_resident=False)
    for busy, want in ((16, (1, 1)), (4, (12, 12)), (0, None)):
        machine = Machine(16)
        gov = ThreadGovernor(plan, probe=machine)
        machine.run(busy, 0, span=0.1)  # this process idle: they get what they want
        assert gov.first_look(0.0) == want


@pytest.mark.parametrize(("runnable", "want"), [(1, None), (3, (1, 1)), (None, (1, 1))])
def test_after_a_pause_the_load_that_has_ended_does_not_hold_the_turn_back(runnable, want, monkeypatch):
    """Between two turns two busy processes ran for a while: if they are gone when the next
    turn starts (one runnable thread: this one), it starts with every thread; if they still
    run, or nothing says (None), with what the pause left free."""
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    machine = Machine(2)
    monkeypatch.setattr(machine, "runnable_now", lambda: runnable)
    gov = ThreadGovernor(plan_threads("auto", "auto", gpu_resident=False), probe=machine)
    machine.run(2, 0, span=10.0)  # the pause: this process idle, the others on both cores
    assert gov.update(0) == want


def test_runnable_now_reads_this_machines_count():
    probe = CpuLoad()
    if not probe.available:
        pytest.skip("no /proc/stat")
    n = probe.runnable_now()
    assert n is not None and n >= 1  # this thread, at least


def test_the_governor_never_goes_above_the_plan_and_is_off_when_asked(sixteen_cores):
    plan = plan_threads(1, 4, gpu_resident=True)
    machine = Machine(16)
    gov = ThreadGovernor(plan, probe=machine)
    for _ in range(3):
        machine.run(0, 1)
        assert gov.update(1) is None
    assert (gov.decode, gov.batch) == (1, 4)
    machine.run(16, 1)
    assert gov.update(1) == (1, 1)
    off = ThreadGovernor(dataclasses.replace(plan, adapt=False), probe=machine)
    assert not off.due(float("inf"))


def test_cpu_load_reads_this_machines_counters():
    probe = CpuLoad()
    if not probe.available:
        pytest.skip("no /proc/stat here")
    a = probe.sample()
    b = probe.sample()
    assert a is not None and b is not None and b.t >= a.t and b.busy >= a.busy
    assert probe.others(a, b, threads=1) >= 0.0


# -- a real model -------------------------------------------------------------------------------


def greedy(engine: Engine, n: int = 40) -> list[int]:
    diagnostics(engine).reset()
    return [
        e.token_id
        for e in diagnostics(engine).turn(STORY, max_tokens=n, ignore_eos=True)
        if isinstance(e, TokenDelta)
    ]


ON_THE_CPU = {"n_gpu_layers": 0}
"""For the tests of the CPU's own threads: their layers stay on the CPU on a GPU build too
(with every layer on a GPU, the prefill takes every core and the decode is the GPU's)."""


def test_pools_and_thread_changes_mid_decode_keep_greedy_output(smollm2_path):
    """Flash attention off: its CPU decode splits the KV cache by thread count, which moves the
    last bits of the logits; every other op gives the same result with 1 or 2 threads."""
    ctx = {"flash_attn": "off", "adapt_threads": False}
    runs = {}
    for pool in (False, True):
        engine = Engine(test_profile(smollm2_path, model=ON_THE_CPU, context={**ctx, "thread_pool": pool}))
        loaded = engine.load()
        assert isinstance(loaded, ModelLoaded) and loaded.threads is not None and loaded.threads.prefill >= 1
        assert "(auto)" in loaded.threads.plan or "decode 2" in loaded.threads.plan
        runs[pool] = greedy(engine)
        with engine._ctx.fixed_threads(1, 1):
            assert engine._ctx.threads_now == (1, 1)
            runs[(pool, 1)] = greedy(engine)
        assert engine._ctx.threads_now == (min(2, threads.usable_cores()),) * 2
        engine.close()
    assert runs[True] == runs[False] == runs[(True, 1)] == runs[(False, 1)]

    # The governor switching between 1 and 2 threads every token changes nothing either.
    engine = Engine(
        test_profile(smollm2_path, model=ON_THE_CPU, context={"flash_attn": "off", "adapt_threads": True})
    )
    engine.load()
    plan = engine._ctx.thread_plan

    class Flipping(Machine):
        """Busy for one check in six, free otherwise: the count goes down and up again."""

        checks = 0

        def sample(self) -> LoadSample | None:
            self.checks += 1
            busy = plan.cores if self.checks % 6 == 0 else 0
            self.run(busy, engine._ctx.threads_now[0] if engine._ctx else 1)
            return self.now

    install_governor(engine._ctx, ThreadGovernor(plan, probe=Flipping(plan.cores), interval=0.0))
    seen: list[int] = []
    diagnostics(engine).reset()
    tokens = []
    for e in diagnostics(engine).turn(STORY, max_tokens=40, ignore_eos=True):
        if isinstance(e, TokenDelta):
            tokens.append(e.token_id)
            seen.append(engine._ctx.threads_now[0])
    engine.close()
    assert tokens == runs[True]
    if plan.decode >= 2:
        assert set(seen) == {1, plan.decode}


def test_a_turns_stats_say_how_many_threads_decoded_it(smollm2_path):
    engine = Engine(test_profile(smollm2_path, context={"adapt_threads": False}))
    engine.load()

    def stats():
        diagnostics(engine).reset()
        turn = diagnostics(engine).turn(STORY, max_tokens=8, ignore_eos=True)
        return next(e.stats for e in turn if isinstance(e, TurnDone))

    try:
        planned = stats()
        assert planned.llama.decode_threads == engine._ctx.thread_plan.decode
        assert planned.to_json()["decode_threads"] == planned.llama.decode_threads
        with engine._ctx.fixed_threads(1, 1):
            assert stats().llama.decode_threads == 1.0
    finally:
        engine.close()


def test_auto_on_the_hybrid_model_and_pools_keep_its_output(qwen_path):
    """On the GPU machine (VELO_TEST_GPU_LAYERS=-1 on a CUDA build) `auto` decodes with
    GPU_DECODE_THREADS; anywhere, thread pools and thread counts leave greedy output as is
    (a short context: no KV split by thread count)."""
    import os

    from llama_cpp import llama_cpp as ll

    ctx = {"n_threads": "auto", "n_threads_batch": "auto", "adapt_threads": False}
    outputs = []
    for pool in (True, False):
        engine = Engine(test_profile(qwen_path, context={**ctx, "thread_pool": pool}))
        loaded = engine.load()
        on_gpu = os.environ.get("VELO_TEST_GPU_LAYERS") == "-1" and ll.llama_supports_gpu_offload()
        want = threads.GPU_DECODE_THREADS if on_gpu else threads.usable_cores()
        assert loaded.threads is not None
        assert loaded.threads.decode == want and loaded.threads.prefill == threads.usable_cores()
        assert ("every layer on the GPU" in loaded.threads.plan) is bool(on_gpu)
        outputs.append(greedy(engine, 24))
        with engine._ctx.fixed_threads(min(2, threads.usable_cores())):
            outputs.append(greedy(engine, 24))
        engine.close()
    assert all(o == outputs[0] for o in outputs)


def test_the_choice_shows_in_print_config_and_bench(velo_home):
    config = run_cli("--print-config").stdout
    line = next(ln for ln in config.splitlines() if ln.startswith("# threads"))
    assert "decode" in line and "prefill" in line and "layers on the CPU" in line
    assert 'n_threads = "auto"' in config and 'n_threads_batch = "auto"' in config

    proc = run_cli(
        "bench",
        "--json",
        "--no-resume",
        "--prefill-sizes",
        "32",
        "--decode-tokens",
        "8",
        "--repeats",
        "1",
        "--threads",
        "1",
        "--load",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["threads"]["n_threads"] == "auto" and data["threads"]["decode"] >= 1
    assert len(data["decode"]["tok_s_runs"]) == 1 and "other_cores" in data["decode"]
    assert [r["decode_threads"] for r in data["sections"]["threads"]["fixed"]] == [1]
    load = data["sections"]["load"]
    assert load["busy_processes"] == 1 and load["over_idle"] > 0 and not load["same_session"]
    assert not load["cgroup"] and set(load["own_cgroup"]) >= {"path", "cpu_separated", "others"}
    assert [r["decode_threads"] for r in load["fixed"]] == [1]

    for args in (("--load-cgroup",), ("--load", "1", "--load-cgroup", "--load-same-session")):
        bad = run_cli("bench", *args)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--load-cgroup" in bad.stderr

    bad = run_cli("bench", "--threads", "0,x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--threads" in bad.stderr


def test_the_done_turn_is_unchanged_by_the_plan(smol_engine):
    """The session engine (2 threads, no adaptation) still answers."""
    done = [e for e in smol_engine.turn(STORY, max_tokens=4) if isinstance(e, TurnDone)]
    assert done and done[0].stats.decode_tokens >= 1


async def test_the_settings_form_takes_auto_or_a_number(tmp_path):
    from velo_chat.app.screens.settings import SettingsScreen

    from tests.support.tui_helpers import fake_app

    app, _ = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f2")
        for _ in range(600):
            if isinstance(app.screen, SettingsScreen):
                break
            await pilot.pause(0.1)
        screen = app.screen
        box = screen.query_one("#f-context--n_threads")
        assert box.value == "auto"
        error = screen.query_one("#f-context--n_threads-error")
        for typed, message in (("3", ""), ("many", 'a whole number or "auto"'), ("auto", "")):
            box.value = typed
            await pilot.pause()
            assert message in str(error.render()) and (message == "") != box.has_class("-invalid")
        box.value = "3"
        await pilot.pause()
        assert screen.query_one("ProfileForm").result.context.n_threads == 3


def _busy_pids() -> set[int]:
    """Processes running the benchmark's busy loop or its leader."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"getppid() != parent" in cmd or b"os.killpg(0, signal.SIGKILL)" in cmd:
            if state != "Z":
                found.add(int(entry.name))
    return found


@pytest.mark.parametrize("same_session", [False, True], ids=["own-session", "same-session"])
def test_busy_processes_end_when_the_benchmark_is_killed(same_session):
    """`bench --load` killed mid-run (a timeout, SIGKILL) leaves nothing spinning."""
    before = _busy_pids()
    script = (
        "import sys, time\n"
        "from velo_chat.engine.bench.load import busy_processes\n"
        f"with busy_processes(2, same_session={same_session}, settle_s=0.2):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(120)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        started = _busy_pids() - before
        assert len(started) >= 2  # the busy loops (and the leader of their own session)
    finally:
        child.kill()
        child.wait()
    for _ in range(300):  # they notice within a fraction of a second; 30 s for a loaded machine
        if not (_busy_pids() & started):
            break
        time.sleep(0.1)
    assert not (_busy_pids() & started)


def test_the_exact_cpu_profile_gives_a_busy_machine_its_prefill_threads(smollm2_path, tmp_path, monkeypatch):
    """`cpu-speculate` decodes on one thread (what keeps its verify batches exact) and verifies
    drafts on the prefill threads. With those fixed, two busy processes on 2 cores made its
    2-thread verify batches wait at ggml's barriers for a thread the kernel had descheduled
    (two of them took 85 one-token steps) and novel text ran 0.73x. So the profile adapts
    its threads: the governor takes the prefill threads down to what is free and never puts
    decode above its one thread, and a verify batch's result does not depend on its threads,
    so a speculative reply whose batches' threads change under it is still the plain reply."""
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    shipped = load_profile("cpu-speculate").context
    assert shipped.adapt_threads and shipped.n_threads == 1
    plan = plan_threads(shipped.n_threads, shipped.n_threads_batch, gpu_resident=False)
    machine = Machine(2)
    gov = ThreadGovernor(plan, probe=machine)
    machine.run(2, 1)
    assert (plan.decode, plan.batch) == (1, 2) and gov.update(1) == (1, 1)
    for _ in range(12):  # the load gone: the prefill threads come back, decode stays at one
        machine.run(0, 1)
        gov.update(1)
    assert (gov.decode, gov.batch) == (1, 2)

    monkeypatch.undo()  # the real machine's cores from here
    context = {"n_threads": 1, "n_threads_batch": 2, "adapt_threads": True, "flash_attn": "on"}
    plain = spec_engine(smollm2_path, tmp_path / "a", spec=False, context=context, model=ON_THE_CPU)
    spec = spec_engine(smollm2_path, tmp_path / "b", spec=True, context=context, model=ON_THE_CPU)
    try:
        reply = run_turn(plain, STORY, max_tokens=60, ignore_eos=True)[0]
        assert diagnostics(spec).speculation.startswith("on: bit-identical")
        ctx = spec._require()[1]
        seen: set[tuple[int, int]] = set()

        class Flipping(Machine):
            """Busy at every other look: the prefill threads go down and up during the turn."""

            looks = 0

            def sample(self) -> LoadSample | None:
                self.looks += 1
                self.run(ctx.thread_plan.cores if self.looks % 2 else 0, 1)
                seen.add(ctx.threads_now)
                return self.now

        flipping = Flipping(ctx.thread_plan.cores)
        install_governor(ctx, ThreadGovernor(ctx.thread_plan, probe=flipping, interval=0.0))
        monkeypatch.setattr(turn_runner, "SpecStepper", forcing_stepper(oracle_session(spec, STORY, reply)))
        ids, done, _ = run_turn(spec, STORY, max_tokens=60, ignore_eos=True)
        assert ids == reply and done.stats.speculation.rounds > 5
        assert {d for d, _ in seen} == {1}  # decode never left its one thread
        if ctx.thread_plan.batch > 1:
            assert {b for _, b in seen} == {1, ctx.thread_plan.batch}
    finally:
        plain.close()
        spec.close()
