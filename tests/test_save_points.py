"""Save points that later turns keep, on a thinking template (`engine/checkpoints/save_points.py`).

The tiny hybrid qwen4exp with the real Qwen3.5 template: its generation prompt ends in
`<think>\\n`, which a follow-up never contains (earlier replies are rendered without their
reasoning), so the state at the end of the prompt is no prefix of any follow-up. The prefill
saves where every continuation still agrees instead (the assistant header), the boundary after
the reply is rebuilt from there, and a follow-up in a fresh engine resumes from the disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import CheckpointSaved, TokenDelta, TurnDone
from velo_chat.engine.checkpoints.save_points import stable_prefix
from velo_chat.engine.diagnostics import diagnostics

from tests.support.engine_helpers import test_profile
from devkit.gguf_template import with_chat_template
from tests.support.llama_templates import read_template, templates_dir

N = 12
QUESTION = [
    ChatMessage("system", "Be brief."),
    ChatMessage(
        "user",
        " ".join(f"Fact {i}: the sky scatters blue light." for i in range(20)) + " Why is the sky blue?",
    ),
]


@pytest.fixture(scope="module")
def qwen35(qwen_path, tmp_path_factory) -> Path:
    folder = templates_dir()
    if folder is None:
        pytest.skip("llama.cpp's chat templates are unavailable (set VELO_TEST_LLAMA_TEMPLATES)")
    return with_chat_template(
        qwen_path, read_template(folder, "Qwen3.5-4B"), tmp_path_factory.mktemp("save-points") / "qwen35.gguf"
    )


def profile(path: Path, **checkpoints):
    """One token per batch: every path runs the same arithmetic (tests/test_resume.py)."""
    return test_profile(
        path,
        context={"n_batch": 1, "n_ubatch": 1, "n_threads": 1},
        checkpoints={"interval_tokens": 0, **checkpoints},
    )


def run(engine: Engine, messages) -> tuple[list, list[int], TurnDone]:
    events = list(engine.turn(messages, max_tokens=N))
    assert isinstance(events[-1], TurnDone), events[-1]
    return events, [e.token_id for e in events if isinstance(e, TokenDelta)], events[-1]


def cold(path: Path, messages) -> list[int]:
    with Engine(profile(path, enabled=False)) as engine:
        engine.load()
        return run(engine, messages)[1]


def test_the_prefill_saves_where_every_follow_up_agrees(qwen35, tmp_path):
    root = tmp_path / "ckpt"
    with Engine(profile(qwen35), checkpoint_root=root) as engine:
        engine.load()
        prompt = diagnostics(engine).tokens_for(QUESTION)
        stable = stable_prefix(diagnostics(engine).tokens_for, QUESTION, prompt)
        tail = "".join(engine._model.token_text(t) for t in prompt[stable:])
        assert tail == "<think>\n"  # only the generation prompt's opening falls outside
        events, first, done = run(engine, QUESTION)
        saved = [e.tokens for e in events if isinstance(e, CheckpointSaved)]
        # the stable point, not the end minus one (4 tokens on, not worth a second state),
        # then the follow-up boundary rebuilt from it
        assert saved == [stable, saved[-1]] and saved[-1] > stable
        # a regenerate restores the stable point and prefills the generation prompt
        diagnostics(engine).reset()
        _, again, regen = run(engine, QUESTION)
        assert regen.stats.cached_tokens == stable and again == first
        assert diagnostics(engine).flush_checkpoints(60)
    follow = [*QUESTION, ChatMessage("assistant", done.text), ChatMessage("user", "Say it in five words.")]
    with Engine(profile(qwen35), checkpoint_root=root) as fresh:  # a restart
        fresh.load()
        _, tokens, after = run(fresh, follow)
    assert after.stats.source == "disk"
    assert after.stats.cached_tokens == saved[-1]
    assert after.stats.prompt_tokens - after.stats.cached_tokens < 20
    assert tokens == cold(qwen35, follow)
