"""One turn, as a generator of events: start from the best prefix, prefill, decode, save.

Save points (when checkpoints are on): every `interval_tokens` absolute positions inside a long
prefill; the state before the reply, at the end of the prefill *minus its last token* (a restored
state carries no logits, so a regenerate restores there and decodes that one token to get them);
the end of the system prompt, where every new session agrees, the first time a prefill passes it
(`save_points.shared_point`); and the follow-up boundary after the reply. The last prompt token
is therefore always decoded on its own, cold or restored alike, so both paths run the same
arithmetic.

On a hybrid model the state before the reply is saved earlier when the conversation's next turn
will not keep the whole prompt (`checkpoints/save_points.py`: thinking templates rewrite the
reply and drop the generation prompt's `<think>`): where every continuation still agrees with
it. The end of the prompt minus one is then saved as well only when it is more than
`RESTORE_MIN_GAIN` tokens further; otherwise a regenerate restores the earlier state and
prefills those few tokens in the same batch a cold run does.

The thinking budget (`ReasoningBudget`, docs/thinking.md): once the reply has spent its budget
of tokens inside the reasoning block, the turn writes the budget message and the template's
closing into the reply itself, each token shown and then decoded as if sampled, and samples the
answer after them. Speculation drafts no further than that token, and a verify batch that went
past it is cut back to it as at an end of generation (`SpecStepper.settle`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator

from .checkpoints.save_points import shared_point, stable_prefix
from .events import (
    CheckpointSaved,
    EngineEvent,
    EngineWarning,
    PrefillProgress,
    TokenDelta,
    TurnDone,
    TurnFailed,
    TurnStarted,
)
from .live_sequence import RESTORE_MIN_GAIN
from .llama.context import DecodeError
from .llama.sampling import Sampler
from .reply import Reply
from .speculation.stepper import SpecCounters, SpecStepper
from .tools.types import ToolCall
from .turn_plan import (  # noqa: F401  (re-exported: tests and the engine import them here)
    ParsedTurn,
    TurnParts,
    TurnPlan,
    Utf8Stream,
    _prefill_stops,
    close_boundary,
)
from .turn_stats import CheckpointStats, LlamaTimings, SavedCheckpoint, SpeculationStats, TurnStats

log = logging.getLogger(__name__)


def run_turn(parts: TurnParts, plan: TurnPlan) -> Iterator[EngineEvent]:
    """The turn's events. Every path ends in exactly one final event: `TurnDone` (finished,
    cancelled, length or context limit: the reply is kept) or `TurnFailed` (llama.cpp or a bug
    failed mid-turn: the text generated so far is in it, and the context starts cold next time,
    because its state is unknown). The reply is split into reasoning and answer as it streams."""
    turn = _Turn(parts, plan)
    try:
        yield from turn.start()
        yield from turn.prefill()
        yield from turn.decode()
        yield from turn.close()
        yield turn.done()
    except Exception as exc:
        if isinstance(exc, DecodeError):
            log.warning("turn failed: %s", exc)
            reason = str(exc)
        else:
            log.exception("turn failed")
            reason = f"{type(exc).__name__}: {exc}"
        parts.live.clear()
        yield TurnFailed(reason, turn.reply.text, turn.reply.reasoning)


class _Turn:
    """One turn's phases, in order: `start` (from the best saved prefix), `prefill` (pausing at
    the save points), `decode` (token by token, or speculatively), `close` (the follow-up
    boundary and its checkpoint), then `stats`. What they measure is kept here."""

    def __init__(self, parts: TurnParts, plan: TurnPlan) -> None:
        self.parts, self.plan = parts, plan
        self.ck = parts.checkpoints
        self.tokens = list(plan.prompt.tokens)
        self.reply = Reply()
        self.split = plan.splitter()
        self.finish = "stop"
        self.cached, self.source, self.restore_s = 0, "none", 0.0
        self.saved: list[SavedCheckpoint] = []
        self.save_s = 0.0  # time spent snapshotting, kept out of the prefill rate
        self.close_s = 0.0
        self.t_sampled: float | None = None  # the first token sampled (an end of generation too)
        self.spec = SpecCounters()
        self.thought = 0  # tokens inside the reasoning block: what the thinking budget counts
        self.budget_hit = False  # the budget closed the reasoning (`_close_reasoning`)
        self._cut_due = False  # the budget is spent at the token `_emit` stopped at
        self._tail = ""  # the end of the reply's text (the closing skips newlines it has)
        self.raw = ""  # the reply as generated, control tokens as their text (tool calls parse it)
        self._parsed: ParsedTurn | None = None
        self._sampler: Sampler | None = None  # the decode's sampler (its grammar: `_closing_fits`)

    def _warnings(self) -> Iterator[EngineEvent]:
        if self.ck is not None:
            yield from (EngineWarning(w) for w in self.ck.take_warnings())

    def _save_point(self) -> Iterator[EngineEvent]:
        t0 = time.perf_counter()
        if self.ck is None:
            return
        n, nbytes = self.parts.live.save(self.ck)
        took = time.perf_counter() - t0
        self.save_s += took
        if n:
            self.saved.append(SavedCheckpoint(n, nbytes, took))
            yield CheckpointSaved(n, nbytes, "ram+disk" if self.ck.disk else "ram")
        yield from self._warnings()

    # -- the phases -----------------------------------------------------------------------------

    def start(self) -> Iterator[EngineEvent]:
        yield from self._warnings()  # e.g. a disk write that failed after the last turn
        self.cached, self.source, self.restore_s = self.parts.live.start_from_best(self.tokens, self.ck)
        yield TurnStarted(len(self.tokens), self.cached, len(self.tokens) - self.cached, self.source)
        yield from self._warnings()

    def _stops(self) -> list[int]:
        """Where the prefill pauses to save (`_prefill_stops`)."""
        ck, tokens = self.ck, self.tokens
        if ck is None:
            return _prefill_stops(self.cached, len(tokens), 0, save_last=False)
        save_last = len(tokens) - self.cached >= ck.settings.min_prefill_tokens
        stable = None
        if save_last and ck.exact:
            renderer, prompt = self.parts.renderer, self.plan.prompt
            stable = stable_prefix(lambda m: renderer.tokens(m, prompt.variables), prompt.messages, tokens)
        return _prefill_stops(
            self.cached,
            len(tokens),
            ck.settings.interval_tokens,
            save_last=save_last,
            stable=stable,
            shared=self._shared_stop(),
        )

    def _shared_stop(self) -> int | None:
        """Where the part every new session of this system prompt shares ends, when this
        prefill passes it and should save it there (`save_points.shared_point`). A prompt too
        short to hold one that is worth saving is not rendered again to find it."""
        ck, tokens = self.ck, self.tokens
        if ck is None or len(tokens) <= max(ck.settings.min_prefill_tokens, RESTORE_MIN_GAIN) + 1:
            return None
        shared = len(self.parts.renderer.shared_prefix(self.plan.prompt))
        return shared_point(shared, self.cached, len(tokens), ck.settings.min_prefill_tokens)

    def prefill(self) -> Iterator[EngineEvent]:
        """One ubatch per llama_decode, pausing at the save points."""
        live, tokens, cached = self.parts.live, self.tokens, self.cached
        tail_len = len(tokens) - cached
        self.perf0 = live.perf()
        self.t_prefill0 = time.perf_counter()
        pos = cached
        for stop in self._stops():
            while pos < stop:
                chunk = tokens[pos : min(stop, pos + live.n_ubatch)]
                live.extend(chunk)
                pos += len(chunk)
                done = pos - cached
                elapsed = time.perf_counter() - self.t_prefill0
                tok_s = done / elapsed if elapsed > 0 else 0.0
                yield PrefillProgress(done, tail_len, tok_s, (tail_len - done) / tok_s if tok_s > 0 else 0.0)
                if self.plan.cancel.is_set() and pos < len(tokens):
                    self.finish = "cancelled"
                    break
            if self.finish == "cancelled":
                break
            if stop < len(tokens):
                yield from self._save_point()
        live.synchronize()  # books the prefill into llama.cpp's prompt-eval counters
        self.t_prefill1 = time.perf_counter()
        self.prefill_s = self.t_prefill1 - self.t_prefill0 - self.save_s
        self.perf1 = live.perf()
        self.threads1 = live.decode_threads()

    def decode(self) -> Iterator[EngineEvent]:
        """Each sampled token is shown, then decoded (`SpecStepper.step`: with a draft after it
        when speculation is on), which gives the next ones."""
        if self.finish != "cancelled":
            live, plan = self.parts.live, self.plan
            utf8 = Utf8Stream()
            grammar = plan.tools.grammar if plan.tools is not None else None
            with Sampler(
                plan.sampling,
                self.parts.model.n_vocab,
                self.tokens,
                grammar=grammar,
                vocab=self.parts.model.vocab,
            ) as sampler:
                self._sampler = sampler
                stepper = (
                    SpecStepper(live, sampler, plan.speculation, self.tokens)
                    if plan.speculation.enabled
                    else None
                )
                self.spec = stepper.counters if stepper is not None else self.spec
                batch = [live.sample(sampler)]
                while True:
                    stop = yield from self._emit(batch, utf8, stepper)
                    if stop >= 0:
                        if stepper is not None:
                            stepper.settle(stop)  # the context ends just before the stopping token
                        if not self._cut_due:
                            break
                        self._cut_due = False  # the budget: the rest of a verify batch is dropped
                        batch = yield from self._close_reasoning(batch[stop], utf8, stepper, sampler)
                        if not batch:
                            break
                        continue
                    if stepper is not None:
                        batch = stepper.step(batch[-1], self._room())
                    else:
                        live.append(batch[-1])
                        batch = [live.sample(sampler)]
            held = self.split.finish(utf8.finish())  # bytes of an unfinished character: U+FFFD
            self.reply.add_held(held.answer, held.reasoning, self.reply.t_last)
        self.t_end = time.perf_counter()
        self.perf2 = self.parts.live.perf()
        self.threads2 = self.parts.live.decode_threads()

    def _emit(
        self, batch: list[int], utf8: Utf8Stream, stepper: SpecStepper | None
    ) -> Generator[EngineEvent, None, int]:
        """Show the sampled tokens in order; the index of the one the reply stops at (an end
        of generation, a cancel, the context or the length limit), or -1."""
        model, plan = self.parts.model, self.plan
        for i, token in enumerate(batch):
            now = time.perf_counter()
            if self.t_sampled is None:
                self.t_sampled = now
            if model.is_eog(token) and not plan.ignore_eos:
                return i
            raw = model.token_bytes(token)
            inside = self.split.in_reasoning
            text = utf8.feed(raw)
            control = "" if raw else model.token_text(token)
            part = self.split.feed(text, control=control)
            self.raw += text or control
            if inside:
                self.thought += 1
            self._tail = (self._tail + text)[-16:]
            yield self.reply.add(TokenDelta(part.answer, token, now, part.reasoning, part.in_reasoning))
            if plan.cancel.is_set():
                self.finish = "cancelled"
            elif (stepper.held_before(i) if stepper else len(self.parts.live)) + 1 >= self.parts.live.n_ctx:
                self.finish = "context"
            elif self.reply.n_tokens == plan.sampling.max_tokens:
                self.finish = "length"
            elif self._budget_left() == 0:
                self._cut_due = True
            else:
                continue
            return i
        return -1

    # -- the thinking budget ----------------------------------------------------------------------

    def _budget_left(self) -> int | None:
        """Reasoning tokens the budget still allows (None: no limit now: no budget, already
        cut, or not inside the reasoning)."""
        budget = self.plan.budget.tokens
        if budget <= 0 or self.budget_hit or not self.split.in_reasoning:
            return None
        tools = self.plan.tools
        if tools is not None and tools.open_call(self.raw):
            return None  # a call open at the budget completes first (the grammar closes it)
        left = max(budget - self.thought, 0)
        if left == 0 and tools is not None and not self._closing_fits():
            return None  # the grammar holds the reply (a call under way, or one just closed)
        return left

    def _closing_fits(self) -> bool:
        """Whether the tool-call grammar lets the budget's closing start here: not while it
        writes a call (a forced or required call opens inside the reasoning, before a format's
        marker is whole), nor after a call closed (then only the end of the reply fits)."""
        sampler = self._sampler
        closing = self._closing_tokens()
        return sampler is None or not closing or sampler.allows(closing[0])

    def _room(self) -> int:
        """Most tokens a speculative step may return: the length limit's, and no draft past
        the budget's end, so a verify batch seldom has to be cut back there."""
        room = self.plan.sampling.max_tokens - self.reply.n_tokens
        left = self._budget_left()
        return room if left is None else max(min(room, left), 1)

    def _closing_tokens(self) -> list[int]:
        """The budget message (message text: plain tokens) and the template's closing
        (scaffolding: its marker may be a control token), as `ReasoningBudget` says."""
        model = self.parts.model
        message, closing = self.plan.budget.written_after(self._tail)
        plain = model.prompt_tokenizer.plain(message) if message else []
        return [*plain, *model.tokenize(closing, add_special=False, parse_special=True)]

    def _decode_chosen(self, token: int, stepper: SpecStepper | None) -> None:
        """Decode a token of the reply as a plain one-token step (nothing drafted after it)."""
        if stepper is not None:
            stepper.force(token)
        else:
            self.parts.live.append(token)

    def _close_reasoning(
        self, pending: int, utf8: Utf8Stream, stepper: SpecStepper | None, sampler: Sampler
    ) -> Generator[EngineEvent, None, list[int]]:
        """The budget is spent at `pending` (shown, not yet decoded; anything sampled after it
        was dropped): decode it, then write the budget message and the closing into the reply
        as if sampled (each shown, then decoded), and sample what follows them. Returns that
        token, or [] when the reply stopped inside the closing (a limit, a cancel)."""
        self.budget_hit = True
        for token in self._closing_tokens():
            self._decode_chosen(pending, stepper)
            sampler.accept(token)  # a grammar waiting for the reasoning to close sees it close
            if (yield from self._emit([token], utf8, None)) >= 0:
                return []
            pending = token
        self._decode_chosen(pending, stepper)
        return [self.parts.live.sample(sampler)]

    def close(self) -> Iterator[EngineEvent]:
        """The follow-up boundary, and a checkpoint there: where the next turn starts."""
        if self.t_sampled is not None and self.finish != "context":
            t_close = time.perf_counter()
            final = self.done_parts()
            closed = close_boundary(
                self.parts,
                self.plan,
                final.text,
                self.reply.n_tokens,
                reasoning=final.reasoning,
                tool_calls=final.tool_calls,
            )
            self.close_s = time.perf_counter() - t_close
            if closed or not self.parts.model.hybrid:
                yield from self._save_point()

    def done_parts(self) -> ParsedTurn:
        """The reply as the conversation keeps it: its tool calls parsed from the text as
        generated, and taken out of the answer and the reasoning. Parsed once."""
        if self._parsed is None:
            answer, reasoning = self.reply.text, self.reply.reasoning
            calls: tuple[ToolCall, ...] = ()
            if self.plan.tools is not None:
                answer, reasoning, calls = self.plan.tools.parse(self.raw, answer, reasoning)
            self._parsed = ParsedTurn(answer, reasoning, calls)
        return self._parsed

    def done(self) -> TurnDone:
        """The final event: the reply as the conversation keeps it, with the turn's stats."""
        final = self.done_parts()
        return TurnDone(final.text, self.stats(), final.reasoning, final.tool_calls)

    def stats(self) -> TurnStats:
        tokens, reply, plan, spec = self.tokens, self.reply, self.plan, self.spec
        tail_len, n = len(tokens) - self.cached, reply.n_tokens
        span = (
            (reply.t_last - self.t_sampled)
            if self.t_sampled is not None and reply.t_last is not None
            else 0.0
        )
        (steps1, threads1), (steps2, threads2) = self.threads1, self.threads2
        return TurnStats(
            ttft_s=(self.t_sampled - plan.t_start) if self.t_sampled is not None else 0.0,
            prompt_tokens=len(tokens),
            cached_tokens=self.cached,
            prefill_tokens=tail_len,
            prefill_s=self.prefill_s,
            prefill_tok_s=(tail_len / self.prefill_s) if tail_len and self.prefill_s > 0 else 0.0,
            decode_tokens=n,
            decode_s=span,
            decode_tok_s=(n - 1) / span if n > 1 and span > 0 else 0.0,
            total_s=self.t_end - plan.t_start,
            finish_reason=self.finish,
            source=self.source,
            reasoning_tokens=self.split.reasoning_tokens,
            reasoning_budget_hit=self.budget_hit,
            first_answer_s=(reply.t_first_answer - plan.t_start)
            if reply.t_first_answer is not None
            else None,
            checkpoint=CheckpointStats.of(
                self.restore_s, tuple(self.saved), self.close_s, self.parts.live.last_choice
            ),
            speculation=SpeculationStats(
                drafted=spec.drafted,
                accepted=spec.accepted,
                rounds=spec.rounds,
                declined=spec.declined,
                guarded=spec.guarded,
                batches=dict(spec.batches),
                batch_steps=spec.mean_batch_steps(),
                after_verify_steps=spec.mean_after_verify_steps(),
                decode_calls=spec.decode_calls if spec.decode_calls else max(n - 1, 0),
                exactness=plan.spec_exactness if plan.speculation.enabled else "",
            ),
            llama=LlamaTimings(
                graphs_reused=self.perf2.n_reused - self.perf0.n_reused,
                eval_ms=self.perf2.eval_ms - self.perf1.eval_ms,
                prompt_eval_ms=self.perf1.prompt_eval_ms - self.perf0.prompt_eval_ms,
                wall_ms=((self.t_end - self.t_prefill1) if self.t_sampled is not None else 0.0) * 1000.0,
                decode_threads=(threads2 - threads1) / (steps2 - steps1) if steps2 > steps1 else 0.0,
            ),
        )
