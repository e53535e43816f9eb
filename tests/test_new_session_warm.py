"""A new session starts warm: the system prompt every session of a profile opens with is saved
once, where the first question's text begins, and the next new session restores it
(`PromptRenderer.shared_prefix`, `checkpoints/save_points.shared_point`, docs/checkpoints.md).

On the tiny hybrid qwen4exp (which reuses a prefix only from a state saved exactly there) with
Qwen3.5's and Qwen3-Coder's real templates, and on SmolLM2: two new sessions with the same long
system prompt and different questions; the second reuses the shared part (its preview says so
first), and so does a third in a fresh engine on the same checkpoint folder (the disk tier).
Each warm reply is compared token by token with a cold run of the same conversation on the same
model. The qwen4exp runs prefill one token per batch; SmolLM2 (slow to prefill on a small
machine) runs 64 tokens per batch with its system prompt padded so that the shared part ends on
a batch boundary: in both cases the warm and the cold prefill cut the prompt into the same
batches, on one thread, so they run the same arithmetic and a difference is a wrong state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from velo_chat.app.screens.chat_turn import resume_line
from velo_chat.engine.checkpoints.save_points import shared_point
from velo_chat.engine.diagnostics import diagnostics
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import (
    CheckpointSaved,
    EngineEvent,
    ResumePreview,
    TokenDelta,
    TurnDone,
    TurnStarted,
)
from velo_chat.engine.live_sequence import RESTORE_MIN_GAIN
from velo_chat.engine.prompt.chat_template import ChatMessage, ChatTemplate, ChatTemplateError
from velo_chat.engine.prompt.rendered import PromptRenderer
from velo_chat.engine.turn_runner import _prefill_stops

from devkit.gguf_template import with_chat_template
from tests.support.engine_helpers import test_profile
from tests.support.llama_templates import read_template, templates_dir

N = 8  # reply tokens
RULES = " ".join(
    f"Rule {i}: keep function {i} under {i * 3 + 20} lines and name its tests after it." for i in range(64)
)
QUESTIONS = ("Which rule is the strictest?", "Summarise rule 7 in one line.", "How long may function 12 be?")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the project.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "The file's path."}},
                "required": ["path"],
            },
        },
    }
]
TEMPLATES = {"qwen35": "Qwen3.5-4B", "coder": "Qwen3-Coder"}
BATCH = {"qwen35": 1, "coder": 1, "smollm2": 64}


@pytest.fixture(scope="module")
def models(qwen_path: Path, smollm2_path: Path, tmp_path_factory) -> dict[str, Path]:
    folder = templates_dir()
    if folder is None:
        pytest.skip("llama.cpp's chat templates are unavailable (set VELO_TEST_LLAMA_TEMPLATES)")
    out = {"smollm2": smollm2_path}
    where = tmp_path_factory.mktemp("new-session-warm")
    for key, name in TEMPLATES.items():
        out[key] = with_chat_template(qwen_path, read_template(folder, name), where / f"{key}.gguf")
    return out


def profile(path: Path, batch: int, **checkpoints):
    """One thread, `batch` tokens per prefill batch, the default `min_prefill_tokens`: a new
    session's short tail saves nothing before its reply, so its prefill is cut as a cold one's."""
    return test_profile(
        path,
        context={"n_batch": batch, "n_ubatch": batch, "n_threads": 1, "n_threads_batch": 1},
        checkpoints={"interval_tokens": 0, "min_prefill_tokens": 256, **checkpoints},
    )


def convo(system: str, question: str) -> list[ChatMessage]:
    return [ChatMessage("system", system), ChatMessage("user", question)]


def shared_of(engine: Engine, messages: Sequence[ChatMessage]) -> int:
    prompt = engine._render(messages, engine._template_variables())
    return len(engine._parts().renderer.shared_prefix(prompt))


def aligned_system(engine: Engine, batch: int) -> str:
    """The rules, padded until the shared part ends on a prefill batch boundary."""
    system = RULES
    for _ in range(4 * batch):
        if shared_of(engine, convo(system, QUESTIONS[0])) % batch == 0:
            return system
        system += " Be precise."
    raise AssertionError("no padding aligns the shared part")


def run(engine: Engine, messages) -> tuple[list[EngineEvent], list[int], TurnStarted, TurnDone]:
    events = list(engine.turn(messages, max_tokens=N))
    started, done = events[0], events[-1]
    assert isinstance(started, TurnStarted) and isinstance(done, TurnDone), events[-1]
    return events, [e.token_id for e in events if isinstance(e, TokenDelta)], started, done


def cold(engine: Engine, messages) -> list[int]:
    """The reply of a cold run on the same loaded model: nothing live, no checkpoints."""
    diag = diagnostics(engine)
    diag.reset()
    with diag.checkpoints_at(None):
        _, tokens, started, _ = run(engine, messages)
    assert started.cached_tokens == 0
    return tokens


def saved(events: Sequence[EngineEvent]) -> list[int]:
    return [e.tokens for e in events if isinstance(e, CheckpointSaved)]


@pytest.fixture
def with_variables(monkeypatch) -> Iterator[Any]:
    """Add template variables (`tools`) to every render of an engine's turns and previews, as
    the engine's own `_template_variables` will when tools are offered."""

    def add(engine: Engine, extra: Mapping[str, Any]) -> None:
        own = engine._template_variables
        monkeypatch.setattr(engine, "_template_variables", lambda *a, **k: {**own(*a, **k), **extra})

    yield add


@pytest.mark.parametrize("model", ["qwen35", "coder", pytest.param("smollm2", marks=pytest.mark.slow)])
def test_the_second_new_session_reuses_the_system_prompt(model, models, tmp_path):
    path, batch, root = models[model], BATCH[model], tmp_path / "ckpt"
    with Engine(profile(path, batch), checkpoint_root=root) as engine:
        engine.load()
        hybrid = engine.info is not None and engine.info.hybrid
        assert hybrid == (model != "smollm2")
        system = aligned_system(engine, batch)
        first, second = convo(system, QUESTIONS[0]), convo(system, QUESTIONS[1])
        shared = shared_of(engine, first)
        assert shared_of(engine, second) == shared > 1400
        assert engine.preview(first).cached_tokens == 0
        events, _, started, _ = run(engine, first)
        assert started.cached_tokens == 0
        assert shared in saved(events)  # the first session saves where every new one agrees
        preview = engine.preview(second)
        assert preview.cached_tokens == preview.shared_prefix_tokens == shared
        assert "(system prompt)" in resume_line(preview, None)
        events, tokens, started, done = run(engine, second)
        assert started.cached_tokens == done.stats.cached_tokens == shared >= 0.95 * shared
        assert started.source == ("ram" if hybrid else "live")
        assert shared not in saved(events)  # restored, not saved again
        assert tokens == cold(engine, second)
        assert diagnostics(engine).flush_checkpoints(60)
    third = convo(system, QUESTIONS[2])
    with Engine(profile(path, batch), checkpoint_root=root) as fresh:  # a new process
        fresh.load()
        preview = fresh.preview(third)
        _, tokens, started, done = run(fresh, third)
        assert preview.cached_tokens == started.cached_tokens == done.stats.cached_tokens == shared
        assert started.source == done.stats.source == "disk"
        assert tokens == cold(fresh, third)


@pytest.mark.parametrize("model", ["qwen35", "coder"])
def test_the_tools_offered_are_part_of_what_new_sessions_share(model, models, tmp_path, with_variables):
    path, root = models[model], tmp_path / "ckpt"
    system = "You edit this project's files. " + RULES
    first, second = convo(system, QUESTIONS[0]), convo(system, QUESTIONS[1])
    with Engine(profile(path, 1), checkpoint_root=root) as engine:
        engine.load()
        plain = shared_of(engine, first)
        with_variables(engine, {"tools": TOOLS})
        shared = shared_of(engine, first)
        assert shared > plain  # the tool definitions are rendered before the first question
        events, _, _, _ = run(engine, first)
        assert shared in saved(events)
        assert engine.preview(second).cached_tokens == shared
        _, tokens, started, _ = run(engine, second)
        assert started.cached_tokens == shared and started.source == "ram"
        assert tokens == cold(engine, second)
    with Engine(profile(path, 1), checkpoint_root=root) as fresh:  # the same system prompt, no tools
        fresh.load()
        _, _, started, _ = run(fresh, second)
        assert started.cached_tokens == 0  # a state with the tools in it is no prefix of this


def test_a_conversation_without_a_system_prompt_saves_no_shared_state(models, tmp_path):
    with Engine(profile(models["qwen35"], 1, min_prefill_tokens=0), checkpoint_root=tmp_path) as engine:
        engine.load()
        messages = [ChatMessage("user", RULES)]
        opening = shared_of(engine, messages)
        assert 0 < opening < RESTORE_MIN_GAIN  # "<|im_start|>user\n": the template's opening alone
        events, _, _, _ = run(engine, messages)
        assert opening not in saved(events)


def test_a_system_prompt_shorter_than_min_prefill_tokens_is_not_saved(models, tmp_path):
    with Engine(profile(models["qwen35"], 1, min_prefill_tokens=4096), checkpoint_root=tmp_path) as engine:
        engine.load()
        messages = convo(RULES, QUESTIONS[0])
        events, _, _, _ = run(engine, messages)
        assert shared_of(engine, messages) not in saved(events)


def test_the_save_points():
    assert _prefill_stops(0, 100, 0, save_last=False, shared=40) == [40, 100]
    assert _prefill_stops(40, 100, 0, save_last=False, shared=40) == [100]  # restored there
    assert _prefill_stops(0, 100, 0, save_last=True, stable=90, shared=40) == [40, 90, 100]
    assert shared_point(1500, 0, 1530, 256) == 1500
    assert shared_point(1500, 1500, 1530, 256) is None  # the turn starts there
    assert shared_point(1500, 1510, 1530, 256) is None  # or past it (a follow-up)
    assert shared_point(200, 0, 1530, 256) is None  # shorter than min_prefill_tokens
    assert shared_point(RESTORE_MIN_GAIN - 1, 0, 1530, 0) is None  # the template's opening


def test_the_preview_line_names_the_system_prompt():
    new = ResumePreview(1530, 1500, 30, "ram", None, 1500)
    assert resume_line(new, None) == "reuses 1,500 cached tokens (system prompt) · prefills 30"
    follow_up = ResumePreview(1800, 1700, 100, "live", None, 1500)
    assert resume_line(follow_up, None) == "reuses 1,700 cached tokens · prefills 100"
    assert (
        resume_line(ResumePreview(1530, 0, 1530, "none", None), None)
        == "reuses 0 cached tokens · prefills 1,530"
    )


CORPUS = templates_dir()
NAMES = sorted(p.stem for p in CORPUS.glob("*.jinja")) if CORPUS else []


@pytest.mark.skipif(CORPUS is None, reason="llama.cpp's chat templates are unavailable")
def test_every_template_shares_the_same_opening_across_questions(smol_engine):
    """For every template of llama.cpp's collection, two new sessions with the same system
    prompt and different questions get the same shared prefix, and it holds the system
    prompt's text where the template renders it before the first question."""
    model = smol_engine._model
    protected = model.prompt_tokenizer.special.protected_texts
    system = "You review code. Say which line is wrong and why, in two sentences at most."
    checked = 0
    for name in NAMES:
        assert CORPUS is not None
        template = ChatTemplate(
            read_template(CORPUS, name),
            bos_token="<s>",
            eos_token="</s>",
            model_name=name,
            protected=protected,
        )
        renderer = PromptRenderer(lambda t=template: t, model.tokenize_segments)
        try:
            a = renderer.render(convo(system, QUESTIONS[0]))
            b = renderer.render(convo(system, QUESTIONS[1]))
        except ChatTemplateError:
            continue  # e.g. a template that refuses a system message
        shared = renderer.shared_prefix(a)
        assert shared == renderer.shared_prefix(b), name
        assert a.tokens[: len(shared)] == shared
        text = "".join(model.token_text(t) for t in shared)
        if system in "".join(s.text for s in a.segments).split(QUESTIONS[0])[0]:
            assert system in text, name
        checked += 1
    assert checked >= len(NAMES) - 5
