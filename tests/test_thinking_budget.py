"""The thinking budget (`reasoning.budget_tokens`, `reasoning.budget_message`; docs/thinking.md).

Turns run on the tiny hybrid qwen4exp given real thinking templates from llama.cpp's collection
(Qwen3.5, DeepSeek R1, GLM-4.7), whose generation prompts open the reasoning block: the reply
starts inside it, so every token counts against the budget. After exactly the budget the engine
writes the template's closing itself (and the message before it), and the answer follows. The
follow-up after such a turn is compared with a cold render of the same conversation, the engines
prefilling one token per batch on one thread (so a difference is a wrong state, not a near tie;
tests/support/template_corpus.py). A template without known reasoning markers (SmolLM2's,
gpt-oss's channels) refuses a budget in one line.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from velo_chat.app.conversation import engine_messages, record, start_turn
from velo_chat.engine import ProfileError
from velo_chat.engine import turn_runner
from velo_chat.engine.config.profile_schema import Profile, ReasoningSettings
from velo_chat.engine.diagnostics import diagnostics
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import TokenDelta, TurnDone, TurnStarted, TurnStats
from velo_chat.engine.prompt.chat_template import ChatMessage, ChatTemplate
from velo_chat.engine.prompt.thinking import ReasoningBudget, closing_text
from velo_chat.engine.remote.engine import request_body
from velo_chat.store import SessionStore

from devkit.gguf_template import with_chat_template
from tests.support.engine_helpers import run_cli, test_profile
from tests.support.llama_templates import read_template
from tests.support.spec_helpers import forcing_stepper, on_gpu, oracle_session, run_turn, spec_engine
from tests import test_untrusted_text

llama_templates = test_untrusted_text.llama_templates  # the fixture (skips without them)

QWEN35, R1, GLM47 = "Qwen3.5-4B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "GLM-4.7-Flash"
TEMPLATES = {  # name: (reasoning.enabled that makes it think, the closing it writes)
    QWEN35: ("auto", "\n</think>\n\n"),
    R1: ("on", "\n</think>\n\n"),  # drops a reply's reasoning when rendered: the common closing
    GLM47: ("auto", "</think>"),
}
QUESTION = [ChatMessage("user", "Why is the sky blue?")]
MESSAGE = "Time is up; answering now."
BUDGET = 6
ONE_BY_ONE = {"n_batch": 1, "n_ubatch": 1, "n_threads": 1, "n_threads_batch": 1}


def template(folder: Path, name: str) -> ChatTemplate:
    return ChatTemplate(read_template(folder, name), bos_token="", eos_token="<|im_end|>")


@pytest.fixture(scope="module")
def models(qwen_path, llama_templates, tmp_path_factory) -> dict[str, Path]:
    """The tiny qwen4exp with each thinking template in its GGUF metadata."""
    folder = tmp_path_factory.mktemp("budget-models")
    return {
        name: with_chat_template(qwen_path, read_template(llama_templates, name), folder / f"{i}.gguf")
        for i, name in enumerate(TEMPLATES)
    }


def reply(engine: Engine, messages: list[ChatMessage], **kw) -> tuple[list[int], TurnDone]:
    events = list(engine.turn(messages, **kw))
    done = events[-1]
    assert isinstance(done, TurnDone), done
    return [e.token_id for e in events if isinstance(e, TokenDelta)], done


def text_of(engine: Engine, ids: list[int]) -> str:
    model = engine._require()[0]
    return b"".join(model.token_bytes(t) for t in ids).decode("utf-8", errors="replace")


def closing_tokens(engine: Engine, closing: str, before: str) -> list[int]:
    """The closing's tokens as the template writes it; a reasoning that ended its line gets
    no blank line before the marker."""
    if before.endswith("\n"):
        closing = closing.lstrip("\n") if closing.startswith("\n") else closing
    return engine._require()[0].tokenize(closing, add_special=False, parse_special=True)


def marker_tokens(engine: Engine, closing: list[int]) -> int:
    """How many of the closing's tokens it takes to complete "</think>" (the reasoning's)."""
    return next(k for k in range(1, len(closing) + 1) if "</think>" in text_of(engine, closing[:k]))


# -- the templates ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_closing_is_what_the_template_writes_after_a_replys_reasoning(llama_templates, name):
    chat = template(llama_templates, name)
    support = chat.thinking
    assert support.markers_found and support.close_marker == "</think>"
    variables = support.variables(True, None)

    def render(answer: str, reasoning: str) -> str:
        convo = [ChatMessage("user", "Hi"), ChatMessage("assistant", answer, reasoning)]
        return chat.render(convo, add_generation_prompt=False, variables=variables)

    assert closing_text(support, render) == TEMPLATES[name][1]
    assert closing_text(support, None) == "\n</think>\n\n"


@pytest.mark.parametrize("name", ["openai-gpt-oss-120b", "Qwen-Qwen2.5-7B-Instruct"])
def test_templates_without_reasoning_markers_say_so(llama_templates, name):
    assert not template(llama_templates, name).thinking.markers_found


def test_the_message_gets_a_line_and_the_closing_no_blank_line():
    budget = ReasoningBudget(4, "", "\n</think>\n\n")
    assert budget.written_after("so the light") == ("", "\n</think>\n\n")
    assert budget.written_after("so the light\n") == ("", "</think>\n\n")
    assert ReasoningBudget(4, "", "</think>").written_after("x\n") == ("", "</think>")
    told = ReasoningBudget(4, "Time is up.", "\n</think>\n\n")
    assert told.written_after("so the light") == ("\nTime is up.", "\n</think>\n\n")
    assert told.written_after("so the light\n") == ("Time is up.", "\n</think>\n\n")


# -- turns on the tiny qwen4exp -----------------------------------------------------------------


def test_reasoning_ends_at_exactly_the_budget_then_the_closing(models, tmp_path):
    """Qwen3.5 opens the reasoning in its generation prompt: the first BUDGET tokens are what
    the model says without a budget, then the closing tokens, then the answer; the reasoning
    and the answer are split as generated."""
    with Engine(test_profile(models[QWEN35]), checkpoint_root=tmp_path / "ckpt") as engine:
        engine.load()
        free, unbounded = reply(engine, QUESTION, max_tokens=24)
        assert not unbounded.stats.reasoning_budget_hit and unbounded.text == ""  # still thinking
        diagnostics(engine).reset()
        ids, done = reply(engine, QUESTION, max_tokens=24, reasoning=ReasoningSettings(budget_tokens=BUDGET))
        sampled = text_of(engine, ids[:BUDGET])
        closing = closing_tokens(engine, "\n</think>\n\n", sampled)
        n_marker = marker_tokens(engine, closing)
        assert ids[:BUDGET] == free[:BUDGET]  # the budget changes nothing before it
        assert ids[BUDGET : BUDGET + len(closing)] == closing
        stats = done.stats
        assert stats.reasoning_budget_hit and stats.reasoning_tokens == BUDGET + n_marker
        assert stats.decode_tokens == 24 and stats.answer_tokens == 24 - BUDGET - n_marker
        assert done.reasoning == sampled.strip("\n")
        assert done.text and done.text == text_of(engine, ids[BUDGET + n_marker :]).lstrip("\n")
        assert stats.to_json()["reasoning_budget_hit"] is True
        assert TurnStats.from_json(stats.to_json()).reasoning_budget_hit
        assert "reasoning_budget_hit" not in unbounded.stats.to_json()  # rows stay as they were

        # thinking off: no reasoning, nothing to cut
        diagnostics(engine).reset()
        _, off = reply(
            engine, QUESTION, max_tokens=8, reasoning=ReasoningSettings(enabled="off", budget_tokens=2)
        )
        assert off.reasoning == "" and not off.stats.reasoning_budget_hit


def budget_profile(model: Path, name: str, **context) -> Profile:
    enabled = TEMPLATES[name][0]
    message = MESSAGE if name == GLM47 else ""
    return test_profile(
        model,
        context={**ONE_BY_ONE, **context},
        sampling={"max_tokens": 20},
        reasoning={"enabled": enabled, "budget_tokens": 5, "budget_message": message},
        checkpoints={"interval_tokens": 0, "min_prefill_tokens": 0, "disk_budget_gib": 0.0},
    )


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_follow_up_after_a_cut_resumes_as_a_cold_render(models, tmp_path, name):
    """Turn 1 is cut by the budget and stored (reasoning and answer apart, the message with
    the reasoning); the context it leaves is the start of a cold render of the follow-up, and
    the follow-up's tokens are a cold engine's, token for token."""
    profile = budget_profile(models[name], name)
    with (
        SessionStore(tmp_path / "sessions.db") as store,
        Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine,
    ):
        engine.load()
        first = start_turn(store, engine, session=None, profile=profile, text=QUESTION[0].content)
        done = list(record(first.events, first.recorded))[-1]
        assert isinstance(done, TurnDone) and done.stats.reasoning_budget_hit
        stored = store.messages(first.session.id)[-1]
        assert (stored.content, stored.reasoning) == (done.text, done.reasoning)
        assert stored.stats["reasoning_budget_hit"] is True
        if profile.reasoning.budget_message:
            assert done.reasoning.endswith("\n" + MESSAGE)  # on a line of its own
        history = engine_messages("", store.messages(first.session.id))
        follow_up = [*history, ChatMessage("user", "And at sunset?")]
        live = engine._require()[2].tokens
        assert (
            list(live)
            == diagnostics(engine).tokens_for(follow_up, diagnostics(engine).template_variables())[
                : len(live)
            ]
        )
        events = list(engine.turn(follow_up))
        started = next(e for e in events if isinstance(e, TurnStarted))
        assert started.cached_tokens > 0
        warm = [e.token_id for e in events if isinstance(e, TokenDelta)], events[-1]
    cold_profile = dataclasses.replace(
        profile, checkpoints=dataclasses.replace(profile.checkpoints, enabled=False)
    )
    with Engine(cold_profile) as cold_engine:
        cold_engine.load()
        cold = reply(cold_engine, follow_up)
    assert warm[0] == cold[0]
    assert (warm[1].text, warm[1].reasoning) == (cold[1].text, cold[1].reasoning)
    assert warm[1].stats.reasoning_budget_hit == cold[1].stats.reasoning_budget_hit


@pytest.mark.parametrize("drafts", ["up to the budget", "past the budget"])
def test_speculation_cuts_at_the_same_token(models, tmp_path, monkeypatch, drafts):
    """Drafted from the unbounded reply (an oracle that goes on thinking), verify batches
    would accept tokens past the budget: the stepper drafts no further than the budget, and a
    batch that went past it anyway (a stepper told to ignore the budget) is cut back there.
    Either way the reply and the context are plain decoding's."""
    model = models[QWEN35]
    plain = spec_engine(model, tmp_path / "a", spec=False)
    spec = spec_engine(model, tmp_path / "b", spec=True)
    budget = ReasoningSettings(budget_tokens=BUDGET)
    try:
        free = run_turn(plain, QUESTION, max_tokens=24)[0]
        diagnostics(plain).reset()
        a = run_turn(plain, QUESTION, max_tokens=24, reasoning=budget)
        forced = forcing_stepper(oracle_session(spec, QUESTION, free))
        if drafts == "past the budget":

            class PastTheBudget(forced):  # type: ignore[misc,valid-type]
                def step(self, token: int, room: int) -> list[int]:
                    return super().step(token, room + 8)

            forced = PastTheBudget
        monkeypatch.setattr(turn_runner, "SpecStepper", forced)
        b = run_turn(spec, QUESTION, max_tokens=24, reasoning=budget)
        for ids, done, _context in (a, b):
            closing = closing_tokens(spec, "\n</think>\n\n", text_of(spec, ids[:BUDGET]))
            assert ids[BUDGET : BUDGET + len(closing)] == closing and done.stats.reasoning_budget_hit
        st = b[1].stats.speculation
        assert st.rounds > 0 and st.accepted > 0
        if not on_gpu(spec):  # the CPU: the same tokens as plain decoding, to the bit
            assert b[0] == a[0] and b[2] == a[2]
            assert b[0][:BUDGET] == free[:BUDGET]
    finally:
        plain.close()
        spec.close()


# -- refused where the markers are unknown ------------------------------------------------------


def test_a_budget_on_a_template_without_markers_is_refused_in_one_line(smol_engine):
    with pytest.raises(ProfileError) as refused:
        smol_engine.turn(QUESTION, reasoning=ReasoningSettings(budget_tokens=4))
    message = str(refused.value)
    assert "reasoning.budget_tokens" in message and "\n" not in message
    # thinking turned off: there is no reasoning to budget, so nothing to refuse
    diagnostics(smol_engine).reset()
    _, done = reply(
        smol_engine, QUESTION, max_tokens=2, reasoning=ReasoningSettings(enabled="off", budget_tokens=4)
    )
    assert not done.stats.reasoning_budget_hit


def test_ask_thinking_budget(models, velo_home):
    """`ask --thinking-budget N` overrides the profile: cut on a thinking template, refused in
    one line (exit 2, nothing stored) on SmolLM2."""
    out = run_cli(
        "ask", "--model", str(models[QWEN35]), "--thinking-budget", "3", "--max-tokens", "12", "--json", "Hi"
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["stats"]["reasoning_budget_hit"] is True and doc["reasoning"] and doc["text"]
    refused = run_cli("ask", "--thinking-budget", "4", "Hi")
    assert refused.returncode == 2 and refused.stdout == ""
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "reasoning.budget_tokens = 4" in lines[0]
    listed = run_cli("sessions", "list", "--json")
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 1  # only the first ask's


# -- a remote server keeps its own budget -------------------------------------------------------


def test_a_remote_turn_asks_the_server_for_the_budget(smollm2_path):
    profile = test_profile(smollm2_path)
    with_budget = ReasoningSettings(budget_tokens=64, budget_message="Enough.")
    extra = request_body(profile, "m", QUESTION, profile.sampling, with_budget)["extra_body"]
    assert (extra["thinking_budget_tokens"], extra["thinking_budget_message"]) == (64, "Enough.")
    for settings in (ReasoningSettings(), ReasoningSettings(enabled="off", budget_tokens=64)):
        extra = request_body(profile, "m", QUESTION, profile.sampling, settings)["extra_body"]
        assert "thinking_budget_tokens" not in extra
