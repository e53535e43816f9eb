"""Measurement hooks on the in-process engine, behind one explicit object.

`velo-chat bench`, the scripts in `benchmarks/` and the tests ask an engine for more than a chat
needs: its thread counts, turns run to their end past end-of-generation, another checkpoint
directory for a while, the cost of a verify batch. None of that is on `EngineAPI` (the app never
needs it); it is here, on `Diagnostics`, which only the in-process engine has:

    engine = make_engine(profile)
    engine.load()
    probe = diagnostics(engine)           # NoDiagnostics for a remote engine
    with probe.fixed_threads(1, 4): ...
    done = probe.complete(messages, max_tokens=64, ignore_eos=True)

The low-level pieces the benchmark scripts build their own experiments from (a model and a
context without an engine, the speculation stepper and its cost model) are exported here too, so
nothing outside `engine/` imports the engine's internals.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import turn_runner
from .api import EngineAPI, Turn, TurnHandle
from .checkpoints.file_format import SUFFIX as CHECKPOINT_SUFFIX
from .checkpoints.file_format import read_header as read_checkpoint_header
from .config.profile_schema import ReasoningSettings, SamplingSettings
from .engine import Engine
from .errors import PromptTooLong
from .events import TokenDelta, TurnDone, TurnFailed
from .fit.estimate import estimate as estimate_terms
from .fit.llama_buffers import Comparison as BufferComparison
from .fit.llama_buffers import captured as captured_llama_buffers
from .fit.residency import drop_from_page_cache as drop_from_page_cache
from .fit.llama_buffers import compare as compare_llama_buffers
from .fit.report import FitReport
from .live_sequence import LiveSequence
from .llama.context import LlamaContext
from .llama.gguf_file import read_header as read_gguf_header
from .llama.gguf_file import shard_paths as gguf_shard_paths
from .llama.log import install as install_llama_log
from .llama.log import lines as llama_log_lines
from .llama.model import LlamaModel
from .llama.ple_provider import PleProvider, locate_tensor
from .llama.sampling import Sampler
from .prompt.chat_template import ChatMessage, ChatTemplate, ChatTemplateError
from .prompt.tokens import common_prefix
from .scheduling.cpu_group import holds_processes as cgroup_holds_processes
from .scheduling.cpu_group import make_sibling as make_sibling_cgroup
from .scheduling.cpu_group import remove as remove_cgroup
from .scheduling.gpu_wait import apply as apply_gpu_wait
from .scheduling.threads import CpuLoad, ThreadPlan
from .speculation.cost import Acceptance, CostModel, best_draft_length
from .speculation.measure import ReplayResult, batch_logit_differences, replay_decode, verify_batch_costs
from .speculation.stepper import SpecStepper
from .prompt.rendered import PromptRenderer, follow_up_prefix
from .tools.fmt_gbnf import literal
from .tools.formats import ToolFormat
from .tools.grammar import Grammar
from .tools.offer import ToolOffer
from .tools.types import ToolCall, ToolSpec

__all__ = [
    # the hooks
    "Diagnostics",
    "NoDiagnostics",
    "diagnostics",
    "turn_past_eos",
    # building blocks for experiments (benchmarks/)
    "Acceptance",
    "BufferComparison",
    "CHECKPOINT_SUFFIX",
    "CostModel",
    "CpuLoad",
    "LiveSequence",
    "LlamaContext",
    "LlamaModel",
    "PleProvider",
    "ReplayResult",
    "SpecStepper",
    "apply_gpu_wait",
    "best_draft_length",
    "captured_llama_buffers",
    "cgroup_holds_processes",
    "common_prefix",
    "compare_llama_buffers",
    "estimate_terms",
    "follow_up_prefix",
    "gguf_shard_paths",
    "install_llama_log",
    "llama_log_lines",
    "locate_tensor",
    "make_sibling_cgroup",
    "read_checkpoint_header",
    "read_gguf_header",
    "remove_cgroup",
]


class NoDiagnostics(TypeError):
    """The engine has no measurement hooks (a remote engine, the test fake)."""


@dataclasses.dataclass(frozen=True)
class CheckpointMemory:
    """The checkpoint tiers' contents: RAM entries, the bytes their states stand for and the
    bytes the tier holds for them (shared chunks once); disk entries and the bytes of the
    model's checkpoint directory (files and packs)."""

    ram_entries: int
    ram_state_bytes: int
    ram_held_bytes: int
    disk_entries: int
    disk_bytes: int


def diagnostics(engine: EngineAPI) -> Diagnostics:
    """The measurement hooks of an in-process engine; `NoDiagnostics` for any other engine."""
    if not isinstance(engine, Engine):
        raise NoDiagnostics(
            f"{type(engine).__name__} has no measurement hooks: only the in-process engine "
            '(a profile with backend.kind = "local") has them'
        )
    return Diagnostics(engine)


def turn_past_eos(engine: EngineAPI, messages: Sequence[ChatMessage], *, max_tokens: int) -> TurnHandle:
    """A turn that keeps decoding past end-of-generation tokens to time `max_tokens` tokens: on
    the in-process engine, or on a remote one, which asks its server for it (`ignore_eos`, which
    llama-server and vLLM honour; a server that stops early gives fewer tokens)."""
    start = getattr(engine, "_turn", None)
    if start is None:
        raise NoDiagnostics(f"{type(engine).__name__} cannot decode past end-of-generation tokens")
    turn: TurnHandle = start(messages, max_tokens=max_tokens, ignore_eos=True)
    return turn


class Diagnostics:
    """What the benchmark and the tests ask of an in-process engine beyond `EngineAPI`. A view of
    the engine (it holds no state of its own): use it while the engine is loaded."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def engine(self) -> EngineAPI:
        """The engine these hooks measure."""
        return self._engine

    # -- what is loaded -------------------------------------------------------------------------

    @property
    def model_path(self) -> Path:
        """The GGUF the engine loads (the first shard of a split model)."""
        return self._engine._model_path

    @property
    def fit(self) -> FitReport | None:
        """The memory estimate the last `check()` made (None before one)."""
        return self._engine._fit

    @property
    def thread_plan(self) -> ThreadPlan:
        return self._engine._require()[1].thread_plan

    @property
    def threads_now(self) -> tuple[int, int]:
        """(decode, prefill) threads in use now (fewer than planned while the machine is busy)."""
        return self._engine._require()[1].threads_now

    def fixed_threads(self, decode: int, batch: int | None = None) -> contextlib.AbstractContextManager[None]:
        """Run with fixed thread counts for a while (the benchmark's thread section)."""
        return self._engine._require()[1].fixed_threads(decode, batch)

    @property
    def speculation(self) -> str:
        """Speculation's state and guarantee on this setup, in words
        (`ModelLoaded.speculation.mode`): "off", "on: bit-identical to plain decoding", "on:
        plain decoding up to the batch rounding (why)", or off and why."""
        info = self._engine.info
        return info.speculation.mode if info is not None and info.speculation is not None else ""

    @property
    def speculation_if_enabled(self) -> str:
        """`speculation` as it reads with `speculation.enabled` switched on (what a profile that
        enables it gets on this setup: `bench --spec` runs its "on" column so, and says it)."""
        return self._engine._spec_if_enabled if self._engine.info is not None else ""

    @property
    def verify_threads(self) -> str:
        """Which threads a verify batch runs on: "decode" (every layer on the GPU) or "prefill"."""
        return "decode" if self._engine._require()[1].verify_on_decode_threads else "prefill"

    # -- prompts --------------------------------------------------------------------------------

    def tokens_for(
        self, messages: Sequence[ChatMessage], variables: Mapping[str, Any] | None = None
    ) -> list[int]:
        """The conversation's prompt tokens, as a turn tokenizes it (`variables`: extra template
        variables, `template_variables`)."""
        return self._engine._tokens_for(messages, variables)

    def template_variables(
        self, reasoning: ReasoningSettings | None = None, tools: Sequence[ToolSpec] = ()
    ) -> dict[str, Any]:
        """The template variables a turn with these reasoning settings (the profile's when
        None) and these `tools` offered renders with."""
        return self._engine._template_variables(reasoning, tools)

    # -- turns and state ------------------------------------------------------------------------

    def turn(
        self,
        messages: Sequence[ChatMessage],
        *,
        sampling: SamplingSettings | None = None,
        reasoning: ReasoningSettings | None = None,
        max_tokens: int | None = None,
        cancel: threading.Event | None = None,
        ignore_eos: bool = False,
        tools: Sequence[ToolSpec] = (),
        forced_call: ToolCall | None = None,
    ) -> Turn:
        """`EngineAPI.turn`, and `ignore_eos` keeps decoding past end-of-generation tokens (to
        time a fixed number of tokens). `forced_call`: with `tools` offered, the reply is
        exactly that call as the chat template writes it (a grammar whose root is the call's
        text), then an end of generation: a scripted tool loop on any model, random weights
        included (`bench --tools`). Raises `ChatTemplateError` when the template renders no
        tools."""
        offer = self._forced_offer(tools, forced_call) if forced_call is not None else None
        return self._engine._turn(
            messages,
            sampling=sampling,
            reasoning=reasoning,
            max_tokens=max_tokens,
            cancel=cancel,
            ignore_eos=ignore_eos,
            tools=tools,
            forced_offer=offer,
        )

    def tool_format(self) -> ToolFormat | None:
        """The tool-call format of the chat template turns render with now (`chat_template`
        included); None: it renders no tools velo-chat reads."""
        return self._engine._require()[0].chat_template.tool_format

    def _forced_offer(self, tools: Sequence[ToolSpec], call: ToolCall) -> ToolOffer:
        fmt = self.tool_format()
        if fmt is None:
            raise ChatTemplateError("the model's chat template has no tool support")
        if call.name not in {t.name for t in tools}:
            raise ValueError(f"a forced call of {call.name!r}, which is not among the tools offered")
        return ToolOffer(tuple(tools), fmt, "required", Grammar(f"root ::= {literal(fmt.render(call))}\n"))

    @contextlib.contextmanager
    def chat_template(self, source: str) -> Iterator[None]:
        """Render turns with the chat template `source` instead of the model's for a while
        (`bench --tools-template`: a model whose own template has no tools is measured with one
        that has). A prompt is its tokens: the live state and the checkpoints stay valid across
        the switch. Raises `ChatTemplateError` for a template that does not parse."""
        engine = self._engine
        model = engine._require()[0]
        template = ChatTemplate(
            source,
            bos_token=model.token_text(model.bos_id) if model.bos_id >= 0 else "",
            eos_token=model.token_text(model.eos_id) if model.eos_id >= 0 else "",
            model_name=model.path.name,
            protected=model.prompt_tokenizer.special.protected_texts,
        )
        saved = model._template, engine._renderer
        model._template = template
        engine._renderer = PromptRenderer(lambda: model.chat_template, model.tokenize_segments)
        try:
            yield
        finally:
            model._template, engine._renderer = saved

    def complete(
        self, messages: Sequence[ChatMessage], *, deltas: list[TokenDelta] | None = None, **kwargs: Any
    ) -> TurnDone:
        """Run a turn (`turn`'s keywords) to its end and return its `TurnDone` (TurnFailed raises
        RuntimeError). `deltas`: a list that receives each `TokenDelta` (`bench --spec` times
        every token)."""
        turn = self.turn(messages, **kwargs)
        try:
            for event in turn:
                if isinstance(event, TurnDone):
                    return event
                if isinstance(event, TurnFailed):
                    raise RuntimeError(event.reason)
                if deltas is not None and isinstance(event, TokenDelta):
                    deltas.append(event)
        finally:
            turn.close()
        raise RuntimeError("the turn ended without TurnDone")

    def reset(self) -> None:
        """Forget the live sequence (checkpoints stay)."""
        self._engine._require()[2].clear()

    def flush_checkpoints(self, timeout: float | None = None) -> bool:
        """Wait until queued checkpoint writes are on disk and the RAM tier has chunked what
        it holds."""
        checkpoints = self._engine._checkpoints
        return checkpoints.settle(timeout) if checkpoints else True

    def checkpoint_memory(self) -> CheckpointMemory:
        """What the checkpoints hold right now, in RAM and on disk (call `flush_checkpoints`
        first for a settled answer)."""
        checkpoints = self._engine._checkpoints
        if checkpoints is None:
            return CheckpointMemory(0, 0, 0, 0, 0)
        ram = checkpoints.ram
        disk = checkpoints.disk
        disk_bytes = (
            sum(p.stat().st_size for p in disk.dir.iterdir() if p.is_file()) if disk and disk.available else 0
        )
        with ram._lock:
            entries = list(ram.entries.values())
        return CheckpointMemory(
            ram_entries=len(entries),
            ram_state_bytes=sum(len(e.state) for e in entries),
            ram_held_bytes=ram.used,
            disk_entries=len(disk.entries) if disk else 0,
            disk_bytes=disk_bytes,
        )

    @contextlib.contextmanager
    def checkpoints_at(self, root: Path | None, *, disk_chunked: bool | None = None) -> Iterator[None]:
        """Use another checkpoint directory (None: no checkpoints) for a while; the benchmark
        measures cold and restored turns with the model it already has loaded. `disk_chunked`:
        the disk tier writes chunked files (format 3) or single ones (format 2) meanwhile."""
        engine = self._engine
        engine._require()
        saved = engine._checkpoints
        engine._checkpoints = None if root is None else engine._make_checkpoints(engine.profile, root)
        if disk_chunked is not None and engine._checkpoints is not None and engine._checkpoints.disk:
            engine._checkpoints.disk.chunked = disk_chunked
        try:
            yield
        finally:
            if engine._checkpoints is not None:
                engine._checkpoints.close()
            engine._checkpoints = saved

    # -- speculation ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def stepper(self, cls: type[SpecStepper]) -> Iterator[None]:
        """Turns decode with `cls` (a `SpecStepper` subclass, e.g. one that times each step)
        where speculation is on, for a while (`benchmarks/spec_trace.py`)."""
        saved = turn_runner.SpecStepper
        turn_runner.SpecStepper = cls  # type: ignore[misc]
        try:
            yield
        finally:
            turn_runner.SpecStepper = saved  # type: ignore[misc]

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
        _model, ctx, live = self._engine._require()
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
        `messages` (`speculation.measure.batch_logit_differences`; `benchmarks/spec_logits.py`);
        the live sequence is empty afterwards."""
        live = self._engine._require()[2]
        tokens = self.tokens_for(messages, self.template_variables())
        return batch_logit_differences(live, tokens, positions, sizes)

    def spec_replay(self, messages: Sequence[ChatMessage], n: int) -> ReplayResult:
        """`n` greedy tokens after the prompt of `messages`, plain and then speculative with the
        plain reply in the draft source (`speculation.measure.replay_decode`: the best case on
        this backend; `velo-chat bench --spec`). The speculation settings are the profile's,
        drafts fit what the context was made for; the live sequence is empty afterwards."""
        engine = self._engine
        model, _ctx, live = engine._require()
        tokens = self.tokens_for(messages, self.template_variables())
        if len(tokens) + n >= live.n_ctx:
            raise PromptTooLong(f"{len(tokens)} prompt tokens and {n} more do not fit {live.n_ctx}")
        greedy = dataclasses.replace(engine.profile.sampling, temperature=0.0)
        spec = engine._speculation(True)
        return replay_decode(live, lambda: Sampler(greedy, model.n_vocab, tokens), spec, tokens, n)
