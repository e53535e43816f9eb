"""Shared by the speculation tests on real models (`test_speculation.py`, `test_spec_guard.py`):
the conversations, an engine with or without speculation, a turn's tokens, and what "the same
reply" means with the layers on the CPU (token for token) or on a GPU (up to a near-tie)."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tests.support.engine_helpers import test_profile
from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import TokenDelta, TurnDone
from velo_chat.engine.speculation.cost import CostModel
from velo_chat.engine.speculation.stepper import SpecStepper
from velo_chat.engine.diagnostics import diagnostics

COPY = [
    ChatMessage(
        "user",
        "Here is a Python function:\n\n```python\n"
        + inspect.getsource(textwrap.dedent)
        + "```\n\nRename the variable `margin` to `common` and give back the whole function.",
    )
]
PROSE = [ChatMessage("user", "Write a short poem about the sea in the evening light.")]
SHORT = [ChatMessage("user", "What is the capital of France? One sentence.")]
ONE_THREAD = {"n_threads": 1, "n_threads_batch": 1}


def spec_engine(path: Path, root: Path, *, spec: bool, **sections: dict) -> Engine:
    ctx = {**ONE_THREAD, **sections.pop("context", {})}
    spec_section = {
        "enabled": spec,
        "max_draft": 8,
        "allow_batch_rounding": True,
        **sections.pop("speculation", {}),
    }
    engine = Engine(
        test_profile(path, context=ctx, speculation=spec_section, **sections), checkpoint_root=root
    )
    engine.load()
    return engine


def run_turn(
    engine: Engine, messages: Sequence[ChatMessage], *, max_tokens: int, cancel_after: int = 0, **kw
):
    """(token ids, TurnDone, the context's tokens after the turn)."""
    ids: list[int] = []
    done = None
    with diagnostics(engine).turn(messages, max_tokens=max_tokens, **kw) as turn:
        for event in turn:
            if isinstance(event, TokenDelta):
                ids.append(event.token_id)
                if cancel_after and len(ids) == cancel_after:
                    turn.cancel()
            elif isinstance(event, TurnDone):
                done = event
    assert done is not None
    return ids, done, engine._require()[2].tokens


def oracle_session(engine: Engine, messages: Sequence[ChatMessage], reply: Sequence[int]) -> list[int]:
    """The prompt followed by `reply`: indexed before the session, so that when the real
    prompt ends the draft source proposes `reply`."""
    return [*diagnostics(engine).tokens_for(messages, diagnostics(engine).template_variables()), *reply]


def forcing_stepper(oracle: Sequence[int]) -> type[SpecStepper]:
    """A stepper that drafts whenever it has a match (no cost model: verify batches are taken to
    cost one step) and indexes `oracle` before the session (`oracle_session`)."""

    class Forced(SpecStepper):
        def __init__(self, live, sampler, settings, session):
            super().__init__(live, sampler, settings, [*oracle, *session])
            self.cost = CostModel(slope=0.0)
            self.cost.record = lambda n, seconds, stale=False: None  # type: ignore[method-assign]

    return Forced


def on_gpu(engine: Engine) -> bool:
    return engine._require()[1].thread_plan.gpu_resident


def tolerance(engine: Engine, messages: Sequence[ChatMessage]) -> float:
    """0.0 with the layers on the CPU (the replies must be identical). With every layer on a
    GPU: twice the largest difference between verify-batch and one-token logits measured on
    `messages` (each of two logits may move by it), what may turn a near-tie."""
    if not on_gpu(engine):
        return 0.0
    d = diagnostics(engine).verify_logit_differences(messages, 24, (2, 4, 8))
    return 2.0 * max(d["max_abs_diff"].values())


def plain_logits(plain: Engine, messages: Sequence[ChatMessage], reply: Sequence[int]) -> np.ndarray:
    """The plain engine's logits after the prompt and `reply`, the last token decoded alone."""
    live = plain._require()[2]
    prompt = diagnostics(plain).tokens_for(messages, diagnostics(plain).template_variables())
    live.clear()
    tokens = [*prompt, *reply]
    for pos in range(0, len(tokens) - 1, live.n_ubatch):
        live.extend(tokens[pos : min(pos + live.n_ubatch, len(tokens) - 1)])
    live.append(tokens[-1])
    logits = live.logits().copy()
    live.clear()
    return logits


def same_reply(
    plain: Engine,
    messages: Sequence[ChatMessage],
    a: Sequence[int],
    b: Sequence[int],
    tol: float,
    *,
    top_k: int = 0,
) -> bool:
    """Asserts that the speculative reply `b` is the plain reply `a`: to the token where `tol`
    is 0; otherwise up to the first token where they differ, where the plain logits put `b`'s
    token within `tol` of `a`'s (greedy), or, sampled (`top_k`), among the `top_k` the plain
    chain draws from. True when the replies are the same."""
    if tol == 0.0:
        assert list(b) == list(a)
        return True
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    if i == len(a) == len(b):
        return True
    logits = plain_logits(plain, messages, a[:i])
    eos = plain._require()[0].eos_id
    ta, tb = (a[i] if i < len(a) else eos), (b[i] if i < len(b) else eos)
    if top_k:
        assert tb in np.argsort(logits)[-top_k:], (i, tb)
    else:
        assert logits[ta] - logits[tb] <= tol, (i, ta, tb, float(logits[ta] - logits[tb]), tol)
    return False


def follow_up(plain: Engine, spec: Engine, follow: Sequence[ChatMessage], n: int, tol: float) -> None:
    """The next turn of both engines agrees as `_same_reply` says."""
    same_reply(
        plain, follow, run_turn(plain, follow, max_tokens=n)[0], run_turn(spec, follow, max_tokens=n)[0], tol
    )


def corrupt(reply: Sequence[int], every: int) -> list[int]:
    return [(t + 1) % 1000 if i % every == every - 1 else t for i, t in enumerate(reply)]


class Clocked:
    """The live sequence as the stepper sees it, advancing a virtual clock by one unit per
    one-token step, by `verify` units per verify batch, and by `first` units for the context's
    first batch of each size (when given)."""

    def __init__(self, live, verify: float, first: float | None = None) -> None:
        self._live, self._verify, self._first, self.now = live, verify, first, 0.0

    def __getattr__(self, name: str):
        return getattr(self._live, name)

    def __len__(self) -> int:
        return len(self._live)

    def append(self, token: int) -> None:
        self.now += 1.0
        self._live.append(token)

    def verify(self, tokens: Sequence[int]) -> None:
        new = len(tokens) not in self._live.verified_sizes
        self.now += self._first if new and self._first is not None else self._verify
        self._live.verify(tokens)
