"""The in-process engine: one model, one context, one live sequence, turns as event iterators.

This is the engine's public surface; the TUI, the CLI, the benchmark and the test fake use
nothing else (`EngineAPI` in `api.py` is the same surface as a protocol):

    engine = Engine(profile)
    info = engine.load()                  # ModelLoaded: what was loaded, threads, context size
    engine.preview(messages)              # what the next turn would reuse (no side effects)
    with engine.turn(messages) as turn:   # a Turn: iterate its events, cancel(), close()
        for event in turn: ...
    engine.close()

`turn(messages)` renders the whole conversation with the model's chat template, tokenizes it,
starts from the longest usable prefix it already has — the live context, a RAM checkpoint or a
disk checkpoint (`live_sequence.py`) — prefills the rest one ubatch at a time and decodes token
by token (`turn_runner.py`). Everything it has to say comes out as events (`events.py`); it never
prints and never imports the UI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .setup import default_model
from .config import locations
from .fit import machine as fit_machine
from .fit import llama_buffers
from .fit import report as fit_report
from .prompt.chat_template import ChatMessage, ChatTemplateError
from .checkpoints.manager import Checkpoints
from .events import (
    EngineEvent,
    ModelLoaded,
    ModelLoading,
    ResumePreview,
    TokenDelta,
    TurnDone,
    TurnFailed,
)
from .api import EngineFacts
from .live_sequence import RESTORE_MIN_GAIN, LiveSequence
from .llama import gguf_file, log as llama_log
from .llama.context import DecodeError, LlamaContext
from .llama.model import LlamaModel
from .config.profile_schema import Profile, ReasoningSettings, SamplingSettings, SpeculationSettings
from .prompt.thinking import ThinkingSupport, requested
from .scheduling.threads import ThreadPlan, plan_for
from .llama.sampling import Sampler
from .speculation.measure import ReplayResult, batch_logit_differences, replay_decode, verify_batch_costs
from .speculation.stepper import batch_weight_types, exactness, mode_if_enabled, speculation_mode
from .turn_runner import TurnParts, TurnPlan, run_turn

log = logging.getLogger(__name__)


__all__ = ["RESTORE_MIN_GAIN", "Engine", "PromptTooLong", "ResumePreview", "Turn", "resolve_model_path"]


class PromptTooLong(ValueError):
    """The conversation does not fit in the context; a user error."""


def resolve_model_path(profile: Profile, override: str | Path | None = None) -> Path:
    """The GGUF a profile points at: an explicit override, the embedded default (as shipped or
    its Q8_0 copy, made here on first use), or a path."""
    raw = str(override) if override is not None else profile.model.path
    if raw in default_model.BUILTIN:
        return default_model.require_builtin(raw)
    return Path(raw).expanduser()


class Turn:
    """One turn in flight: iterate it for its events (it ends with exactly one `TurnDone` or
    `TurnFailed`), `cancel()` it from any thread (it stops within a token or a ubatch and still
    ends with `TurnDone`, finish "cancelled"), `close()` it to abandon it (the engine is usable
    again at once, and the live sequence keeps what was computed).
    A context manager closes it."""

    def __init__(self, events: Iterator[EngineEvent], cancel: threading.Event, prompt_tokens: int) -> None:
        self._events = events
        self._cancel = cancel
        self.prompt_tokens = prompt_tokens
        self.result: TurnDone | TurnFailed | None = None  # the final event, once seen

    def __iter__(self) -> Turn:
        return self

    def __next__(self) -> EngineEvent:
        event = next(self._events)
        if isinstance(event, (TurnDone, TurnFailed)):
            self.result = event
        return event

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def close(self) -> None:
        close = getattr(self._events, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Turn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Engine(EngineFacts):
    """Owns the model, the context, the live sequence and the checkpoints.

    Not thread-safe: one call at a time (the app holds a lock around every call)."""

    def __init__(
        self, profile: Profile, *, model_path: str | Path | None = None, checkpoint_root: Path | None = None
    ) -> None:
        self._profile = profile
        self._model_path = resolve_model_path(profile, model_path)
        self._checkpoint_root = checkpoint_root
        self._model: LlamaModel | None = None
        self._ctx: LlamaContext | None = None
        self._live: LiveSequence | None = None
        self._spec_allowed = False  # speculation may draft on this setup (decided at load)
        self._spec_exactness = ""  # its guarantee there (TurnStats.spec_exactness)
        self._spec_if_enabled = ""  # `speculation` as it would read with speculation.enabled
        self._checkpoints: Checkpoints | None = None
        self._info: ModelLoaded | None = None
        self._prefill_tok_s: float | None = None  # the last measured prefill rate (previews)
        self.fit: fit_report.FitReport | None = None  # the memory estimate `check()` made

    # -- what is loaded -------------------------------------------------------------------------

    @property
    def model_path(self) -> Path:
        """The GGUF this engine loads (the first shard of a split model)."""
        return self._model_path

    @property
    def thread_plan(self) -> ThreadPlan:
        return self._require_ctx().thread_plan

    @property
    def threads_now(self) -> tuple[int, int]:
        """(decode, prefill) threads in use now (fewer than planned while the machine is busy)."""
        return self._require_ctx().threads_now

    def fixed_threads(self, decode: int, batch: int | None = None) -> contextlib.AbstractContextManager[None]:
        """Run with fixed thread counts for a while (the benchmark's thread section)."""
        return self._require_ctx().fixed_threads(decode, batch)

    # -- lifecycle ------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise `GGUFError` (one line) now if the model file is missing or not a whole GGUF,
        and `DoesNotFit` (with its table) if the profile needs more memory than the machine has
        (`engine/fit`, docs/fit.md); a caller that lets the user load anyway catches it.

        Reads only the headers, so a profile switch can refuse a bad path before the running
        model is closed (a big machine cannot hold two large models to try)."""
        self.fit = None
        self.fit = fit_report.check(self._profile, self._model_path, fit_machine.probe())  # reads the headers
        if not self.fit.fits:
            raise fit_report.DoesNotFit(self.fit)

    def load(
        self, on_event: Callable[[EngineEvent], None] | None = None, cancel: threading.Event | None = None
    ) -> ModelLoaded:
        """Load the model and create the context, reporting `ModelLoading` progress. After a
        `check()`, the log has each term of its estimate next to what llama.cpp allocated."""
        with llama_buffers.captured() as buffers:
            info = self._load(on_event, cancel)
        if self.fit is not None:
            for c in llama_buffers.compare(self.fit.terms, buffers):
                log.log(
                    logging.INFO if c.close else logging.WARNING,
                    "fit estimate vs llama.cpp: %s",
                    c.describe(),
                )
        return info

    def _load(
        self, on_event: Callable[[EngineEvent], None] | None = None, cancel: threading.Event | None = None
    ) -> ModelLoaded:
        """Load the model and create the context, reporting `ModelLoading` progress."""
        emit = on_event or (lambda _e: None)

        def progress(fraction: float) -> bool:
            emit(ModelLoading(fraction))
            return not (cancel and cancel.is_set())

        t0 = time.perf_counter()
        profile = self._profile
        model = LlamaModel(self._model_path, profile.model, on_progress=progress)
        try:
            from llama_cpp import llama_cpp as ll

            spec = profile.speculation
            gpu_build = bool(ll.llama_supports_gpu_offload())
            gpu_layers = gpu_build and profile.model.n_gpu_layers != 0
            rounding = exactness(
                gpu_build=gpu_build,
                gpu_layers=gpu_layers,
                hybrid=model.hybrid,
                max_draft=spec.max_draft,
                weight_types=batch_weight_types(gguf_file.shard_headers(model.header)),
                decode_threads=plan_for(profile.context, gpu_resident=False).decode,
                flash_attn=profile.context.flash_attn != "off",
            )
            self._spec_allowed, spec_mode = speculation_mode(spec, rounding)
            self._spec_exactness = f"batch rounding: {rounding}" if rounding else "bit-identical"
            drafts = spec.enabled and self._spec_allowed
            self._spec_if_enabled = mode_if_enabled(spec, rounding, needs_reload=model.hybrid and not drafts)
            with llama_log.lines() as made:
                ctx = LlamaContext(
                    model,
                    profile.context,
                    n_gpu_layers=profile.model.n_gpu_layers,
                    n_rs_seq=spec.max_draft if drafts and model.hybrid else 0,
                )
        except BaseException:
            model.close()
            raise
        self._model, self._ctx = model, ctx
        self._live = LiveSequence(ctx, hybrid=model.hybrid)
        if drafts and gpu_layers and spec.warm_up:  # each verify size's kernels and CUDA graph
            try:
                seconds = self._live.warm_up(spec.max_draft)
                log.info("speculation: verify batches warmed up in %.0f ms", seconds * 1000)
            except DecodeError as exc:  # the turns will build what they need themselves
                log.warning("speculation: warming up the verify batches failed: %s", exc)
        self._checkpoints = self._make_checkpoints(profile, self._checkpoint_root)
        self._info = ModelLoaded(
            path=str(self._model_path),
            architecture=model.architecture,
            n_params=model.n_params,
            size_bytes=model.size_bytes,
            n_ctx=ctx.n_ctx,
            n_threads=ctx.n_threads,
            hybrid=model.hybrid,
            load_s=time.perf_counter() - t0,
            n_threads_batch=ctx.n_threads_batch,
            threads=ctx.thread_plan.describe(),
            fingerprint=model.fingerprint,
            n_vocab=model.n_vocab,
            ple_gather=model.ple_mode,
            ple_reason=model.ple_reason,
            ple_table=model.ple_table,
            graph_splits=llama_log.decode_graph_splits(made),
            speculation=spec_mode,
            speculation_if_enabled=self._spec_if_enabled,
        )
        if spec.enabled:
            log.info("speculation %s", spec_mode)
        emit(self._info)
        return self._info

    def _make_checkpoints(self, profile: Profile, root: Path | None) -> Checkpoints | None:
        if not profile.checkpoints.enabled or self._model is None or self._ctx is None:
            return None
        return Checkpoints(
            profile.checkpoints,
            fingerprint=self._model.fingerprint,
            ctx=self._ctx,
            hybrid=self._model.hybrid,
            root=root or locations.checkpoints_dir(),
        )

    def apply(self, profile: Profile) -> None:
        """Take the settings of `profile` that need no reload (sampling, reasoning and
        checkpoint settings); the model and context settings stay as loaded (the schema marks
        those `reload`). Pending checkpoint writes finish first."""
        old = self._profile
        new = dataclasses.replace(profile, model=old.model, context=old.context)
        if self._ctx is not None and new.checkpoints != old.checkpoints:
            replacement = self._make_checkpoints(new, self._checkpoint_root)  # may raise: nothing changed
            if self._checkpoints is not None:
                self._checkpoints.close()
            self._checkpoints = replacement
        self._profile = new

    def flush_checkpoints(self, timeout: float | None = None) -> bool:
        """Wait until queued checkpoint writes are on disk."""
        return self._checkpoints.flush(timeout) if self._checkpoints else True

    def close(self) -> bool:
        """Finish pending checkpoint writes, then free the context and the model. False when
        some checkpoint writes could not finish in time (they are abandoned, never half-read:
        see docs/checkpoints.md)."""
        finished = True
        if self._checkpoints:
            finished = self._checkpoints.close()
            self._checkpoints = None
        self._live = None
        self._info = None
        if self._ctx:
            self._ctx.close()
            self._ctx = None
        if self._model:
            self._model.close()
            self._model = None
        return finished

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def checkpoints_at(self, root: Path | None) -> Iterator[None]:
        """Use another checkpoint directory (None: no checkpoints) for a while; the benchmark
        measures cold and restored turns with the model it already has loaded."""
        self._require()
        saved = self._checkpoints
        self._checkpoints = None if root is None else self._make_checkpoints(self._profile, root)
        try:
            yield
        finally:
            if self._checkpoints is not None:
                self._checkpoints.close()
            self._checkpoints = saved

    def complete(
        self, messages: Sequence[ChatMessage], *, deltas: list[TokenDelta] | None = None, **kwargs: Any
    ) -> TurnDone:
        """Run a turn to its end and return its `TurnDone` (TurnFailed raises RuntimeError).
        `deltas`: a list that receives each `TokenDelta` (`bench --spec` times every token)."""
        with self.turn(messages, **kwargs) as turn:
            for event in turn:
                if isinstance(event, TurnDone):
                    return event
                if isinstance(event, TurnFailed):
                    raise RuntimeError(event.reason)
                if deltas is not None and isinstance(event, TokenDelta):
                    deltas.append(event)
        raise RuntimeError("the turn ended without TurnDone")

    def reset(self) -> None:
        """Forget the live sequence (checkpoints stay)."""
        self._require()[2].clear()

    def verify_batch_costs(
        self,
        messages: Sequence[ChatMessage],
        sizes: Sequence[int],
        repeats: int,
        *,
        prefill_threads: bool = False,
        alternate: bool = False,
    ) -> dict[int, float]:
        """Median seconds of a speculation verify batch of each size after the prompt of
        `messages` (`velo-chat bench --spec`); the live sequence is empty afterwards.
        `prefill_threads`: run the batches on the prefill threads even where verify batches
        use the decode ones (every layer on the GPU), to measure what that choice saves;
        `alternate`: each batch after one of another size (a new graph each time)."""
        _model, ctx, live = self._require()
        saved = ctx.verify_on_decode_threads
        ctx.verify_on_decode_threads = saved and not prefill_threads
        try:
            tokens = self.tokens_for(messages, self.template_variables())
            return verify_batch_costs(live, tokens, sizes, repeats, alternate=alternate)
        finally:
            ctx.verify_on_decode_threads = saved

    def verify_logit_differences(
        self, messages: Sequence[ChatMessage], positions: int, sizes: Sequence[int]
    ) -> dict[str, Any]:
        """How a verify batch's logits differ from one-token decoding's, after the prompt of
        `messages` (`spec_measure.batch_logit_differences`; `benchmarks/spec_logits.py`); the
        live sequence is empty afterwards."""
        live = self._require()[2]
        tokens = self.tokens_for(messages, self.template_variables())
        return batch_logit_differences(live, tokens, positions, sizes)

    @property
    def speculation(self) -> str:
        """Speculation's state and guarantee on this setup, in words (`ModelLoaded.speculation`):
        "off", "on: bit-identical to plain decoding", "on: plain decoding up to the batch
        rounding (why)", or off and why."""
        return self._info.speculation if self._info is not None else ""

    @property
    def speculation_if_enabled(self) -> str:
        """`speculation` as it reads with `speculation.enabled` switched on (what a profile that
        enables it gets on this setup: `bench --spec` runs its "on" column so, and says it)."""
        return self._spec_if_enabled if self._info is not None else ""

    @property
    def verify_threads(self) -> str:
        """Which threads a verify batch runs on: "decode" (every layer on the GPU) or "prefill"."""
        return "decode" if self._require()[1].verify_on_decode_threads else "prefill"

    def spec_replay(self, messages: Sequence[ChatMessage], n: int) -> ReplayResult:
        """`n` greedy tokens after the prompt of `messages`, plain and then speculative with the
        plain reply in the draft source (`spec_measure.replay_decode`: the best case on this
        backend; `velo-chat bench --spec`). The speculation settings are the profile's, drafts
        fit what the context was made for; the live sequence is empty afterwards."""
        model, _ctx, live = self._require()
        tokens = self.tokens_for(messages, self.template_variables())
        if len(tokens) + n >= live.n_ctx:
            raise PromptTooLong(f"{len(tokens)} prompt tokens and {n} more do not fit {live.n_ctx}")
        greedy = dataclasses.replace(self._profile.sampling, temperature=0.0)
        spec = self._speculation(True)
        return replay_decode(live, lambda: Sampler(greedy, model.n_vocab, tokens), spec, tokens, n)

    def _speculation(self, enabled: bool) -> SpeculationSettings:
        """The profile's speculation settings as this setup may use them: nothing drafted
        where a verify batch rounds differently from one-token steps and the profile does
        not accept that (`speculation.speculation_mode`, decided at load)."""
        spec = self._profile.speculation
        if self._spec_allowed:
            return spec if spec.enabled == enabled else dataclasses.replace(spec, enabled=enabled)
        return dataclasses.replace(spec, enabled=False, max_draft=0)

    def _require(self) -> tuple[LlamaModel, LlamaContext, LiveSequence]:
        if self._model is None or self._ctx is None or self._live is None:
            raise RuntimeError("Engine.load() must be called before a turn")
        return self._model, self._ctx, self._live

    def _require_ctx(self) -> LlamaContext:
        return self._require()[1]

    # -- planning -------------------------------------------------------------------------------

    def tokens_for(
        self, messages: Sequence[ChatMessage], variables: Mapping[str, Any] | None = None
    ) -> list[int]:
        """The conversation's prompt tokens. Message text (the user's, and replies put back into
        the history with their reasoning) is tokenized as plain text, so text such as
        "<|im_end|>" in a pasted log never becomes a control token; the same conversation always
        gives the same tokens, and the tokens before a message's text do not depend on that text
        (docs/engine.md). `variables`: extra template variables (`template_variables`)."""
        return self._prompt(messages, variables)[0]

    def _prompt(
        self, messages: Sequence[ChatMessage], variables: Mapping[str, Any] | None
    ) -> tuple[list[int], str]:
        """The prompt tokens and the template's text after the last message's (the generation
        prompt, which may open a reasoning block)."""
        model = self._require()[0]
        segments = model.chat_template.segments(messages, variables=variables)
        last_plain = max((i for i, s in enumerate(segments) if s.plain), default=-1)
        tail = "".join(s.text for s in segments[last_plain + 1 :])
        return model.tokenize_segments(segments), tail

    def thinking_support(self) -> ThinkingSupport | None:
        """The thinking controls the model's chat template offers (None: it has no usable
        template, which a turn reports)."""
        model = self._require()[0]
        try:
            return model.chat_template.thinking
        except ChatTemplateError:
            return None

    def template_variables(self, reasoning: ReasoningSettings | None = None) -> dict[str, Any]:
        """The template variables a turn with these reasoning settings renders with (the
        profile's when None): the template's own thinking switch and level, if it has them."""
        support = self.thinking_support()
        if support is None:
            return {}
        return support.variables(*requested(reasoning or self._profile.reasoning))

    def preview(
        self, messages: Sequence[ChatMessage], *, reasoning: ReasoningSettings | None = None
    ) -> ResumePreview:
        """How much the next turn would reuse, without touching the context (the UI shows this
        before sending): cached tokens, tokens to prefill, estimated prefill seconds. Give the
        `reasoning` settings the turn will run with: they can change the prompt."""
        live = self._require()[2]
        tokens = self.tokens_for(messages, self.template_variables(reasoning))
        start = live.best_start(tokens, self._checkpoints)
        tail = len(tokens) - start.n_tokens
        rate = self._prefill_tok_s
        return ResumePreview(len(tokens), start.n_tokens, tail, start.source, tail / rate if rate else None)

    # -- turns ----------------------------------------------------------------------------------

    def turn(
        self,
        messages: Sequence[ChatMessage],
        *,
        sampling: SamplingSettings | None = None,
        reasoning: ReasoningSettings | None = None,
        max_tokens: int | None = None,
        cancel: threading.Event | None = None,
        ignore_eos: bool = False,
    ) -> Turn:
        """Prepare a turn and return it (nothing runs until it is iterated).

        Raises at once (before any event) for user errors: no chat template, a conversation
        longer than the context. `sampling` and `reasoning` default to the profile's; the
        reasoning settings set the template's thinking switch and level. `cancel`: an event
        that stops the turn like `Turn.cancel()`. `ignore_eos` keeps decoding past
        end-of-generation tokens (the benchmark uses it to time a fixed number of tokens).
        """
        model, _ctx, live = self._require()
        t_start = time.perf_counter()
        variables = self.template_variables(reasoning)
        tokens, prompt_tail = self._prompt(messages, variables)
        if len(tokens) >= live.n_ctx:
            raise PromptTooLong(
                f"the conversation is {len(tokens):,} tokens but the context holds {live.n_ctx:,}"
                " (raise context.n_ctx in the profile or start a new session)"
            )
        settings = sampling or self._profile.sampling
        if max_tokens is not None:
            settings = dataclasses.replace(settings, max_tokens=max_tokens)
        support = model.chat_template.thinking
        stop = cancel or threading.Event()
        plan = TurnPlan(
            messages=tuple(messages),
            tokens=tokens,
            sampling=settings,
            cancel=stop,
            t_start=t_start,
            ignore_eos=ignore_eos,
            variables=variables,
            thinking=support,
            opens_in_reasoning=support.opens_reasoning(prompt_tail),
            speculation=self._speculation(self._profile.speculation.enabled),
            spec_exactness=self._spec_exactness,
        )
        return Turn(self._observe(run_turn(self._parts(), plan)), stop, len(tokens))

    def _parts(self) -> TurnParts:
        model, _ctx, live = self._require()
        return TurnParts(model, live, self._checkpoints, self.tokens_for)

    def _observe(self, events: Iterator[EngineEvent]) -> Iterator[EngineEvent]:
        """Pass a turn's events through, keeping the prefill rate the previews estimate with."""
        try:
            for event in events:
                if isinstance(event, TurnDone) and event.stats.prefill_tok_s > 0:
                    self._prefill_tok_s = event.stats.prefill_tok_s
                yield event
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()
