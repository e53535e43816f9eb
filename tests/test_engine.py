"""Engine behaviour on the real SmolLM2-135M model (no mocks): events, determinism, cancel,
UTF-8 streaming, stats, prefix reuse of the live context."""

from __future__ import annotations

import threading

import pytest

from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.engine import Engine, PromptTooLong
from velo_chat.engine.turn_runner import Utf8Stream
from velo_chat.engine.events import (
    CheckpointSaved,
    PrefillProgress,
    TokenDelta,
    TurnDone,
    TurnStarted,
)
from velo_chat.engine.diagnostics import diagnostics

from tests.support.engine_helpers import test_profile

QUESTION = [ChatMessage("user", "Write a Python function that reverses a string.")]


def collect(events):
    return list(events)


def done_of(events) -> TurnDone:
    assert isinstance(events[-1], TurnDone), events[-1]
    return events[-1]


def test_greedy_is_deterministic_across_engines(smollm2_path):
    outputs = []
    for _ in range(2):
        with Engine(test_profile(smollm2_path)) as engine:
            engine.load()
            outputs.append(done_of(collect(engine.turn(QUESTION, max_tokens=48))).text)
    assert outputs[0] == outputs[1]
    assert "def" in outputs[0]


def test_events_arrive_in_order_with_consistent_counts(smol_engine):
    diagnostics(smol_engine).reset()
    events = collect(smol_engine.turn(QUESTION, max_tokens=40))
    assert isinstance(events[0], TurnStarted)
    saved = [e for e in events if isinstance(e, CheckpointSaved)]
    # The end of the prefill (minus its last token) and the end of the reply.
    assert [s.tokens for s in saved] == [events[0].prompt_tokens - 1, len(list(smol_engine._live.tokens))]
    assert all(s.bytes > 0 for s in saved)
    events = [e for e in events if not isinstance(e, CheckpointSaved)]
    kinds = [type(e).__name__ for e in events]
    first_token = kinds.index("TokenDelta")
    assert set(kinds[1:first_token]) == {"PrefillProgress"}
    assert set(kinds[first_token:-1]) == {"TokenDelta"}
    started, done = events[0], done_of(events)
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    assert [p.done for p in progress] == sorted(p.done for p in progress)
    assert progress[-1].done == progress[-1].total == started.prefill_tokens
    tokens = [e for e in events if isinstance(e, TokenDelta)]
    s = done.stats
    assert s.decode_tokens == len(tokens)
    assert s.prefill_tokens + s.cached_tokens == s.prompt_tokens == started.prompt_tokens
    assert "".join(t.text for t in tokens) == done.text
    assert s.ttft_s > 0 and s.decode_tok_s > 0 and s.prefill_tok_s > 0
    assert s.llama.eval_ms > 0 and s.llama.prompt_eval_ms > 0
    assert s.llama.graphs_reused > 0
    assert s.finish_reason in ("stop", "length")
    times = [t.t for t in tokens]
    assert times == sorted(times)


def test_follow_up_reuses_the_live_context(smol_engine):
    diagnostics(smol_engine).reset()
    first = done_of(collect(smol_engine.turn(QUESTION, max_tokens=32)))
    convo = QUESTION + [ChatMessage("assistant", first.text), ChatMessage("user", "Now make it handle None.")]
    warm = done_of(collect(smol_engine.turn(convo, max_tokens=32)))
    assert warm.stats.cached_tokens > first.stats.prompt_tokens
    assert warm.stats.source == "live"
    assert warm.stats.prefill_tokens == warm.stats.prompt_tokens - warm.stats.cached_tokens


def test_live_reuse_is_token_identical_to_a_cold_run(smollm2_path):
    """With one token per batch every path runs the same float arithmetic, so any difference
    between the warm follow-up and a cold run could only come from wrongly reused state.
    (With bigger batches llama.cpp's matmuls sum in a different order: cold and warm can then
    part ways on a near tie, which says nothing about the state.)"""
    profile = test_profile(
        smollm2_path, context={"n_batch": 1, "n_ubatch": 1}, checkpoints={"enabled": False}
    )
    with Engine(profile) as engine:
        engine.load()
        first = done_of(collect(engine.turn(QUESTION, max_tokens=24)))
        convo = QUESTION + [
            ChatMessage("assistant", first.text),
            ChatMessage("user", "Now make it handle None."),
        ]
        warm = done_of(collect(engine.turn(convo, max_tokens=24)))
        assert warm.stats.cached_tokens > first.stats.prompt_tokens
        diagnostics(engine).reset()
        cold = done_of(collect(engine.turn(convo, max_tokens=24)))
    assert cold.stats.cached_tokens == 0
    assert cold.text == warm.text


def test_cancel_mid_prefill_stops_within_one_ubatch(smol_engine):
    diagnostics(smol_engine).reset()
    long_prompt = [ChatMessage("user", "Tell me about rivers. " * 120)]
    cancel = threading.Event()
    events = []
    for event in smol_engine.turn(long_prompt, cancel=cancel):
        events.append(event)
        if isinstance(event, PrefillProgress):
            cancel.set()
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    assert len(progress) == 1
    assert progress[0].done == smol_engine._ctx.n_ubatch < progress[0].total
    done = done_of(events)
    assert done.stats.finish_reason == "cancelled"
    assert done.text == "" and done.stats.decode_tokens == 0
    # The prefilled ubatch stays in the live context: the retry reuses it.
    started = events[0]
    assert isinstance(started, TurnStarted)
    retry = done_of(collect(smol_engine.turn(long_prompt, max_tokens=4)))
    assert retry.stats.cached_tokens == started.cached_tokens + smol_engine._ctx.n_ubatch


def test_cancel_mid_decode_stops_within_one_token_and_keeps_text(smol_engine):
    diagnostics(smol_engine).reset()
    cancel = threading.Event()
    deltas = []
    events = []
    for event in smol_engine.turn(QUESTION, cancel=cancel, max_tokens=200):
        events.append(event)
        if isinstance(event, TokenDelta):
            deltas.append(event)
            if len(deltas) == 5:
                cancel.set()
    done = done_of(events)
    assert len(deltas) == 5
    assert done.stats.finish_reason == "cancelled"
    assert done.stats.decode_tokens == 5
    assert done.text == "".join(d.text for d in deltas) != ""


def test_utf8_multibyte_output_is_never_split(smollm2_path):
    profile = test_profile(smollm2_path, checkpoints={"enabled": False})
    prompt = [ChatMessage("user", "Repeat exactly, nothing else: 😀🎉 日本語 ünïcödé 😀🎉 日本語")]
    with Engine(profile) as engine:
        engine.load()
        events = collect(engine.turn(prompt, max_tokens=48))
        deltas = [e for e in events if isinstance(e, TokenDelta)]
        whole = b"".join(engine._model.token_bytes(d.token_id) for d in deltas)
    streamed = "".join(d.text for d in deltas)
    assert streamed == whole.decode("utf-8", "replace") == done_of(events).text
    assert "\ufffd" not in streamed
    assert any(ord(c) > 0x7F for c in streamed), "the model should echo multi-byte characters"


def test_tokens_that_split_a_character_stream_nothing_until_it_completes(smol_engine):
    """Byte-level BPE has tokens holding part of a UTF-8 character: the engine's decoder must
    hold them back rather than emit a replacement character."""
    model = smol_engine._model
    tokens = model.tokenize("😀🎉 日本語 ✓", parse_special=False)
    pieces = [model.token_bytes(t) for t in tokens]
    partial = [p for p in pieces if _incomplete(p)]
    assert partial, "this text should contain tokens with partial characters"
    stream = Utf8Stream()
    out = [stream.feed(p) for p in pieces] + [stream.finish()]
    assert "".join(out) == "😀🎉 日本語 ✓"
    assert all("\ufffd" not in piece for piece in out)
    assert "" in out[:-1]


def _incomplete(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_prompt_longer_than_context_is_rejected_before_any_event(smol_engine):
    too_long = [ChatMessage("user", "word " * 5000)]
    with pytest.raises(PromptTooLong, match="context holds 2,048"):
        smol_engine.turn(too_long)


def test_max_tokens_and_sampling_options(smol_engine):
    diagnostics(smol_engine).reset()
    done = done_of(collect(smol_engine.turn(QUESTION, max_tokens=3)))
    assert done.stats.decode_tokens == 3 and done.stats.finish_reason == "length"
    from velo_chat.engine.config.profile_schema import SamplingSettings

    hot = SamplingSettings(
        temperature=0.9, top_p=0.9, top_k=40, min_p=0.05, seed=7, repeat_penalty=1.1, max_tokens=24
    )
    a = done_of(collect(smol_engine.turn(QUESTION, sampling=hot))).text
    b = done_of(collect(smol_engine.turn(QUESTION, sampling=hot))).text
    assert a == b, "the same seed gives the same sample"


def test_threads_never_exceed_the_usable_cores(smollm2_path):
    from velo_chat.engine.llama.context import resolve_threads, usable_cores

    assert resolve_threads(0) == usable_cores()
    assert resolve_threads(10_000) == usable_cores()
    assert resolve_threads(1) == 1


def test_a_model_without_chat_template_is_a_clear_error():
    from velo_chat.engine.prompt.chat_template import ChatTemplate, ChatTemplateError

    with pytest.raises(ChatTemplateError, match="has no chat template"):
        ChatTemplate(None, bos_token="", eos_token="", model_name="m.gguf")
    with pytest.raises(ChatTemplateError, match="cannot parse"):
        ChatTemplate("{% for %}", bos_token="", eos_token="")
    raising = ChatTemplate("{{ raise_exception('roles must alternate') }}", bos_token="", eos_token="")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        raising.render([ChatMessage("user", "hi")])


def test_the_engine_prints_nothing(smollm2_path, capfd):
    with Engine(test_profile(smollm2_path, checkpoints={"enabled": False})) as engine:
        engine.load()
        diagnostics(engine).complete(QUESTION, max_tokens=4)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
