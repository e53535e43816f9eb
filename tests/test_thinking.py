"""Thinking controls and the reasoning/answer split (docs/thinking.md).

Templates come from llama.cpp's collection (`llama_templates.py`), read through `ChatTemplate`:
which variable turns thinking on and off, which takes a level, what the template does by
default, and what a turn renders with. The engine runs on the tiny hybrid qwen4exp given the
real Qwen3.5 template, whose generation prompt opens a reasoning block (`<think>\\n`): the reply
starts inside the reasoning; with thinking off the template closes the block itself and the
reply is all answer. The splitter is fed the real tokenizer's pieces.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from velo_chat.app.conversation import engine_messages, record, start_turn
from velo_chat.engine.prompt.chat_template import ChatMessage, ChatTemplate
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import TokenDelta, TurnDone, TurnStarted
from velo_chat.engine.config.profile_schema import ReasoningSettings
from velo_chat.engine.prompt.thinking import ReasoningSplitter, requested
from velo_chat.engine.reply import Reply
from velo_chat.store import SessionStore
from velo_chat.engine.diagnostics import diagnostics

from tests.support.engine_helpers import run_cli, test_profile
from devkit.gguf_template import with_chat_template
from tests.support.llama_templates import read_template
from tests import test_untrusted_text

llama_templates = test_untrusted_text.llama_templates  # the fixture (skips without them)
CHATML = ["<|im_start|>", "<|im_end|>"]
OFF = ReasoningSettings(enabled="off")


def template(folder: Path, name: str) -> ChatTemplate:
    return ChatTemplate(read_template(folder, name), bos_token="", eos_token="<|im_end|>", protected=CHATML)


# -- what each template offers ---------------------------------------------------------------------

CONTROLS = {  # name: (switch, effort, default_on, open marker)
    "Qwen-Qwen3-0.6B": ("enable_thinking", None, True, "<think>"),
    "Qwen3.5-4B": ("enable_thinking", None, True, "<think>"),
    "GLM-4.7-Flash": ("enable_thinking", None, True, "<think>"),
    "deepseek-ai-DeepSeek-V3.1": ("enable_thinking", None, False, "<think>"),
    "deepseek-ai-DeepSeek-V4": ("enable_thinking", "reasoning_effort", False, "<think>"),
    "ibm-granite-granite-3.3-2B-Instruct": ("thinking", None, False, "<think>"),
    "google-gemma-4-31B-it": ("enable_thinking", None, False, "<|channel>thought"),
    "MiniMax-M3": ("thinking_mode", None, None, "<mm:think>"),
    "openai-gpt-oss-120b": (None, "reasoning_effort", None, "<think>"),
    "tencent-Hy3": (None, "reasoning_effort", False, "<think>"),
    "ByteDance-Seed-OSS": (None, None, None, "<seed:think>"),
    "Qwen-Qwen2.5-7B-Instruct": (None, None, None, "<think>"),
}


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_each_template_names_its_thinking_controls(llama_templates, name):
    support = template(llama_templates, name).thinking
    assert (support.switch, support.effort, support.default_on, support.open_marker) == CONTROLS[name]


def test_the_switch_and_the_level_reach_the_template(llama_templates):
    qwen35 = template(llama_templates, "Qwen3.5-4B")
    question = [ChatMessage("user", "Hi")]
    support = qwen35.thinking
    assert support.variables(*requested(OFF)) == {"enable_thinking": False}
    assert support.variables(*requested(ReasoningSettings())) == {}  # auto: the default
    default = qwen35.render(question)
    off = qwen35.render(question, variables=support.variables(False, None))
    assert support.opens_reasoning(default) and default.endswith("<think>\n")
    assert not support.opens_reasoning(off) and off.endswith("<think>\n\n</think>\n\n")

    gpt_oss = template(llama_templates, "openai-gpt-oss-120b")
    effort = gpt_oss.thinking.variables(*requested(ReasoningSettings(effort="high")))
    assert effort == {"reasoning_effort": "high"}
    assert "Reasoning: high" in gpt_oss.render(question, variables=effort)
    assert "Reasoning: medium" in gpt_oss.render(question)  # its own default

    v4 = template(llama_templates, "deepseek-ai-DeepSeek-V4").thinking
    assert v4.variables(True, "max") == {"enable_thinking": True, "reasoning_effort": "max"}
    assert v4.variables(False, "max") == {"enable_thinking": False}  # no level when off

    # Hy3 has levels but no switch: "no_think" is its off, on is a thinking level
    hy3 = template(llama_templates, "tencent-Hy3").thinking
    assert "no_think" in hy3.levels and hy3.can_switch
    assert hy3.variables(False, "high") == {"reasoning_effort": "no_think"}
    assert hy3.variables(True, "low") == {"reasoning_effort": "low"}
    assert hy3.variables(True, None)["reasoning_effort"] != "no_think"

    plain = template(llama_templates, "Qwen-Qwen2.5-7B-Instruct").thinking
    assert not plain.can_switch and plain.variables(True, "high") == {}


def test_a_replys_reasoning_is_message_text_in_the_history(llama_templates):
    """`reasoning_content` goes where the template puts it, and it is tokenized as text: control
    text in the reasoning is a plain segment like the answer's."""
    qwen3 = template(llama_templates, "Qwen-Qwen3-0.6B")
    reply = ChatMessage("assistant", "A1", reasoning_content="R1 <|im_end|> still thinking")
    history = [ChatMessage("user", "Q1"), reply]
    assert qwen3.render(history, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\nR1 <|im_end|> still thinking\n</think>\n\nA1<|im_end|>\n"
    )
    segments = qwen3.segments(history, add_generation_prompt=False)
    assert [s.text for s in segments if s.plain] == ["Q1", "R1 <|im_end|> still thinking", "A1"]
    scaffold = "".join(s.text for s in segments if not s.plain)
    assert scaffold.count("<|im_end|>") == 2
    # an earlier reply: Qwen3 keeps only the answer
    later = qwen3.render([*history, ChatMessage("user", "Q2")])
    assert "R1" not in later and "<|im_start|>assistant\nA1<|im_end|>" in later


# -- the splitter on real token pieces -------------------------------------------------------------


def pieces(engine: Engine, text: str) -> list[str]:
    model = engine._model
    return [model.token_bytes(t).decode() for t in model.tokenize(text, parse_special=False)]


@dataclasses.dataclass
class Split:
    """A reply split as a turn splits it: the splitter's pieces, added up by a `Reply` (each
    piece as the `TokenDelta` a turn yields for it, the held-back text at the end)."""

    splitter: ReasoningSplitter
    reply: Reply = dataclasses.field(default_factory=Reply)

    def feed(self, text: str, *, control: str = "", t: float = 0.0):
        piece = self.splitter.feed(text, control=control)
        self.reply.add(TokenDelta(piece.answer, 0, t, piece.reasoning, piece.in_reasoning))
        return piece

    def finish(self, t: float = 0.0):
        piece = self.splitter.finish()
        self.reply.add_held(piece.answer, piece.reasoning, t)
        return piece

    reasoning = property(lambda self: self.reply.reasoning)
    answer = property(lambda self: self.reply.text)
    reasoning_tokens = property(lambda self: self.splitter.reasoning_tokens)
    first_answer_t = property(lambda self: self.reply.t_first_answer)


def split(parts: list[str], inside: bool = False) -> tuple[Split, list]:
    s = Split(ReasoningSplitter(inside=inside))
    out = [s.feed(p, t=float(i)) for i, p in enumerate(parts)]
    out.append(s.finish(t=99.0))
    return s, out


def test_the_splitter_follows_markers_cut_across_tokens(smol_engine):
    reply = "<think>\nplan: <|im_end|> is text\n\n</think>\n\nThe answer."
    parts = pieces(smol_engine, reply)
    assert "<think>" not in parts  # SmolLM2 has no such token: the marker spans several
    s, out = split(parts)
    assert (s.reasoning, s.answer) == ("plan: <|im_end|> is text", "The answer.")
    close = next(i for i in range(len(parts)) if "".join(parts[: i + 1]).endswith("</think>"))
    assert s.reasoning_tokens == close + 1  # the opening and closing markers count
    assert [p.in_reasoning for p in out[close + 1 : -1]] == [False] * (len(parts) - close - 1)
    first = next(i for i in range(close + 1, len(parts)) if parts[i].strip("\n"))
    assert s.first_answer_t == float(first)  # the newlines after "</think>" are not answer text

    # a prompt that ends in "<think>\n": the reply starts inside the reasoning
    s, _ = split(pieces(smol_engine, "plan\n</think>\n\nOK"), inside=True)
    assert (s.reasoning, s.answer) == ("plan", "OK")
    # no block at the start: all answer, byte for byte (a later "<think>" is text)
    text = "  Sure. <think> is a tag.\n"
    s, _ = split(pieces(smol_engine, text))
    assert (s.reasoning, s.answer, s.reasoning_tokens) == ("", text, 0)
    # a reply cut inside its reasoning, and one that stops on half a marker
    assert split(pieces(smol_engine, "<think>\nhalf a tho"))[0].reasoning == "half a tho"
    assert split(pieces(smol_engine, "<thi"))[0].answer == "<thi"


def test_a_marker_that_is_a_control_token_still_splits():
    s = Split(ReasoningSplitter("<|START_THINKING|>", "<|END_THINKING|>"))
    s.feed("", control="<|START_THINKING|>")
    s.feed("why")
    s.feed("", control="<|END_THINKING|>")
    s.feed("because")
    s.finish()
    assert (s.reasoning, s.answer, s.reasoning_tokens) == ("why", "because", 3)
    # Gemma 4: the opening marker is a control token and then text
    s = Split(ReasoningSplitter("<|channel>thought", "<channel|>"))
    for text, control in (
        ("", "<|channel>"),
        ("thought", ""),
        ("\nwhy", ""),
        ("", "<channel|>"),
        ("because", ""),
        ("", "<channel|>"),
    ):
        s.feed(text, control=control)
    s.finish()
    assert (s.reasoning, s.answer, s.reasoning_tokens) == ("why", "because", 4)


# -- turns on a real model ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen35_model(qwen_path, llama_templates, tmp_path_factory) -> Path:
    """The tiny hybrid qwen4exp with the real Qwen3.5 template."""
    return with_chat_template(
        qwen_path,
        read_template(llama_templates, "Qwen3.5-4B"),
        tmp_path_factory.mktemp("qwen35") / "qwen35.gguf",
    )


def turn(engine: Engine, messages: list[ChatMessage], **kw) -> list:
    events = list(engine.turn(messages, max_tokens=12, **kw))
    assert isinstance(events[-1], TurnDone), events[-1]
    return events


QUESTION = [ChatMessage("user", "Why is the sky blue?")]


def test_a_turn_splits_reasoning_and_answer_and_counts_both(qwen35_model, tmp_path):
    with Engine(test_profile(qwen35_model), checkpoint_root=tmp_path / "ckpt") as engine:
        engine.load()
        assert engine.thinking_support().default_on is True
        # thinking (the template's default): the generation prompt opened the block
        events = turn(engine, QUESTION)
        done, deltas = events[-1], [e for e in events if isinstance(e, TokenDelta)]
        assert done.text == "" and done.reasoning
        assert all(d.in_reasoning and d.text == "" for d in deltas)
        assert done.reasoning == "".join(d.reasoning for d in deltas).strip("\n")
        stats = done.stats
        assert stats.reasoning_tokens == stats.decode_tokens == 12
        assert stats.answer_tokens == 0 and stats.first_answer_s is None
        assert stats.to_json()["reasoning_tokens"] == 12

        # thinking off: the template closes the block, the reply is all answer
        diagnostics(engine).reset()
        preview = engine.preview(QUESTION, reasoning=OFF)
        events = turn(engine, QUESTION, reasoning=OFF)
        started, done = events[0], events[-1]
        assert isinstance(started, TurnStarted)
        assert preview.prompt_tokens == started.prompt_tokens  # the preview renders the same
        assert preview.prompt_tokens > engine.preview(QUESTION).prompt_tokens  # "</think>\n\n"
        assert done.reasoning == "" and done.text
        assert done.text == "".join(e.text for e in events if isinstance(e, TokenDelta))
        assert done.stats.reasoning_tokens == 0 and done.stats.answer_tokens == 12
        assert 0 < done.stats.first_answer_s and done.stats.ttft_s <= done.stats.first_answer_s


def test_reasoning_is_stored_apart_and_the_follow_up_matches_cold(qwen35_model, tmp_path):
    """Turn 1 thinks and is stored (answer and reasoning apart); the follow-up, built from the
    store and resumed from the engine's state, is token for token what a cold engine says."""
    profile = test_profile(
        qwen35_model, context={"n_batch": 1, "n_ubatch": 1}, checkpoints={"interval_tokens": 0}
    )
    with (
        SessionStore(tmp_path / "sessions.db") as store,
        Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine,
    ):
        engine.load()
        first = start_turn(
            store, engine, session=None, profile=profile, text=QUESTION[0].content, max_tokens=12
        )
        done = [e for e in record(first.events, first.recorded)][-1]
        reply = store.messages(first.session.id)[-1]
        assert (reply.content, reply.reasoning) == (done.text, done.reasoning)
        assert reply.reasoning and reply.stats["reasoning_tokens"] == 12
        history = engine_messages("", store.messages(first.session.id))
        assert history[-1] == ChatMessage("assistant", done.text, done.reasoning)
        follow_up = [*history, ChatMessage("user", "And at sunset?")]
        warm = turn(engine, follow_up)[-1]
        assert warm.stats.cached_tokens > 0
    with Engine(
        dataclasses.replace(profile, checkpoints=dataclasses.replace(profile.checkpoints, enabled=False))
    ) as cold_engine:
        cold_engine.load()
        cold = turn(cold_engine, follow_up)[-1]
    assert (warm.text, warm.reasoning) == (cold.text, cold.reasoning)


def test_ask_prints_the_answer_on_stdout_and_the_reasoning_on_stderr(qwen35_model, velo_home):
    out = run_cli("ask", "--model", str(qwen35_model), "--max-tokens", "8", "--json", "Hi")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["text"] == "" and doc["reasoning"]
    assert doc["stats"]["reasoning_tokens"] == 8 and doc["stats"]["answer_tokens"] == 0
    plain = run_cli("ask", "--model", str(qwen35_model), "--max-tokens", "8", "Hi")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == "\n" and doc["reasoning"] in plain.stderr
