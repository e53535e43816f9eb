"""The in-process engine: one model, one context, one live sequence, turns as event iterators.

`Engine.turn(messages)` renders the whole conversation with the model's chat template, tokenizes
it, reuses the longest usable prefix of what the context already holds, prefills the rest one
ubatch at a time and decodes token by token. Everything it has to say comes out as events
(`events.py`); it never prints and never imports the UI.

Prefix reuse follows the memory type (DESIGN.md): an attention-only model may truncate its live
sequence to the common prefix (`seq_rm`), a hybrid/recurrent one may only continue exactly from
what it holds (llama.cpp cannot rewind recurrent state).
"""

from __future__ import annotations

import codecs
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import default_model
from .chat_template import ChatMessage
from .events import (
    EngineEvent, ModelLoaded, ModelLoading, PrefillProgress, TokenDelta, TurnDone, TurnFailed,
    TurnStarted, TurnStats,
)
from .llama_context import DecodeError, LlamaContext
from .llama_model import LlamaModel
from .profile_schema import Profile, SamplingSettings
from .sampling import Sampler

log = logging.getLogger(__name__)


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


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Engine:
    """Owns the model and context. Not thread-safe: one turn at a time, from one thread."""

    def __init__(self, profile: Profile, *, model_path: str | Path | None = None) -> None:
        self.profile = profile
        self.model_path = resolve_model_path(profile, model_path)
        self.model: LlamaModel | None = None
        self.ctx: LlamaContext | None = None
        self.live_tokens: list[int] = []
        self.last_prefill_tok_s: float | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def load(self, on_event: Callable[[EngineEvent], None] | None = None,
             cancel: threading.Event | None = None) -> ModelLoaded:
        """Load the model and create the context, reporting `ModelLoading` progress."""
        emit = on_event or (lambda _e: None)

        def progress(fraction: float) -> bool:
            emit(ModelLoading(fraction))
            return not (cancel and cancel.is_set())

        t0 = time.perf_counter()
        model = LlamaModel(self.model_path, self.profile.model, on_progress=progress)
        try:
            ctx = LlamaContext(model, self.profile.context)
        except BaseException:
            model.close()
            raise
        self.model, self.ctx = model, ctx
        self.live_tokens = []
        loaded = ModelLoaded(
            path=str(self.model_path), architecture=model.architecture, n_params=model.n_params,
            size_bytes=model.size_bytes, n_ctx=ctx.n_ctx, n_threads=ctx.n_threads,
            hybrid=model.hybrid, load_s=time.perf_counter() - t0,
        )
        emit(loaded)
        return loaded

    def close(self) -> None:
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

    def reset(self) -> None:
        """Forget the live sequence (the next turn prefills from scratch)."""
        _, ctx = self._require()
        ctx.clear()
        self.live_tokens.clear()

    def _require(self) -> tuple[LlamaModel, LlamaContext]:
        if self.model is None or self.ctx is None:
            raise RuntimeError("Engine.load() must be called before a turn")
        return self.model, self.ctx

    # -- turns ----------------------------------------------------------------------------------

    def tokens_for(self, messages: Sequence[ChatMessage]) -> list[int]:
        model, _ = self._require()
        return model.tokenize_prompt(model.chat_template.render(messages))

    def preview(self, messages: Sequence[ChatMessage]) -> ResumePreview:
        """How much the next turn would reuse, without touching the context (the UI shows this
        before sending): cached tokens, tokens to prefill, estimated prefill seconds."""
        model, _ = self._require()
        tokens = self.tokens_for(messages)
        cached, source = self._best_prefix(tokens)
        tail = len(tokens) - cached
        rate = self.last_prefill_tok_s
        return ResumePreview(len(tokens), cached, tail, source,
                             tail / rate if rate else None)

    def _best_prefix(self, tokens: Sequence[int]) -> tuple[int, str]:
        """The longest prefix of `tokens` the next turn can start from, and where it is."""
        model, _ = self._require()
        common = common_prefix(self.live_tokens, tokens)
        keep = min(common, len(tokens) - 1)
        if model.hybrid and keep < len(self.live_tokens):
            keep = 0
        return keep, ("live" if keep else "none")

    def turn(self, messages: Sequence[ChatMessage], *, sampling: SamplingSettings | None = None,
             max_tokens: int | None = None, cancel: threading.Event | None = None,
             ignore_eos: bool = False) -> Iterator[EngineEvent]:
        """Prepare a turn and return its event iterator.

        Raises at once (before any event) for user errors: no chat template, a conversation
        longer than the context. `ignore_eos` keeps decoding past end-of-generation tokens (the
        benchmark uses it to time a fixed number of tokens).
        """
        model, ctx = self._require()
        t_start = time.perf_counter()
        tokens = self.tokens_for(messages)
        if len(tokens) >= ctx.n_ctx:
            raise PromptTooLong(
                f"the conversation is {len(tokens):,} tokens but the context holds {ctx.n_ctx:,}"
                " (raise context.n_ctx in the profile or start a new session)"
            )
        settings = sampling or self.profile.sampling
        if max_tokens is not None:
            settings = dataclasses.replace(settings, max_tokens=max_tokens)
        return self._run(tokens, settings, cancel or threading.Event(), t_start, ignore_eos)

    def _reuse_live(self, tokens: list[int]) -> int:
        """Make the context hold a prefix of `tokens` and return its length (0 = cold)."""
        model, ctx = self._require()
        live = self.live_tokens
        common = common_prefix(live, tokens)
        # At least one token must be decoded to get logits for the next one.
        keep = min(common, len(tokens) - 1)
        if keep == len(live) and keep > 0:
            return keep
        if keep > 0 and not model.hybrid and ctx.truncate(keep):
            del live[keep:]
            return keep
        ctx.clear()
        live.clear()
        return 0

    def _run(self, tokens: list[int], settings: SamplingSettings, cancel: threading.Event,
             t_start: float, ignore_eos: bool) -> Iterator[EngineEvent]:
        model, ctx = self._require()
        cached = self._reuse_live(tokens)
        source = "live" if cached else "none"
        tail = tokens[cached:]
        yield TurnStarted(len(tokens), cached, len(tail), source)

        perf0 = ctx.perf()
        text_parts: list[str] = []
        decode_tokens = 0
        finish = "stop"
        t_prefill0 = time.perf_counter()
        try:
            # -- prefill, one ubatch per llama_decode so progress and cancel are per ubatch
            step = ctx.n_ubatch
            done = 0
            while done < len(tail):
                chunk = tail[done:done + step]
                ctx.decode(chunk)
                self.live_tokens.extend(chunk)
                done += len(chunk)
                elapsed = time.perf_counter() - t_prefill0
                tok_s = done / elapsed if elapsed > 0 else 0.0
                eta = (len(tail) - done) / tok_s if tok_s > 0 else 0.0
                yield PrefillProgress(done, len(tail), tok_s, eta)
                if cancel.is_set() and done < len(tail):
                    finish = "cancelled"
                    break
            ctx.synchronize()  # books the prefill into llama.cpp's prompt-eval counters
            t_prefill1 = time.perf_counter()
            prefill_s = t_prefill1 - t_prefill0
            if tail and finish != "cancelled":
                self.last_prefill_tok_s = len(tail) / prefill_s if prefill_s > 0 else None
            perf1 = ctx.perf()

            # -- decode
            t_first = t_last = None
            if finish != "cancelled":
                utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
                with Sampler(settings, model.n_vocab, tokens) as sampler:
                    live = self.live_tokens
                    n_ctx = ctx.n_ctx
                    for _ in range(settings.max_tokens):
                        token = sampler.sample(ctx.ctx)
                        now = time.perf_counter()
                        if t_first is None:
                            t_first = now
                        if model.is_eog(token) and not ignore_eos:
                            break
                        t_last = now
                        decode_tokens += 1
                        piece = utf8.decode(model.token_bytes(token), False)
                        if piece:
                            text_parts.append(piece)
                        yield TokenDelta(piece, token, now)
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
                    tail_text = utf8.decode(b"", True)
                    if tail_text:
                        text_parts.append(tail_text)
            t_end = time.perf_counter()
        except DecodeError as exc:
            log.warning("turn failed: %s", exc)
            ctx.clear()  # a failed decode leaves the sequence in an unknown state: start cold
            self.live_tokens.clear()
            yield TurnFailed(str(exc), "".join(text_parts))
            return
        perf2 = ctx.perf()
        decode_wall = (t_end - t_prefill1) if t_first is not None else 0.0
        decode_span = (t_last - t_first) if (t_first is not None and t_last is not None) else 0.0
        decode_tok_s = (decode_tokens - 1) / decode_span if decode_tokens > 1 and decode_span > 0 \
            else 0.0
        stats = TurnStats(
            ttft_s=(t_first - t_start) if t_first is not None else 0.0,
            prompt_tokens=len(tokens), cached_tokens=cached, prefill_tokens=len(tail),
            prefill_s=prefill_s,
            prefill_tok_s=(len(tail) / prefill_s) if tail and prefill_s > 0 else 0.0,
            decode_tokens=decode_tokens, decode_s=decode_span, decode_tok_s=decode_tok_s,
            graphs_reused=perf2.n_reused - perf0.n_reused,
            llama_eval_ms=perf2.eval_ms - perf1.eval_ms,
            llama_prompt_eval_ms=perf1.prompt_eval_ms - perf0.prompt_eval_ms,
            wall_ms=decode_wall * 1000.0, total_s=t_end - t_start, finish_reason=finish,
            checkpoint={"source": source, "restore_s": 0.0},
        )
        yield TurnDone("".join(text_parts), stats)
