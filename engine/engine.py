"""The in-process engine: one model, one context, one live sequence, turns as event iterators.

Its public members are `EngineAPI`'s (`api.py`), which the TUI, the CLI and the test fake use;
what the benchmark and the tests measure with is on `diagnostics.Diagnostics`:

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

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .setup.default_model import resolve_model_path
from .config import locations
from .fit import machine as fit_machine
from .fit import llama_buffers
from .fit import report as fit_report
from .prompt.chat_template import ChatMessage, ChatTemplateError
from .checkpoints.manager import Checkpoints
from .events import (
    EngineEvent,
    LocalModel,
    ModelLoaded,
    ModelLoading,
    PleInfo,
    ResumePreview,
    SpeculationInfo,
    ThreadsInfo,
    TurnDone,
)
from .api import EngineFacts, Turn
from .errors import DoesNotFit, ProfileError, PromptTooLong
from .live_sequence import RESTORE_MIN_GAIN, LiveSequence
from .llama import gguf_file, log as llama_log
from .llama.context import DecodeError, LlamaContext
from .llama.model import LlamaModel
from .config.profile_schema import Profile, ReasoningSettings, SamplingSettings, SpeculationSettings
from .prompt.thinking import ReasoningBudget, ThinkingSupport, closing_text, requested
from .scheduling.threads import plan_for
from .speculation.stepper import batch_weight_types, exactness, mode_if_enabled, speculation_mode
from .prompt.rendered import PromptRenderer, RenderedPrompt
from .tools.offer import ToolOffer, tool_offer, tool_variable
from .tools.types import ToolSpec
from .turn_runner import TurnParts, TurnPlan, run_turn
from .turn_runner import _prefill_stops as prefill_stops

log = logging.getLogger(__name__)


__all__ = ["RESTORE_MIN_GAIN", "Engine", "PromptTooLong", "ResumePreview", "Turn", "resolve_model_path"]


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
        self._spec_exactness = ""  # its guarantee there (SpeculationStats.exactness)
        self._spec_if_enabled = ""  # `speculation` as it would read with speculation.enabled
        self._checkpoints: Checkpoints | None = None
        self._info: ModelLoaded | None = None
        self._renderer: PromptRenderer | None = None  # renders conversations (once per turn)
        self._prefill_tok_s: float | None = None  # the last measured prefill rate (previews)
        self._fit: fit_report.FitReport | None = None  # the memory estimate `check()` made

    # -- lifecycle ------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise `GGUFError` (one line) now if the model file is missing or not a whole GGUF,
        and `DoesNotFit` (with its table) if the profile needs more memory than the machine has
        (`engine/fit`, docs/fit.md); a caller that lets the user load anyway catches it.

        Reads only the headers, so a profile switch can refuse a bad path before the running
        model is closed (a big machine cannot hold two large models to try)."""
        self._fit = None
        self._fit = fit_report.check(self._profile, self._model_path, fit_machine.probe())  # the headers
        if not self._fit.fits:
            raise DoesNotFit(self._fit)

    def load(
        self, on_event: Callable[[EngineEvent], None] | None = None, cancel: threading.Event | None = None
    ) -> ModelLoaded:
        """Load the model and create the context, reporting `ModelLoading` progress. After a
        `check()`, the log has each term of its estimate next to what llama.cpp allocated."""
        with llama_buffers.captured() as buffers:
            info = self._load(on_event, cancel)
        if self._fit is not None:
            for c in llama_buffers.compare(self._fit.terms, buffers):
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
        self._renderer = PromptRenderer(lambda: model.chat_template, model.tokenize_segments)
        self._info = ModelLoaded(
            path=str(self._model_path),
            architecture=model.architecture,
            n_ctx=ctx.n_ctx,
            load_s=time.perf_counter() - t0,
            fingerprint=model.fingerprint,
            local=LocalModel(
                n_params=model.n_params,
                size_bytes=model.size_bytes,
                n_vocab=model.n_vocab,
                hybrid=model.hybrid,
                graph_splits=llama_log.decode_graph_splits(made),
            ),
            threads=ThreadsInfo(ctx.n_threads, ctx.n_threads_batch, ctx.thread_plan.describe()),
            ple=PleInfo(model.ple_mode, model.ple_reason, model.ple_table),
            speculation=SpeculationInfo(spec_mode, self._spec_if_enabled),
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

    def close(self) -> bool:
        """Finish pending checkpoint writes, then free the context and the model. False when
        some checkpoint writes could not finish in time (they are abandoned, never half-read:
        see docs/checkpoints.md)."""
        finished = True
        if self._checkpoints:
            finished = self._checkpoints.close()
            self._checkpoints = None
        self._live = None
        self._renderer = None
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

    def _speculation(self, enabled: bool) -> SpeculationSettings:
        """The profile's speculation settings as this setup may use them: nothing drafted
        where a verify batch rounds differently from one-token steps and the profile does
        not accept that (`speculation.stepper.speculation_mode`, decided at load)."""
        spec = self._profile.speculation
        if self._spec_allowed:
            return spec if spec.enabled == enabled else dataclasses.replace(spec, enabled=enabled)
        return dataclasses.replace(spec, enabled=False, max_draft=0)

    def _require(self) -> tuple[LlamaModel, LlamaContext, LiveSequence]:
        if self._model is None or self._ctx is None or self._live is None:
            raise RuntimeError("Engine.load() must be called before a turn")
        return self._model, self._ctx, self._live

    # -- planning -------------------------------------------------------------------------------

    def _tokens_for(
        self, messages: Sequence[ChatMessage], variables: Mapping[str, Any] | None = None
    ) -> list[int]:
        """The conversation's prompt tokens. Message text (the user's, and replies put back into
        the history with their reasoning) is tokenized as plain text, so text such as
        "<|im_end|>" in a pasted log never becomes a control token; the same conversation always
        gives the same tokens, and the tokens before a message's text do not depend on that text
        (docs/engine.md). `variables`: extra template variables (`_template_variables`)."""
        return list(self._render(messages, variables).tokens)

    def _render(self, messages: Sequence[ChatMessage], variables: Mapping[str, Any] | None) -> RenderedPrompt:
        """The conversation rendered and tokenized; the preview before a turn and the turn
        render it once (`PromptRenderer` remembers the last one)."""
        self._require()
        assert self._renderer is not None
        return self._renderer.render(messages, variables)

    def thinking_support(self) -> ThinkingSupport | None:
        """The thinking controls the model's chat template offers (None: it has no usable
        template, which a turn reports)."""
        model = self._require()[0]
        try:
            return model.chat_template.thinking
        except ChatTemplateError:
            return None

    def _template_variables(
        self, reasoning: ReasoningSettings | None = None, tools: Sequence[ToolSpec] = ()
    ) -> dict[str, Any]:
        """The template variables a turn with these reasoning settings renders with (the
        profile's when None): the template's own thinking switch and level, if it has them, and
        the tool definitions (`tools`) when the turn offers tools."""
        support = self.thinking_support()
        if support is None:
            return {}
        out = support.variables(*requested(reasoning or self._profile.reasoning))
        if tools:
            out["tools"] = tool_variable(tools)
        return out

    def tool_format(self) -> str | None:
        """The name of the tool-call format the model's chat template speaks (None: it renders
        no tools, or has no template)."""
        from .tools.formats import detect_format

        fmt = detect_format(self._require()[0].chat_template_source or "")
        return fmt.name if fmt is not None else None

    def count_tokens(self, text: str) -> int | None:
        """`text`'s tokens as plain message text (no special tokens parsed, no BOS): what an
        attached file adds to a prompt, give or take the tokens where it meets its label."""
        model = self._require()[0]
        return len(model.tokenize(text, add_special=False, parse_special=False))

    def preview(
        self,
        messages: Sequence[ChatMessage],
        *,
        reasoning: ReasoningSettings | None = None,
        tools: Sequence[ToolSpec] = (),
    ) -> ResumePreview:
        """How much the next turn would reuse, without touching the context (the UI shows this
        before sending): cached tokens, tokens to prefill, estimated prefill seconds. Give the
        `reasoning` settings the turn will run with: they can change the prompt."""
        live = self._require()[2]
        prompt = self._render(messages, self._template_variables(reasoning, tools))
        tokens = prompt.tokens
        start = live.best_start(tokens, self._checkpoints)
        tail = len(tokens) - start.n_tokens
        rate = self._prefill_tok_s
        # what every new session shares (the system prompt): asked only when something is cached
        assert self._renderer is not None
        shared = len(self._renderer.shared_prefix(prompt)) if start.n_tokens else 0
        return ResumePreview(
            len(tokens), start.n_tokens, tail, start.source, tail / rate if rate else None, shared
        )

    # -- turns ----------------------------------------------------------------------------------

    def turn(
        self,
        messages: Sequence[ChatMessage],
        *,
        sampling: SamplingSettings | None = None,
        reasoning: ReasoningSettings | None = None,
        max_tokens: int | None = None,
        cancel: threading.Event | None = None,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str = "auto",
    ) -> Turn:
        """Prepare a turn and return it (nothing runs until it is iterated).

        Raises at once (before any event) for user errors: no chat template, a conversation
        longer than the context, tools offered to a template that renders none. `sampling` and
        `reasoning` default to the profile's; the reasoning settings set the template's thinking
        switch and level. `cancel`: an event that stops the turn like `Turn.cancel()`.
        `tools`: the definitions the model is offered (the template's `tools` variable); a call
        it opens is constrained by a grammar to a well-formed call of one of them
        (`tool_choice`: "auto", "required": a call from the first token of the answer, "none":
        described, never constrained or parsed), and `TurnDone.tool_calls` has the calls.
        """
        return self._turn(
            messages,
            sampling=sampling,
            reasoning=reasoning,
            max_tokens=max_tokens,
            cancel=cancel,
            tools=tools,
            tool_choice=tool_choice,
        )

    def _turn(
        self,
        messages: Sequence[ChatMessage],
        *,
        sampling: SamplingSettings | None = None,
        reasoning: ReasoningSettings | None = None,
        max_tokens: int | None = None,
        cancel: threading.Event | None = None,
        ignore_eos: bool = False,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str = "auto",
        forced_offer: ToolOffer | None = None,
    ) -> Turn:
        """`turn`, and `ignore_eos` keeps decoding past end-of-generation tokens (the benchmark
        times a fixed number of tokens so, through `Diagnostics.turn`); `forced_offer` replaces
        the offer of `tools` (`bench --tools` forces a scripted call, `Diagnostics.turn`)."""
        model, _ctx, live = self._require()
        t_start = time.perf_counter()
        variables = self._template_variables(reasoning, tools)
        prompt = self._render(messages, variables)
        tokens = prompt.tokens
        if len(tokens) >= live.n_ctx:
            raise PromptTooLong(
                f"the conversation is {len(tokens):,} tokens but the context holds {live.n_ctx:,}"
                " (raise context.n_ctx in the profile or start a new session)"
            )
        settings = sampling or self._profile.sampling
        if max_tokens is not None:
            settings = dataclasses.replace(settings, max_tokens=max_tokens)
        support = model.chat_template.thinking
        budget = self._budget(support, reasoning or self._profile.reasoning, variables)
        stop = cancel or threading.Event()
        opens_in_reasoning = support.opens_reasoning(prompt.generation_prompt)
        offer = forced_offer or self._tool_offer(
            tools, tool_choice, support.close_marker if opens_in_reasoning else ""
        )
        plan = TurnPlan(
            prompt=prompt,
            sampling=settings,
            cancel=stop,
            t_start=t_start,
            ignore_eos=ignore_eos,
            thinking=support,
            opens_in_reasoning=opens_in_reasoning,
            budget=budget,
            tools=offer,
            speculation=self._speculation(self._profile.speculation.enabled),
            spec_exactness=self._spec_exactness,
        )
        return Turn(self._observe(run_turn(self._parts(), plan)), stop, len(tokens))

    def _tool_offer(self, tools: Sequence[ToolSpec], choice: str, reasoning_close: str) -> ToolOffer | None:
        model = self._require()[0]
        return tool_offer(
            model.chat_template_source,
            tools,
            choice,
            model_name=model.path.name,
            reasoning_close=reasoning_close,
        )

    def _budget(
        self, support: ThinkingSupport, settings: ReasoningSettings, variables: Mapping[str, Any]
    ) -> ReasoningBudget:
        """The turn's thinking budget (none when it is 0 or the turn does not think). The
        engine writes the template's closing marker itself when the budget is spent, so a
        budget on a template whose markers are unknown is refused, in one line, rather than
        ignored."""
        if settings.budget_tokens <= 0 or not support.thinks(settings):
            return ReasoningBudget()
        if not support.markers_found:
            raise ProfileError(
                f"profile {self._profile.name!r}: reasoning.budget_tokens = {settings.budget_tokens} "
                "needs the reasoning markers of the model's chat template, and velo-chat finds none "
                "in this one (set it to 0)"
            )
        template = self._require()[0].chat_template

        def render_reply(answer: str, reasoning: str) -> str:
            reply = [ChatMessage("user", "Hi"), ChatMessage("assistant", answer, reasoning)]
            return template.render(reply, add_generation_prompt=False, variables=variables)

        closing = closing_text(support, render_reply)
        return ReasoningBudget(settings.budget_tokens, settings.budget_message, closing)

    def _parts(self) -> TurnParts:
        model, _ctx, live = self._require()
        assert self._renderer is not None
        return TurnParts(model, live, self._checkpoints, self._renderer)

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

    # -- warming a conversation no turn prompted with -------------------------------------------

    def warm(
        self, messages: Sequence[ChatMessage], *, reasoning: ReasoningSettings | None = None
    ) -> int | None:
        """Make `messages` (a conversation that ends with an assistant reply) the live state
        and save a checkpoint at its follow-up boundary: exactly the prefix that the next user
        turn appended to `messages` reuses (`PromptRenderer.follow_up_prefix`), so that turn
        resumes warm in this process (the live context) and in a new one (the disk tier).

        Why: a compaction's continuation and a view without its oldest turns are conversations
        no turn has prompted with, so no turn left a checkpoint for them (docs/compaction.md).
        This starts from the best saved prefix as a turn does (`LiveSequence.start_from_best`)
        and prefills the rest one ubatch at a time, saving at a turn's interval stops and at the
        boundary. Give the `reasoning` settings the next turn will run with: they can change the
        prompt. Returns the tokens prefilled; raises `PromptTooLong` when the boundary does not
        fit the context. A llama.cpp failure empties the live context before it is raised."""
        if not messages or messages[-1].role != "assistant":
            raise ValueError("warm needs a conversation that ends with an assistant reply")
        live = self._require()[2]
        assert self._renderer is not None
        *history, reply = messages
        prompt = self._render(history, self._template_variables(reasoning))
        target = self._renderer.follow_up_prefix(prompt, reply.content, reply.reasoning_content)
        if len(target) >= live.n_ctx:
            raise PromptTooLong(
                f"the conversation is {len(target):,} tokens but the context holds {live.n_ctx:,}"
                " (raise context.n_ctx in the profile or start a new session)"
            )
        ck = self._checkpoints
        try:
            # a sentinel token after the boundary: a saved state of the whole boundary is usable
            cached, _source, _restore_s = live.start_from_best([*target, -1], ck)
            interval = ck.settings.interval_tokens if ck is not None else 0
            pos = cached
            for stop in prefill_stops(cached, len(target), interval, save_last=False):
                while pos < stop:
                    chunk = target[pos : min(stop, pos + live.n_ubatch)]
                    live.extend(chunk)
                    pos += len(chunk)
                if ck is not None:
                    live.save(ck)
            if ck is not None and cached == len(target):
                live.save(ck)  # nothing to prefill: make sure the boundary is saved (a no-op if it is)
            live.synchronize()
        except BaseException:
            live.clear()
            raise
        log.info("warmed a conversation: %d tokens, %d prefilled", len(target), len(target) - cached)
        return len(target) - cached
