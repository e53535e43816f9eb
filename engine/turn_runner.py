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
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
from .prompt.chat_template import ChatMessage
from .checkpoints.manager import Checkpoints
from .live_sequence import MAX_RESTORE_ATTEMPTS, RESTORE_MIN_GAIN, LiveSequence, common_prefix
from .llama.context import DecodeError
from .llama.model import LlamaModel
from .config.profile_schema import SamplingSettings, SpeculationSettings
from .llama.sampling import Sampler
from .speculation.stepper import SpecCounters, SpecStepper
from .checkpoints.save_points import stable_prefix
from .prompt.thinking import ReasoningSplitter, ThinkingSupport

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
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    spec_exactness: str = ""  # "bit-identical" or "batch rounding: why" (Engine, at load)

    def splitter(self) -> ReasoningSplitter:
        """Splits this turn's reply into reasoning and answer."""
        return ReasoningSplitter(
            self.thinking.open_marker, self.thinking.close_marker, inside=self.opens_in_reasoning
        )


TokensFor = Callable[[Sequence[ChatMessage], Mapping[str, Any] | None], list[int]]


@dataclass(frozen=True)
class TurnParts:
    """What a turn works with: the model, the live sequence, the checkpoints (None: off) and
    the engine's prompt renderer. The engine hands these over; nothing here reaches back."""

    model: LlamaModel
    live: LiveSequence
    checkpoints: Checkpoints | None
    tokens_for: TokensFor


def _prefill_stops(
    start: int, end: int, interval: int, save_last: bool, stable: int | None = None
) -> list[int]:
    """Positions where the prefill pauses to save a checkpoint (the last one is `end`).
    `stable`: how much of the prompt every continuation keeps (hybrid models, `save_points.py`);
    when that is less than `end - 1`, the state before the reply is saved there."""
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
    tokens_for: TokensFor,
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
    a = tokens_for([*history, ChatMessage("user", "A")], variables)
    b = tokens_for([*history, ChatMessage("user", "B")], variables)
    return a[: common_prefix(a, b)]


def close_boundary(
    parts: TurnParts, plan: TurnPlan, reply: str, n_generated: int, *, reasoning: str = ""
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
    turn stops within one ubatch, with the live sequence still describing the context.
    Returns True if the context now holds exactly the boundary."""
    live, ck = parts.live, parts.checkpoints
    target = follow_up_prefix(
        parts.tokens_for, plan.messages, reply, reasoning=reasoning, variables=plan.variables
    )
    if len(target) >= live.n_ctx:
        return False  # no room for the template's closing tokens: the reply filled the context
    c = live.common_prefix(target)
    if c == len(target) == len(live):
        return True
    if c < len(live) and (parts.model.hybrid or not live.truncate(c)):
        if plan.cancel.is_set():
            return False  # cancelled: not worth a restore and a re-prefill
        budget = 2 * n_generated + (ck.settings.min_prefill_tokens if ck else 0) + 64
        restored = False
        for _attempt in range(MAX_RESTORE_ATTEMPTS):
            cand = ck.find(np.asarray(target + [-1], dtype=np.int32)) if ck else None
            if len(target) - (cand.n_tokens if cand is not None else 0) > budget:
                return False  # the live sequence still describes the context
            if cand is None or ck is None:
                break
            # a failed restore empties the context and drops its checkpoint: the next best
            # one (or none) is weighed again
            if live.restore(ck, cand, target) is not None:
                restored = True
                break
        if not restored:
            live.clear()
    for i, pos in enumerate(range(len(live), len(target), live.n_ubatch)):
        if i and plan.cancel.is_set():
            return False
        live.extend(target[pos : pos + live.n_ubatch])
    return True


def _warnings(ck: Checkpoints | None) -> list[EngineWarning]:
    return [EngineWarning(w) for w in ck.take_warnings()] if ck else []


def run_turn(parts: TurnParts, plan: TurnPlan) -> Iterator[EngineEvent]:
    """The turn's events. Every path ends in exactly one final event: `TurnDone` (finished,
    cancelled, length or context limit: the reply is kept) or `TurnFailed` (llama.cpp or a bug
    failed mid-turn: the text generated so far is in it, and the context starts cold next time,
    because its state is unknown). The reply is split into reasoning and answer as it streams."""
    split = plan.splitter()
    try:
        yield from _turn_events(parts, plan, split)
    except Exception as exc:
        if isinstance(exc, DecodeError):
            log.warning("turn failed: %s", exc)
            reason = str(exc)
        else:
            log.exception("turn failed")
            reason = f"{type(exc).__name__}: {exc}"
        parts.live.clear()
        yield TurnFailed(reason, split.answer, split.reasoning)


def _turn_events(parts: TurnParts, plan: TurnPlan, split: ReasoningSplitter) -> Iterator[EngineEvent]:
    model, live, ck = parts.model, parts.live, parts.checkpoints
    tokens, cancel, settings = plan.tokens, plan.cancel, plan.sampling

    yield from _warnings(ck)  # e.g. a disk write that failed after the last turn
    cached, source, restore_s = live.start_from_best(tokens, ck)
    tail_len = len(tokens) - cached
    yield TurnStarted(len(tokens), cached, tail_len, source)
    yield from _warnings(ck)

    saved: list[dict[str, Any]] = []
    save_s = [0.0]  # time spent snapshotting, kept out of the prefill rate

    def save_point() -> Iterator[EngineEvent]:
        t0 = time.perf_counter()
        if ck is None:
            return
        n, nbytes = live.save(ck)
        save_s[0] += time.perf_counter() - t0
        if n:
            saved.append({"tokens": n, "bytes": nbytes})
            yield CheckpointSaved(n, nbytes, "ram+disk" if ck.disk else "ram")
        yield from _warnings(ck)

    perf0 = live.perf()
    decode_tokens = 0
    finish = "stop"
    t_prefill0 = time.perf_counter()
    t_first = t_last = None
    # -- prefill, one ubatch per llama_decode, pausing at the save points
    interval = ck.settings.interval_tokens if ck else 0
    save_last = ck is not None and tail_len >= ck.settings.min_prefill_tokens
    stable = (
        stable_prefix(lambda m: parts.tokens_for(m, plan.variables), plan.messages, tokens)
        if save_last and ck is not None and ck.exact
        else None
    )
    stops = _prefill_stops(cached, len(tokens), interval, save_last=save_last, stable=stable)
    pos = cached
    for stop in stops:
        while pos < stop:
            chunk = tokens[pos : min(stop, pos + live.n_ubatch)]
            live.extend(chunk)
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
    live.synchronize()  # books the prefill into llama.cpp's prompt-eval counters
    t_prefill1 = time.perf_counter()
    prefill_s = t_prefill1 - t_prefill0 - save_s[0]
    perf1 = live.perf()
    steps1, threads1 = live.decode_threads()

    # -- decode: each sampled token is shown, then decoded (`SpecStepper.step`: with a draft
    # after it when speculation is on), which gives the next ones
    spec = SpecCounters()
    if finish != "cancelled":
        utf8 = Utf8Stream()
        with Sampler(settings, model.n_vocab, tokens) as sampler:
            n_ctx = live.n_ctx
            stepper = (
                SpecStepper(live, sampler, plan.speculation, tokens) if plan.speculation.enabled else None
            )
            spec = stepper.counters if stepper is not None else spec
            batch = [live.sample(sampler)]
            stop = -1
            while stop < 0:
                for i, token in enumerate(batch):
                    now = time.perf_counter()
                    if t_first is None:
                        t_first = now
                    if model.is_eog(token) and not plan.ignore_eos:
                        stop = i
                        break
                    t_last = now
                    decode_tokens += 1
                    raw = model.token_bytes(token)
                    part = split.feed(utf8.feed(raw), t=now, control="" if raw else model.token_text(token))
                    yield TokenDelta(part.answer, token, now, part.reasoning, part.in_reasoning)
                    if cancel.is_set():
                        finish = "cancelled"
                    elif (stepper.held_before(i) if stepper else len(live)) + 1 >= n_ctx:
                        finish = "context"
                    elif decode_tokens == settings.max_tokens:
                        finish = "length"
                    else:
                        continue
                    stop = i
                    break
                if stop >= 0:
                    if stepper is not None:
                        stepper.settle(stop)  # the context ends just before the stopping token
                    break
                if stepper is not None:
                    batch = stepper.step(batch[-1], settings.max_tokens - decode_tokens)
                else:
                    live.append(batch[-1])
                    batch = [live.sample(sampler)]
            split.finish(utf8.finish(), t=t_last)  # bytes of an unfinished character: U+FFFD
    t_end = time.perf_counter()
    perf2 = live.perf()
    steps2, threads2 = live.decode_threads()
    close_s = 0.0
    if t_first is not None and finish != "context":
        t_close = time.perf_counter()
        closed = close_boundary(parts, plan, split.answer, decode_tokens, reasoning=split.reasoning)
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
        spec_drafted=spec.drafted,
        spec_accepted=spec.accepted,
        spec_rounds=spec.rounds,
        spec_declined=spec.declined,
        spec_guarded=spec.guarded,
        spec_batches=dict(spec.batches),
        spec_batch_steps=spec.mean_batch_steps(),
        spec_after_verify_steps=spec.mean_after_verify_steps(),
        spec_exactness=plan.spec_exactness if plan.speculation.enabled else "",
        decode_calls=spec.decode_calls if spec.decode_calls else max(decode_tokens - 1, 0),
        decode_threads=(threads2 - threads1) / (steps2 - steps1) if steps2 > steps1 else 0.0,
    )
    yield TurnDone(split.answer, stats, split.reasoning)
