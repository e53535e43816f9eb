"""The in-process engine: one model, one context, one live sequence, turns as event iterators.

`Engine.turn(messages)` renders the whole conversation with the model's chat template, tokenizes
it, starts from the longest usable prefix it already has — the live context, a RAM checkpoint or
a disk checkpoint — prefills the rest one ubatch at a time and decodes token by token
(`turn_runner.py`). Everything it has to say comes out as events (`events.py`); it never prints
and never imports the UI.

Prefix reuse follows the memory type (docs/architecture.md): an attention-only model may truncate its live
sequence (or a restored checkpoint) to the common prefix with `seq_rm`; a hybrid/recurrent one
may only continue exactly from a state saved after a prefix of the new tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .setup import default_model
from . import gguf_file
from .config import locations
from .chat_template import ChatMessage, ChatTemplateError
from .checkpoints import Candidate, Checkpoints
from .events import EngineEvent, ModelLoaded, ModelLoading, TurnDone, TurnFailed
from .llama_context import LlamaContext
from .llama_model import LlamaModel
from .config.profile_schema import Profile, ReasoningSettings, SamplingSettings
from .thinking import ThinkingSupport, requested
from .turn_runner import TurnPlan, common_prefix, run_turn

log = logging.getLogger(__name__)


RESTORE_MIN_GAIN = 32
"""Tokens a checkpoint must save over the live context to be worth restoring (a restore copies
the whole state, roughly the cost of prefilling a few dozen tokens)."""


@dataclass(frozen=True)
class ResumePreview:
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    source: str  # "live", "ram", "disk" or "none"
    est_prefill_s: float | None  # None until a prefill rate has been measured


class PromptTooLong(ValueError):
    """The conversation does not fit in the context; a user error."""


def resolve_model_path(profile: Profile, override: str | Path | None = None) -> Path:
    """The GGUF a profile points at: an explicit override, the embedded default, or a path."""
    raw = str(override) if override is not None else profile.model.path
    if raw == "default":
        return default_model.require_default_model()
    return Path(raw).expanduser()


class Engine:
    """Owns the model, the context and the checkpoints. Not thread-safe: one call at a time."""

    def __init__(
        self, profile: Profile, *, model_path: str | Path | None = None, checkpoint_root: Path | None = None
    ) -> None:
        self.profile = profile
        self.model_path = resolve_model_path(profile, model_path)
        self.checkpoint_root = checkpoint_root
        self.model: LlamaModel | None = None
        self.ctx: LlamaContext | None = None
        self.checkpoints: Checkpoints | None = None
        self.live_tokens: list[int] = []
        self.last_prefill_tok_s: float | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise `GGUFError` (one line) now if the model file is missing or not a whole GGUF.

        Reads only the header, so a profile switch can refuse a bad path before the running
        model is closed (a big machine cannot hold two large models to try)."""
        gguf_file.read_header(self.model_path)

    def load(
        self, on_event: Callable[[EngineEvent], None] | None = None, cancel: threading.Event | None = None
    ) -> ModelLoaded:
        """Load the model and create the context, reporting `ModelLoading` progress."""
        emit = on_event or (lambda _e: None)

        def progress(fraction: float) -> bool:
            emit(ModelLoading(fraction))
            return not (cancel and cancel.is_set())

        t0 = time.perf_counter()
        model = LlamaModel(self.model_path, self.profile.model, on_progress=progress)
        try:
            ctx = LlamaContext(model, self.profile.context, n_gpu_layers=self.profile.model.n_gpu_layers)
        except BaseException:
            model.close()
            raise
        self.model, self.ctx = model, ctx
        self.live_tokens = []
        if self.profile.checkpoints.enabled:
            self.checkpoints = Checkpoints(
                self.profile.checkpoints,
                fingerprint=model.fingerprint,
                ctx=ctx,
                hybrid=model.hybrid,
                root=self.checkpoint_root or locations.checkpoints_dir(),
            )
        loaded = ModelLoaded(
            path=str(self.model_path),
            architecture=model.architecture,
            n_params=model.n_params,
            size_bytes=model.size_bytes,
            n_ctx=ctx.n_ctx,
            n_threads=ctx.n_threads,
            hybrid=model.hybrid,
            load_s=time.perf_counter() - t0,
            n_threads_batch=ctx.n_threads_batch,
            threads=ctx.thread_plan.describe(),
        )
        emit(loaded)
        return loaded

    def flush_checkpoints(self, timeout: float | None = None) -> bool:
        """Wait until queued checkpoint writes are on disk."""
        return self.checkpoints.flush(timeout) if self.checkpoints else True

    def close(self) -> None:
        """Finish pending checkpoint writes, then free the context and the model."""
        if self.checkpoints:
            self.checkpoints.close()
            self.checkpoints = None
        if self.ctx:
            self.ctx.close()
            self.ctx = None
        if self.model:
            self.model.close()
            self.model = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def checkpoints_at(self, root: Path | None) -> Iterator[None]:
        """Use another checkpoint directory (None: no checkpoints) for a while; the benchmark
        measures cold and restored turns with the model it already has loaded."""
        model, ctx = self._require()
        saved = self.checkpoints
        self.checkpoints = (
            None
            if root is None
            else Checkpoints(
                self.profile.checkpoints,
                fingerprint=model.fingerprint,
                ctx=ctx,
                hybrid=model.hybrid,
                root=root,
            )
        )
        try:
            yield
        finally:
            if self.checkpoints is not None:
                self.checkpoints.close()
            self.checkpoints = saved

    def complete(self, messages: Sequence[ChatMessage], **kwargs: Any) -> TurnDone:
        """Run a turn to its end and return its `TurnDone` (TurnFailed raises RuntimeError)."""
        for event in self.turn(messages, **kwargs):
            if isinstance(event, TurnDone):
                return event
            if isinstance(event, TurnFailed):
                raise RuntimeError(event.reason)
        raise RuntimeError("the turn ended without TurnDone")

    def reset(self) -> None:
        """Forget the live sequence (checkpoints stay)."""
        _, ctx = self._require()
        ctx.clear()
        self.live_tokens.clear()

    def _require(self) -> tuple[LlamaModel, LlamaContext]:
        if self.model is None or self.ctx is None:
            raise RuntimeError("Engine.load() must be called before a turn")
        return self.model, self.ctx

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
        model, _ = self._require()
        segments = model.chat_template.segments(messages, variables=variables)
        last_plain = max((i for i, s in enumerate(segments) if s.plain), default=-1)
        tail = "".join(s.text for s in segments[last_plain + 1 :])
        return model.tokenize_segments(segments), tail

    def thinking_support(self) -> ThinkingSupport | None:
        """The thinking controls the model's chat template offers (None: it has no usable
        template, which a turn reports)."""
        model, _ = self._require()
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
        return support.variables(*requested(reasoning or self.profile.reasoning))

    def _live_usable(self, tokens: Sequence[int]) -> int:
        model, _ = self._require()
        live = self.live_tokens
        keep = min(common_prefix(live, tokens), len(tokens) - 1)
        if model.hybrid and keep < len(live):
            return 0  # a recurrent state cannot be rewound
        return keep

    def _plan(self, tokens: list[int]) -> tuple[int, str, Candidate | None]:
        """The longest usable prefix and where it is. The live context costs nothing to reuse,
        a checkpoint a copy of the whole state: one must save `RESTORE_MIN_GAIN` more tokens."""
        live_n = self._live_usable(tokens)
        cand = self.checkpoints.find(np.asarray(tokens, dtype=np.int32)) if self.checkpoints else None
        if cand is not None and cand.n_tokens >= live_n + (RESTORE_MIN_GAIN if live_n else 1):
            return cand.n_tokens, cand.source, cand
        return live_n, ("live" if live_n else "none"), None

    def preview(
        self, messages: Sequence[ChatMessage], *, reasoning: ReasoningSettings | None = None
    ) -> ResumePreview:
        """How much the next turn would reuse, without touching the context (the UI shows this
        before sending): cached tokens, tokens to prefill, estimated prefill seconds. Give the
        `reasoning` settings the turn will run with: they can change the prompt."""
        tokens = self.tokens_for(messages, self.template_variables(reasoning))
        cached, source, _ = self._plan(tokens)
        tail = len(tokens) - cached
        rate = self.last_prefill_tok_s
        return ResumePreview(len(tokens), cached, tail, source, tail / rate if rate else None)

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
    ) -> Iterator[EngineEvent]:
        """Prepare a turn and return its event iterator.

        Raises at once (before any event) for user errors: no chat template, a conversation
        longer than the context. `reasoning` (the profile's when None) sets the template's
        thinking switch and level. `ignore_eos` keeps decoding past end-of-generation tokens (the
        benchmark uses it to time a fixed number of tokens).
        """
        model, ctx = self._require()
        t_start = time.perf_counter()
        variables = self.template_variables(reasoning)
        tokens, prompt_tail = self._prompt(messages, variables)
        if len(tokens) >= ctx.n_ctx:
            raise PromptTooLong(
                f"the conversation is {len(tokens):,} tokens but the context holds {ctx.n_ctx:,}"
                " (raise context.n_ctx in the profile or start a new session)"
            )
        settings = sampling or self.profile.sampling
        if max_tokens is not None:
            settings = dataclasses.replace(settings, max_tokens=max_tokens)
        support = model.chat_template.thinking
        plan = TurnPlan(
            messages=tuple(messages),
            tokens=tokens,
            sampling=settings,
            cancel=cancel or threading.Event(),
            t_start=t_start,
            ignore_eos=ignore_eos,
            variables=variables,
            thinking=support,
            opens_in_reasoning=support.opens_reasoning(prompt_tail),
        )
        return run_turn(self, plan)
