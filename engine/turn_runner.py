"""One turn, as a generator of events: start from the best prefix, prefill, decode, save.

Save points (when checkpoints are on): every `interval_tokens` absolute positions inside a long
prefill; the state before the reply, at the end of the prefill *minus its last token* (a restored
state carries no logits, so a regenerate restores there and decodes that one token to get them);
and the follow-up boundary after the reply. The last prompt token is therefore always decoded on
its own, cold or restored alike, so both paths run the same arithmetic.

On a hybrid model the state before the reply is saved earlier when the conversation's next turn
will not keep the whole prompt (`save_points.py`: thinking templates rewrite the reply and drop
the generation prompt's `<think>`): where every continuation still agrees with it. The end of the
prompt minus one is then saved as well only when it is more than `RESTORE_MIN_GAIN` tokens
further; otherwise a regenerate restores the earlier state and prefills those few tokens in the
same batch a cold run does.
"""

from __future__ import annotations

import codecs
import logging
import time
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .events import (
    CheckpointSaved,
    EngineEvent,
    EngineWarning,
    PrefillProgress,
    TokenDelta,
    TurnDone,
    TurnFailed,
    TurnStarted,
    TurnStats,
)
from .chat_template import ChatMessage
from .llama_context import DecodeError
from .config.profile_schema import SamplingSettings
from .sampling import Sampler
from .save_points import stable_prefix
from .thinking import ReasoningSplitter, ThinkingSupport

if TYPE_CHECKING:
    from .engine import Engine


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


log = logging.getLogger(__name__)


class Utf8Stream:
    """Turns token bytes into text without ever splitting a character: bytes of an unfinished
    UTF-8 sequence wait for the token that completes them."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data, False)

    def finish(self) -> str:
        return self._decoder.decode(b"", True)


@dataclass(frozen=True)
class TurnPlan:
    messages: tuple[ChatMessage, ...]
    tokens: list[int]
    sampling: SamplingSettings
    cancel: threading.Event
    t_start: float
    ignore_eos: bool
    variables: Mapping[str, Any] = field(default_factory=dict)  # extra template variables
    thinking: ThinkingSupport = field(default_factory=ThinkingSupport)  # reasoning markers
    opens_in_reasoning: bool = False  # the generation prompt ends inside a reasoning block

    def splitter(self) -> ReasoningSplitter:
        """Splits this turn's reply into reasoning and answer."""
        return ReasoningSplitter(
            self.thinking.open_marker, self.thinking.close_marker, inside=self.opens_in_reasoning
        )


def _prepare(engine: Engine, tokens: list[int]) -> tuple[int, str, float]:
    """Make the context hold the best usable prefix of `tokens`; return (n, source, restore_s).

    A checkpoint that fails to restore is dropped by its tier (with a warning) and the next
    best is tried; the last resort is a cold prefill."""
    ctx = engine.ctx
    assert ctx is not None
    for _attempt in range(4):
        n, source, cand = engine._plan(tokens)
        if cand is None or engine.checkpoints is None:
            break
        restored = engine.checkpoints.restore(ctx, cand)
        if restored is not None:
            engine.live_tokens = list(tokens[: restored.n_tokens])
            return restored.n_tokens, source, restored.seconds
        engine.live_tokens = []  # the failed restore emptied the context
    else:
        n, source = 0, "none"
    live = engine.live_tokens
    if n == 0:
        ctx.clear()
        live.clear()
        source = "none"
    elif n < len(live):
        if ctx.truncate(n):
            del live[n:]
        else:
            ctx.clear()
            live.clear()
            return 0, "none", 0.0
    return n, source, 0.0


def _prefill_stops(
    start: int, end: int, interval: int, save_last: bool, stable: int | None = None
) -> list[int]:
    """Positions where the prefill pauses to save a checkpoint (the last one is `end`).
    `stable`: how much of the prompt every continuation keeps (hybrid models, `save_points.py`);
    when that is less than `end - 1`, the state before the reply is saved there."""
    from .engine import RESTORE_MIN_GAIN  # late: engine imports this module

    stops: set[int] = {end}
    if save_last and end - 1 > start:
        if stable is not None and start < stable < end - 1:
            stops.add(stable)
            if end - 1 - stable > RESTORE_MIN_GAIN:
                stops.add(end - 1)
        else:
            stops.add(end - 1)
    if interval > 0:
        first = (start // interval + 1) * interval
        stops.update(range(first, end - 1, interval))
    return sorted(s for s in stops if s > start)


def follow_up_prefix(
    engine: Engine,
    messages: tuple[ChatMessage, ...],
    reply: str,
    *,
    reasoning: str = "",
    variables: Mapping[str, Any] | None = None,
) -> list[int]:
    """The tokens every follow-up to this reply starts with: the conversation as the template
    renders it with the reply (its answer, and its reasoning as `reasoning_content`) in the
    history, up to where the next user message's text begins.

    Found by rendering two follow-ups that differ only in that text; the template's own closing
    and opening tokens ("<|im_end|>\n<|im_start|>user\n") are part of it."""
    history = [*messages, ChatMessage("assistant", reply, reasoning)]
    a = engine.tokens_for([*history, ChatMessage("user", "A")], variables)
    b = engine.tokens_for([*history, ChatMessage("user", "B")], variables)
    return a[: common_prefix(a, b)]


def close_boundary(
    engine: Engine, plan: TurnPlan, reply: str, n_generated: int, *, reasoning: str = ""
) -> bool:
    """Bring the live context to the follow-up boundary so the next turn (and a checkpoint
    saved here) starts exactly where a cold render of the conversation would.

    Usually that is a few template tokens after the reply. When the reply's text tokenizes
    differently from the tokens that were sampled, an attention model truncates to the common
    prefix; a hybrid model (which cannot rewind) restores the best saved prefix, or starts from
    nothing, and prefills the rest in batches, if that is at most twice the reply plus
    `min_prefill_tokens` plus 64 tokens. The budget holds after a restore that fails too (the
    next best prefix is tried, then nothing): past it, this gives up with an empty context and
    the next turn plans from scratch, rather than re-prefill the whole conversation here.
    The turn's cancel event is checked between ubatches (and before a restore): a cancelled
    turn stops within one ubatch, with `live_tokens` still describing the context.
    Returns True if the context now holds exactly the boundary."""
    model, ctx, ck = engine.model, engine.ctx, engine.checkpoints
    assert model is not None and ctx is not None
    target = follow_up_prefix(engine, plan.messages, reply, reasoning=reasoning, variables=plan.variables)
    if len(target) >= ctx.n_ctx:
        return False  # no room for the template's closing tokens: the reply filled the context
    live = engine.live_tokens
    c = common_prefix(live, target)
    if c == len(target) == len(live):
        return True
    if c < len(live):
        if not model.hybrid and ctx.truncate(c):
            del live[c:]
        else:
            if plan.cancel.is_set():
                return False  # cancelled: not worth a restore and a re-prefill
            min_tail = ck.settings.min_prefill_tokens if ck else 0
            budget = 2 * n_generated + min_tail + 64
            restored = None
            for _attempt in range(4):
                cand = ck.find(np.asarray(target + [-1], dtype=np.int32)) if ck else None
                if len(target) - (cand.n_tokens if cand is not None else 0) > budget:
                    return False  # `live_tokens` still describes the context
                if cand is None:
                    break
                restored = ck.restore(ctx, cand)
                if restored is not None:
                    break
                engine.live_tokens = live = []  # a failed restore empties the context and
                # drops its checkpoint: the next best one (or none) is weighed again
            if restored is None:
                ctx.clear()
            engine.live_tokens = live = list(target[: restored.n_tokens if restored else 0])
    for i, pos in enumerate(range(len(live), len(target), ctx.n_ubatch)):
        if i and plan.cancel.is_set():
            return False
        chunk = target[pos : pos + ctx.n_ubatch]
        ctx.decode(chunk)
        live.extend(chunk)
    return True


def _warnings(engine: Engine) -> list[EngineWarning]:
    ck = engine.checkpoints
    return [EngineWarning(w) for w in ck.take_warnings()] if ck else []


def run_turn(engine: Engine, plan: TurnPlan) -> Iterator[EngineEvent]:
    """The turn's events. Every path ends in exactly one final event: `TurnDone` (finished,
    cancelled, length or context limit: the reply is kept) or `TurnFailed` (llama.cpp or a bug
    failed mid-turn: the text generated so far is in it, and the context starts cold next time,
    because its state is unknown). The reply is split into reasoning and answer as it streams."""
    split = plan.splitter()
    try:
        yield from _turn_events(engine, plan, split)
    except Exception as exc:
        if isinstance(exc, DecodeError):
            log.warning("turn failed: %s", exc)
            reason = str(exc)
        else:
            log.exception("turn failed")
            reason = f"{type(exc).__name__}: {exc}"
        if engine.ctx is not None:
            engine.ctx.clear()
        engine.live_tokens.clear()
        yield TurnFailed(reason, split.answer, split.reasoning)


def _turn_events(engine: Engine, plan: TurnPlan, split: ReasoningSplitter) -> Iterator[EngineEvent]:
    model, ctx = engine.model, engine.ctx
    assert model is not None and ctx is not None
    tokens, cancel, settings = plan.tokens, plan.cancel, plan.sampling
    ck = engine.checkpoints

    yield from _warnings(engine)  # e.g. a disk write that failed after the last turn
    cached, source, restore_s = _prepare(engine, tokens)
    tail_len = len(tokens) - cached
    yield TurnStarted(len(tokens), cached, tail_len, source)
    yield from _warnings(engine)

    saved: list[dict[str, Any]] = []
    save_s = [0.0]  # time spent snapshotting, kept out of the prefill rate

    def save_point() -> Iterator[EngineEvent]:
        t0 = time.perf_counter()
        n, nbytes = ck.save(ctx, engine.live_tokens) if ck else (0, 0)
        save_s[0] += time.perf_counter() - t0
        if n:
            saved.append({"tokens": n, "bytes": nbytes})
            yield CheckpointSaved(n, nbytes, "ram+disk" if ck.disk else "ram")
        yield from _warnings(engine)

    perf0 = ctx.perf()
    decode_tokens = 0
    finish = "stop"
    t_prefill0 = time.perf_counter()
    t_first = t_last = None
    # -- prefill, one ubatch per llama_decode, pausing at the save points
    interval = ck.settings.interval_tokens if ck else 0
    save_last = ck is not None and tail_len >= ck.settings.min_prefill_tokens
    stable = (
        stable_prefix(lambda m: engine.tokens_for(m, plan.variables), plan.messages, tokens)
        if save_last and ck.exact
        else None
    )
    stops = _prefill_stops(cached, len(tokens), interval, save_last=save_last, stable=stable)
    pos = cached
    for stop in stops:
        while pos < stop:
            chunk = tokens[pos : min(stop, pos + ctx.n_ubatch)]
            ctx.decode(chunk)
            engine.live_tokens.extend(chunk)
            pos += len(chunk)
            done = pos - cached
            elapsed = time.perf_counter() - t_prefill0
            tok_s = done / elapsed if elapsed > 0 else 0.0
            eta = (tail_len - done) / tok_s if tok_s > 0 else 0.0
            yield PrefillProgress(done, tail_len, tok_s, eta)
            if cancel.is_set() and pos < len(tokens):
                finish = "cancelled"
                break
        if finish == "cancelled":
            break
        if stop < len(tokens):
            yield from save_point()
    ctx.synchronize()  # books the prefill into llama.cpp's prompt-eval counters
    t_prefill1 = time.perf_counter()
    prefill_s = t_prefill1 - t_prefill0 - save_s[0]
    if tail_len and finish != "cancelled" and prefill_s > 0:
        engine.last_prefill_tok_s = tail_len / prefill_s
    perf1 = ctx.perf()

    # -- decode
    if finish != "cancelled":
        utf8 = Utf8Stream()
        with Sampler(settings, model.n_vocab, tokens) as sampler:
            live = engine.live_tokens
            n_ctx = ctx.n_ctx
            for _ in range(settings.max_tokens):
                token = sampler.sample(ctx.ctx)
                now = time.perf_counter()
                if t_first is None:
                    t_first = now
                if model.is_eog(token) and not plan.ignore_eos:
                    break
                t_last = now
                decode_tokens += 1
                raw = model.token_bytes(token)
                part = split.feed(utf8.feed(raw), t=now, control="" if raw else model.token_text(token))
                yield TokenDelta(part.answer, token, now, part.reasoning, part.in_reasoning)
                if cancel.is_set():
                    finish = "cancelled"
                    break
                if len(live) + 1 >= n_ctx:
                    finish = "context"
                    break
                if decode_tokens == settings.max_tokens:
                    finish = "length"
                    break
                rc = ctx.decode_one(token)
                if rc != 0:
                    raise DecodeError(f"llama_decode failed during generation (code {rc})")
                live.append(token)
            split.finish(utf8.finish(), t=t_last)  # bytes of an unfinished character: U+FFFD
    t_end = time.perf_counter()
    perf2 = ctx.perf()
    close_s = 0.0
    if t_first is not None and finish != "context":
        t_close = time.perf_counter()
        closed = close_boundary(engine, plan, split.answer, decode_tokens, reasoning=split.reasoning)
        close_s = time.perf_counter() - t_close
        if closed or not model.hybrid:
            yield from save_point()  # the follow-up boundary: where the next turn starts
    decode_wall = (t_end - t_prefill1) if t_first is not None else 0.0
    span = (t_last - t_first) if (t_first is not None and t_last is not None) else 0.0
    stats = TurnStats(
        ttft_s=(t_first - plan.t_start) if t_first is not None else 0.0,
        prompt_tokens=len(tokens),
        cached_tokens=cached,
        prefill_tokens=tail_len,
        prefill_s=prefill_s,
        prefill_tok_s=(tail_len / prefill_s) if tail_len and prefill_s > 0 else 0.0,
        decode_tokens=decode_tokens,
        decode_s=span,
        decode_tok_s=(decode_tokens - 1) / span if decode_tokens > 1 and span > 0 else 0.0,
        graphs_reused=perf2.n_reused - perf0.n_reused,
        llama_eval_ms=perf2.eval_ms - perf1.eval_ms,
        llama_prompt_eval_ms=perf1.prompt_eval_ms - perf0.prompt_eval_ms,
        wall_ms=decode_wall * 1000.0,
        total_s=t_end - plan.t_start,
        finish_reason=finish,
        checkpoint={
            "source": source,
            "restore_s": round(restore_s, 4),
            "saved": saved,
            "close_s": round(close_s, 4),
        },
        reasoning_tokens=split.reasoning_tokens,
        first_answer_s=(split.first_answer_t - plan.t_start) if split.first_answer_t is not None else None,
    )
    yield TurnDone(split.answer, stats, split.reasoning)
