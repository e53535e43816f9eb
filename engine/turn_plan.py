"""What a turn is given and where it ends: its plan and parts, where the prefill pauses to save,
and the follow-up boundary after the reply (`close_boundary`).

Apart from the turn's phases (`turn_runner.py`) so each stays one idea; the turn runner and the
engine import these from here.
"""

from __future__ import annotations

import codecs
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .checkpoints.manager import Checkpoints
from .config.profile_schema import SamplingSettings, SpeculationSettings
from .live_sequence import MAX_RESTORE_ATTEMPTS, RESTORE_MIN_GAIN, LiveSequence
from .llama.model import LlamaModel
from .prompt.rendered import PromptRenderer, RenderedPrompt
from .prompt.thinking import ReasoningBudget, ReasoningSplitter, ThinkingSupport
from .tools.offer import ToolOffer
from .tools.types import ToolCall


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
    prompt: RenderedPrompt  # the conversation, rendered once (`PromptRenderer.render`)
    sampling: SamplingSettings
    cancel: threading.Event
    t_start: float
    ignore_eos: bool
    thinking: ThinkingSupport = field(default_factory=ThinkingSupport)  # reasoning markers
    opens_in_reasoning: bool = False  # the generation prompt ends inside a reasoning block
    budget: ReasoningBudget = field(default_factory=ReasoningBudget)  # thinking budget (0: none)
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    spec_exactness: str = ""  # "bit-identical" or "batch rounding: why" (Engine, at load)
    tools: ToolOffer | None = None  # the tools offered (their grammar, format, parser); None: none

    def splitter(self) -> ReasoningSplitter:
        """Splits this turn's reply into reasoning and answer."""
        return ReasoningSplitter(
            self.thinking.open_marker, self.thinking.close_marker, inside=self.opens_in_reasoning
        )


@dataclass(frozen=True)
class ParsedTurn:
    """A finished reply's answer, reasoning and tool calls (`_Turn.done_parts`)."""

    text: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class TurnParts:
    """What a turn works with: the model, the live sequence, the checkpoints (None: off) and
    the engine's prompt renderer. The engine hands these over; nothing here reaches back."""

    model: LlamaModel
    live: LiveSequence
    checkpoints: Checkpoints | None
    renderer: PromptRenderer


def _prefill_stops(
    start: int,
    end: int,
    interval: int,
    save_last: bool,
    stable: int | None = None,
    shared: int | None = None,
) -> list[int]:
    """Positions where the prefill pauses to save a checkpoint (the last one is `end`).
    `stable`: how much of the prompt every continuation keeps (hybrid models,
    `checkpoints/save_points.py`); when that is less than `end - 1`, the state before the reply
    is saved there. `shared`: the end of the part every new session shares (`shared_point`),
    saved too."""
    stops: set[int] = {end}
    if shared is not None and start < shared < end:
        stops.add(shared)
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


def close_boundary(
    parts: TurnParts,
    plan: TurnPlan,
    reply: str,
    n_generated: int,
    *,
    reasoning: str = "",
    tool_calls: Sequence[ToolCall] = (),
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
    target = parts.renderer.follow_up_prefix(plan.prompt, reply, reasoning, tool_calls)
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
