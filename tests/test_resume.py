"""Prefix-checkpoint resume on real models: SmolLM2 (attention-only) and the tiny qwen4exp
(hybrid: recurrent GDN layers + sparse attention).

Greedy output after resuming from the live context, the RAM tier and the disk tier (a fresh
engine: nothing in RAM) must be token-identical to a cold run of the same conversation, for
follow-ups, regenerate, edit-last-message and fork. The engines here prefill one token per batch
so that every path runs the same float arithmetic: with bigger batches llama.cpp sums matmuls in
another order and two *correct* paths may part on a near tie, which would hide what we test —
that no reused state is ever wrong.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import TurnDone, TurnStarted
from velo_chat.engine.diagnostics import diagnostics

from tests.support.engine_helpers import test_profile

N = 24  # greedy tokens per reply


@pytest.fixture(params=["smollm2", "qwen4exp"])
def model_path(request) -> Path:
    return request.getfixturevalue("smollm2_path" if request.param == "smollm2" else "qwen_path")


def profile_for(path: Path, **checkpoints):
    return test_profile(
        path, context={"n_batch": 1, "n_ubatch": 1}, checkpoints={"interval_tokens": 0, **checkpoints}
    )


def run(engine: Engine, messages: list[ChatMessage]) -> TurnDone:
    events = list(engine.turn(messages, max_tokens=N))
    assert isinstance(events[-1], TurnDone), events[-1]
    return events[-1]


def cold(path: Path, messages: list[ChatMessage]) -> str:
    with Engine(profile_for(path, enabled=False)) as engine:
        engine.load()
        return run(engine, messages).text


Q1 = [ChatMessage("user", "List three prime numbers and explain why they are prime.")]


def follow_up(first: str) -> list[ChatMessage]:
    return Q1 + [ChatMessage("assistant", first), ChatMessage("user", "And three more?")]


def test_follow_up_from_live_ram_and_disk_matches_cold(model_path, tmp_path):
    root = tmp_path / "ckpt"
    with Engine(profile_for(model_path), checkpoint_root=root) as engine:
        engine.load()
        first = run(engine, Q1)
        convo = follow_up(first.text)
        live = run(engine, convo)
        diagnostics(engine).reset()  # the live context is gone; RAM still holds the reply-end state
        ram = run(engine, convo)
    with Engine(profile_for(model_path), checkpoint_root=root) as fresh:  # a "restart"
        fresh.load()
        disk = run(fresh, convo)
    reference = cold(model_path, convo)
    assert live.stats.source == "live"
    assert ram.stats.source == "ram"
    assert disk.stats.source == "disk"
    for done in (live, ram, disk):
        assert done.stats.cached_tokens >= first.stats.prompt_tokens + first.stats.decode_tokens - 1
        assert done.text == reference


def test_regenerate_and_edit_last_message_reuse_the_boundary(model_path, tmp_path):
    root = tmp_path / "ckpt"
    with Engine(profile_for(model_path), checkpoint_root=root) as engine:
        engine.load()
        first = run(engine, Q1)
        convo = follow_up(first.text)
        second = run(engine, convo)
        # Regenerate: the same conversation again; the state before the reply is reused.
        regen = run(engine, convo)
        assert regen.stats.cached_tokens == regen.stats.prompt_tokens - 1
        assert regen.text == second.text
        # Edit the last user message: the boundary after the first reply is reused.
        edited = convo[:-1] + [ChatMessage("user", "Now list three even numbers.")]
        edit = run(engine, edited)
        boundary = first.stats.prompt_tokens + first.stats.decode_tokens - 1
        assert edit.stats.cached_tokens >= boundary
    with Engine(profile_for(model_path), checkpoint_root=root) as fresh:
        fresh.load()
        regen_disk = run(fresh, convo)
        assert regen_disk.stats.source == "disk"
        assert regen_disk.stats.cached_tokens == regen_disk.stats.prompt_tokens - 1
    assert regen.text == regen_disk.text == cold(model_path, convo)
    assert edit.text == cold(model_path, edited)


def test_fork_shares_checkpoints(model_path, tmp_path):
    """A fork is the same history under a new session id: its first turn resumes from the
    parent's checkpoints (they are keyed by tokens, not by session)."""
    from velo_chat.app.conversation import engine_messages
    from velo_chat.store import SessionStore

    root = tmp_path / "ckpt"
    with (
        SessionStore(tmp_path / "s.sqlite3") as store,
        Engine(profile_for(model_path), checkpoint_root=root) as engine,
    ):
        engine.load()
        parent = store.create_session("test")
        store.add_message(parent.id, "user", Q1[0].content)
        first = run(engine, Q1)
        reply = store.add_message(parent.id, "assistant", first.text)
        fork = store.fork(parent.id, reply.id)
        diagnostics(engine).reset()
        convo = engine_messages("", store.messages(fork.id)) + [ChatMessage("user", "And three more?")]
        forked = run(engine, convo)
    assert forked.stats.source == "ram"
    assert forked.stats.cached_tokens >= first.stats.prompt_tokens
    assert forked.text == cold(model_path, convo)


def test_hybrid_model_never_truncates_its_live_state(qwen_path, tmp_path):
    """llama.cpp refuses seq_rm inside a recurrent state; the engine must not even try, and
    an edited conversation resumes at a saved boundary instead of a truncated live state."""
    with Engine(profile_for(qwen_path, enabled=False)) as engine:
        engine.load()
        assert engine._model.hybrid
        run(engine, Q1)
        assert engine._ctx.truncate(5) is False  # the fact the rule rests on
        edited = [ChatMessage("user", "List three prime numbers, briefly.")]
        events = list(engine.turn(edited, max_tokens=N))
        started = events[0]
        assert isinstance(started, TurnStarted)
        assert started.cached_tokens == 0 and started.source == "none"
        assert events[-1].text == cold(qwen_path, edited)
    with Engine(profile_for(qwen_path), checkpoint_root=tmp_path / "ckpt") as engine:
        engine.load()
        run(engine, Q1)
        edited = [ChatMessage("user", "List three prime numbers, briefly.")]
        done = run(engine, edited)
        # Only the exact prefix the checkpoints saw can be reused: not the live context.
        assert done.stats.source in ("ram", "none")
        assert done.text == cold(qwen_path, edited)


def test_short_prefills_save_no_state_before_the_reply(qwen_path, tmp_path):
    """Below `min_prefill_tokens` the copy of the whole state before the first token is not
    worth it: only the reply boundary is saved, and a regenerate on the hybrid model resumes
    from the boundary before the question. (An attention model would truncate the newer reply
    boundary instead.)"""
    profile = test_profile(qwen_path, checkpoints={"min_prefill_tokens": 10_000})
    with Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine:
        engine.load()
        first = diagnostics(engine).complete(Q1, max_tokens=N)
        assert [s.tokens for s in first.stats.checkpoint.saved] == [len(list(engine._live.tokens))]
        convo = follow_up(first.text)
        diagnostics(engine).complete(convo, max_tokens=N)
        diagnostics(engine).reset()
        regen = diagnostics(engine).complete(convo, max_tokens=N)
    assert regen.stats.source == "ram"
    assert regen.stats.cached_tokens == first.stats.checkpoint.saved[0].tokens


def test_preview_matches_the_turn(model_path, tmp_path):
    with Engine(profile_for(model_path), checkpoint_root=tmp_path / "ckpt") as engine:
        engine.load()
        first = run(engine, Q1)
        convo = follow_up(first.text)
        preview = engine.preview(convo)
        started = next(iter(engine.turn(convo, max_tokens=1)))
        assert (preview.cached_tokens, preview.prefill_tokens, preview.source) == (
            started.cached_tokens,
            started.prefill_tokens,
            started.source,
        )
        assert preview.est_prefill_s is not None and preview.est_prefill_s > 0


def test_interval_checkpoints_let_an_edited_early_message_reuse_most_of_it(qwen_path, tmp_path):
    """Inside a long prefill a checkpoint is saved every `interval_tokens`: editing the end of
    a long first message on a hybrid model resumes from the last one before the edit."""
    long_text = " ".join(f"Item {i}: a line of context for the task." for i in range(40))
    original = [ChatMessage("user", long_text + " Summarise the items.")]
    edited = [ChatMessage("user", long_text + " Count the items.")]
    profile = test_profile(
        qwen_path, context={"n_batch": 16, "n_ubatch": 16}, checkpoints={"interval_tokens": 64}
    )
    with Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine:
        engine.load()
        events = list(engine.turn(original, max_tokens=4))
        saved = [e.tokens for e in events if type(e).__name__ == "CheckpointSaved"]
        prompt_tokens = events[0].prompt_tokens
        assert saved[:-2] == list(range(64, prompt_tokens - 1, 64))
        assert saved[-2] == prompt_tokens - 1
        diagnostics(engine).reset()
        done = diagnostics(engine).complete(edited, max_tokens=4)
    before, after = _tokens(qwen_path, original), _tokens(qwen_path, edited)
    shared = next(i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b)
    assert done.stats.source == "ram"
    assert done.stats.cached_tokens == shared // 64 * 64
    assert done.stats.cached_tokens > len(before) * 0.7


def _tokens(path: Path, messages: list[ChatMessage]) -> list[int]:
    with Engine(profile_for(path, enabled=False)) as engine:
        engine.load()
        return diagnostics(engine).tokens_for(messages)
