"""`close_boundary` when the reply's text does not tokenize back to the sampled tokens: the
context must be brought to the follow-up boundary without ever re-prefilling more than its
budget (even when the checkpoint it meant to restore turns out to be damaged) and stop within
one ubatch when the turn is cancelled. Real llama.cpp on the hybrid tiny qwen4exp (which cannot
rewind, so it restores and re-prefills) and on SmolLM2 (which truncates).

The mismatch is set up by hand: the context holds the prompt plus tokens that are not the
reply's tokens, as after a reply whose text re-tokenizes differently."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from velo_chat.engine.checkpoints import file_format as cf
from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.engine import Engine
from velo_chat.engine.config.profile_schema import SamplingSettings
from velo_chat.engine.prompt.rendered import follow_up_prefix
from velo_chat.engine.turn_runner import TurnPlan, close_boundary
from velo_chat.engine.diagnostics import diagnostics

from tests.support.engine_helpers import test_profile

UBATCH = 16
LONG = [
    ChatMessage(
        "user", " ".join(f"Item {i}: a line of context." for i in range(12)) + " Summarise the items."
    )
]
REPLY = " ".join(["The items are lines of context, numbered from zero to twenty-nine."] * 5)


def profile(path: Path, **checkpoints):
    return test_profile(
        path,
        context={"n_batch": UBATCH, "n_ubatch": UBATCH},
        checkpoints={"interval_tokens": 0, **checkpoints},
    )


def plan_for(engine: Engine, messages) -> TurnPlan:
    return TurnPlan(
        prompt=engine._parts().renderer.render(messages),
        sampling=SamplingSettings(),
        cancel=threading.Event(),
        t_start=0.0,
        ignore_eos=False,
    )


def live_after_a_mismatched_reply(engine: Engine, messages) -> tuple[list[int], list[int]]:
    """Make the context hold the prompt plus two tokens the reply does not start with; return
    (prompt, follow-up boundary for REPLY)."""
    diagnostics(engine).reset()
    prompt = diagnostics(engine).tokens_for(messages)
    sampled = engine._model.tokenize(" zebra zebra", parse_special=False)[:2]
    engine._live.extend(prompt + sampled)
    target = follow_up_prefix(diagnostics(engine).tokens_for, tuple(messages), REPLY)
    assert target[: len(prompt)] == prompt and target[len(prompt)] != sampled[0]
    return prompt, target


def context_len(engine: Engine) -> int:
    return engine._ctx.pos_max() + 1


def test_a_failed_restore_is_not_followed_by_a_prefill_past_the_budget(qwen_path, tmp_path):
    """The checkpoint before the reply looks usable, so the tail after it is within budget;
    it fails its checksum when restored. Prefilling the whole conversation instead would cost
    far more than the budget: give up (the next turn plans from scratch)."""
    root = tmp_path / "ckpt"
    with Engine(profile(qwen_path), checkpoint_root=root) as engine:
        engine.load()
        assert engine._model.hybrid
        diagnostics(engine).complete(LONG, max_tokens=2)
        assert diagnostics(engine).flush_checkpoints(60)
        for key in list(engine._checkpoints.ram.entries):  # only the disk copies are left
            engine._checkpoints.ram.drop(key)
        prompt, target = live_after_a_mismatched_reply(engine, LONG)
        saved = [f for f in root.glob(f"*/*{cf.SUFFIX}") if cf.read_header(f)[0].n_tokens == len(prompt) - 1]
        assert len(saved) == 1
        data = bytearray(saved[0].read_bytes())
        data[-1] ^= 0x01
        saved[0].write_bytes(bytes(data))
        n_generated = 30
        budget = 2 * n_generated + 64
        assert len(target) - (len(prompt) - 1) <= budget < len(target)
        assert close_boundary(engine._parts(), plan_for(engine, LONG), REPLY, n_generated) is False
        assert list(engine._live.tokens) == [] and context_len(engine) == 0
        assert any("payload checksum mismatch" in w for w in engine._checkpoints.take_warnings())


@pytest.mark.parametrize("model", ["qwen4exp", "smollm2"])
def test_a_cancelled_turn_stops_the_boundary_prefill_within_one_ubatch(model, request):
    """A budget big enough for the whole conversation (a long reply), no checkpoint to restore:
    the boundary is prefilled ubatch by ubatch, and a cancel stops it at the next one."""
    path = request.getfixturevalue("qwen_path" if model == "qwen4exp" else "smollm2_path")
    with Engine(profile(path, enabled=False)) as engine:
        engine.load()
        prompt, target = live_after_a_mismatched_reply(engine, LONG)
        start = 0 if engine._model.hybrid else len(prompt)  # hybrid: from nothing; else truncate
        assert len(target) - start > 3 * UBATCH
        plan = plan_for(engine, LONG)
        decode = engine._ctx.decode
        calls = []

        def decode_then_cancel(tokens):
            decode(tokens)
            calls.append(len(tokens))
            plan.cancel.set()  # the user cancels while the first ubatch runs

        engine._ctx.decode = decode_then_cancel
        try:
            assert close_boundary(engine._parts(), plan, REPLY, n_generated=1000) is False
        finally:
            del engine._ctx.decode
        assert calls == [UBATCH]
        assert list(engine._live.tokens) == target[: start + UBATCH]
        assert context_len(engine) == len(list(engine._live.tokens))


def test_a_turn_cancelled_before_the_boundary_leaves_the_context_as_it_was(qwen_path):
    """Cancelled during the reply: the hybrid model does not start a restore and re-prefill
    at all; the context still holds what the live sequence says."""
    with Engine(profile(qwen_path, enabled=False)) as engine:
        engine.load()
        prompt, _ = live_after_a_mismatched_reply(engine, LONG)
        before = list(engine._live.tokens)
        plan = plan_for(engine, LONG)
        plan.cancel.set()
        assert close_boundary(engine._parts(), plan, REPLY, n_generated=1000) is False
        assert list(engine._live.tokens) == before and context_len(engine) == len(before)
