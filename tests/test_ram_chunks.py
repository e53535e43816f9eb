"""RAM-tier checkpoints as shared chunks: a session's states hold what each adds, the chunks are
cut off the turn's thread (by the disk writer, or by the RAM tier's own thread without a disk
tier), and a restore from chunks samples what a cold prefill does (on a GPU build, what a restore
of the same states whole does). Real llama.cpp, SmolLM2 and the tiny hybrid qwen4exp."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from velo_chat.engine.engine import Engine
from velo_chat.engine.checkpoints import chunks as ch
from velo_chat.engine.checkpoints.ram_tier import RamTier
from velo_chat.engine.diagnostics import diagnostics
from velo_chat.engine.fit import machine
from velo_chat.engine.prompt.chat_template import ChatMessage
from support.engine_helpers import test_profile

QUESTIONS = (
    "List three rivers of Europe and one fact about each.",
    "Which of them is the longest?",
    "Name a city on its banks.",
    "Summarise all of that in one sentence.",
)


@pytest.fixture(params=["smollm2", "qwen4exp"])
def model_path(request) -> Path:
    return request.getfixturevalue("smollm2_path" if request.param == "smollm2" else "qwen_path")


def session(engine: Engine, *, settle: bool = True) -> list[ChatMessage]:
    """Run the four questions as one conversation; the messages of the last turn."""
    diag = diagnostics(engine)
    messages: list[ChatMessage] = []
    for question in QUESTIONS:
        messages.append(ChatMessage("user", question))
        done = diag.complete(messages, max_tokens=24)
        messages.append(ChatMessage("assistant", done.text, done.reasoning))
        if settle:
            assert diag.flush_checkpoints(120)
    return messages


def _chunked_entries(engine: Engine) -> list[bool]:
    return [not e.whole for e in engine._checkpoints.ram.entries.values()]


@pytest.mark.parametrize("disk", [True, False], ids=["disk-writer-cuts", "ram-thread-cuts"])
def test_a_session_holds_its_states_as_shared_chunks_and_restores_them_exactly(model_path, tmp_path, disk):
    profile = test_profile(model_path, checkpoints={"disk_budget_gib": 1.0 if disk else 0.0})
    with Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine:
        engine.load()
        messages = session(engine)
        memory = diagnostics(engine).checkpoint_memory()
        assert memory.ram_entries >= 6 and all(_chunked_entries(engine))
        # each chunk is held once: what the states share (SmolLM2's KV cells, most of its
        # states; the hybrid's recurrent state changes whole at every save) is not repeated
        pool = engine._checkpoints.ram.pool
        assert memory.ram_held_bytes == sum(len(a) for a in pool.arrays.values())
        share = 0.5 if model_path.name.startswith("SmolLM2") else 0.97
        assert memory.ram_held_bytes < share * memory.ram_state_bytes, memory
        assert (memory.disk_entries > 0) == disk
        follow = [*messages, ChatMessage("user", "And one more river?")]
        diagnostics(engine).reset()
        restored = diagnostics(engine).complete(follow, max_tokens=16)
    assert restored.stats.source == "ram"
    assert restored.stats.cached_tokens >= sum(1 for _ in messages)  # it did resume
    assert restored.text == _reference_reply(model_path, tmp_path, follow)


def _reference_reply(model_path: Path, tmp_path: Path, follow: list[ChatMessage]) -> str:
    """What the follow-up must sample. Without a GPU: a cold turn's reply. A prefill in other
    batches may move the logits' last bits on a GPU (op offload included), so there the same
    session is restored from whole states instead: the same save points, the same batches,
    only the chunking differs."""
    if not machine.probe().gpu_offload:
        with Engine(test_profile(model_path, checkpoints={"enabled": False})) as cold_engine:
            cold_engine.load()
            return diagnostics(cold_engine).complete(follow, max_tokens=16).text
    whole = test_profile(model_path, checkpoints={"disk_budget_gib": 0.0, "ram_chunks": False})
    with Engine(whole, checkpoint_root=tmp_path / "whole") as engine:
        engine.load()
        session(engine)
        assert not any(_chunked_entries(engine))
        diagnostics(engine).reset()
        reference = diagnostics(engine).complete(follow, max_tokens=16)
    assert reference.stats.source == "ram"
    return reference.text


def test_switched_off_every_state_stays_whole(smollm2_path, tmp_path):
    profile = test_profile(smollm2_path, checkpoints={"ram_chunks": False})
    with Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine:
        engine.load()
        session(engine)
        memory = diagnostics(engine).checkpoint_memory()
        assert memory.ram_entries >= 6 and not any(_chunked_entries(engine))
    assert memory.ram_held_bytes == memory.ram_state_bytes


def _related_states(n: int, size: int) -> list[np.ndarray]:
    """States that grow like a KV cache: each the one before plus new bytes, in two blocks
    (so the shared runs move), random so that every chunk is distinct."""
    rng = np.random.default_rng(7)
    half_a, half_b = rng.integers(0, 256, size, dtype=np.uint8), rng.integers(0, 256, size, dtype=np.uint8)
    states = []
    for i in range(1, n + 1):
        cut = size * i // n
        states.append(np.concatenate([half_a[:cut], half_b[:cut]]))
    return states


def test_dropping_a_chunked_entry_frees_only_what_no_other_entry_shares():
    ram = RamTier(1 << 30, guard=None)
    states = _related_states(4, 1 << 20)
    for i, s in enumerate(states):
        key = f"{i:032d}"
        assert ram.put(key, np.arange(i + 1, dtype=np.int32), s)
        ram.adopt(key, ch.split(s))
    biggest = len(states[-1])
    assert ram.used < 1.2 * biggest < sum(map(len, states))
    before = ram.used
    ram.drop(f"{0:032d}")  # the smallest: every chunk of it but its last is shared
    assert before - ram.used < 0.1 * len(states[0]) + ch.MAX_CHUNK * 2
    for i in (1, 2, 3):
        entry = ram.entries[f"{i:032d}"]
        assert not entry.whole and entry.contiguous().tobytes() == states[i].tobytes()
    for i in (1, 2, 3):
        ram.drop(f"{i:032d}")
    assert ram.used == 0 and not ram.pool.arrays


def test_a_gone_or_chunked_entry_is_not_adopted_twice():
    ram = RamTier(1 << 30, guard=None)
    s = _related_states(1, 1 << 18)[0]
    ram.put("k" * 32, np.arange(3, dtype=np.int32), s)
    assert ram.adopt("k" * 32, ch.split(s)) is not None
    held = ram.used
    assert ram.adopt("k" * 32, ch.split(s)) is None and ram.used == held
    assert ram.adopt("x" * 32, ch.split(s)) is None
