"""What a running engine tells its caller: plain frozen dataclasses, no UI types.

A turn is an iterator of these events, always in this order:
`TurnStarted`, `PrefillProgress`* (one per ubatch), `TokenDelta`* (one per generated token that
completes some text), optional `EngineWarning`s anywhere, then exactly one of `TurnDone` or
`TurnFailed`. Loading a model emits `ModelLoading`* then `ModelLoaded`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tools.types import ToolCall
from .turn_stats import (
    CheckpointStats,
    LlamaTimings,
    SavedCheckpoint,
    ServerStats,
    SpeculationStats,
    TurnStats,
)

__all__ = [
    "CheckpointSaved",
    "CheckpointStats",
    "EngineEvent",
    "EngineWarning",
    "LlamaTimings",
    "LocalModel",
    "ModelLoaded",
    "ModelLoading",
    "PleInfo",
    "PrefillProgress",
    "ResumePreview",
    "SavedCheckpoint",
    "ServerStats",
    "SpeculationInfo",
    "SpeculationStats",
    "ThreadsInfo",
    "TokenDelta",
    "TurnDone",
    "TurnFailed",
    "TurnStarted",
    "TurnStats",
]


@dataclass(frozen=True)
class ModelLoading:
    progress: float  # 0.0 .. 1.0


@dataclass(frozen=True)
class LocalModel:
    """What a model loaded in this process is (`ModelLoaded.local`)."""

    n_params: int
    size_bytes: int
    n_vocab: int
    hybrid: bool  # recurrent or hybrid memory: prefixes resume only at checkpoint boundaries
    graph_splits: int = 0  # graph splits of a decode step (backend hand-overs); 0: not logged


@dataclass(frozen=True)
class ThreadsInfo:
    """The CPU threads of a model loaded in this process (`ModelLoaded.threads`)."""

    decode: int  # decode threads as planned (fewer while the machine is busy)
    prefill: int  # prefill threads as planned
    plan: str = ""  # the thread plan in words: settings, counts and why (scheduling/threads.py)


@dataclass(frozen=True)
class PleInfo:
    """Where a qwen4exp model's per-layer-embedding rows are gathered (`ModelLoaded.ple`)."""

    gather: str  # "gpu" (velo-chat kernel) or "stock"
    reason: str  # why that mode, in words (and the table's GPU access mode)
    table: bool = False  # the model has a PLE table (qwen4exp): the panel then shows the path


@dataclass(frozen=True)
class SpeculationInfo:
    """Speculation on the loaded model (`ModelLoaded.speculation`)."""

    # its state and guarantee in words: "off", "on: bit-identical to plain decoding",
    # "on: plain decoding up to the batch rounding (why)", or off and why (speculation_mode)
    mode: str
    # the same as it would read with speculation.enabled switched on (`Diagnostics.speculation_if_enabled`:
    # what switching it on in the settings gets on this loaded model, before any reload)
    if_enabled: str = ""


@dataclass(frozen=True)
class ModelLoaded:
    """What `load()` loaded: the core every backend reports, and the parts only some have
    (None where a backend has no such thing: a remote server's threads are its own)."""

    path: str
    architecture: str  # "remote" for a server
    n_ctx: int  # 0: not reported
    load_s: float
    fingerprint: str = ""  # identifies the weights (sessions and checkpoints record it)
    local: LocalModel | None = None  # a model in this process
    threads: ThreadsInfo | None = None
    ple: PleInfo | None = None
    speculation: SpeculationInfo | None = None

    @property
    def hybrid(self) -> bool:
        return self.local is not None and self.local.hybrid


@dataclass(frozen=True)
class ResumePreview:
    """What the next turn would reuse (`Engine.preview`), shown before sending."""

    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    source: str  # "live", "ram", "disk" or "none"
    est_prefill_s: float | None  # None until a prefill rate has been measured
    # the part of the prompt every new session with this system prompt (and tools) starts
    # with, when something is cached (0: nothing is, or nothing is shared): cached_tokens
    # equal to it means the turn reuses that part alone, as a new session's first turn does
    shared_prefix_tokens: int = 0


@dataclass(frozen=True)
class TurnStarted:
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    source: str  # where the reused state came from: "live", "ram", "disk" or "none"


@dataclass(frozen=True)
class PrefillProgress:
    done: int  # tokens of the new tail prefilled so far
    total: int
    tok_s: float
    eta_s: float


@dataclass(frozen=True)
class TokenDelta:
    """One sampled token. A thinking model's reply is split into reasoning and answer
    (`prompt/thinking.py`): the reasoning text goes to `reasoning`, the answer's to `text`.
    Either may be "" while a multi-byte character is incomplete or a reasoning marker may be
    starting."""

    text: str  # answer text
    token_id: int
    t: float  # time.perf_counter() when the token was sampled
    reasoning: str = ""  # reasoning text
    in_reasoning: bool = False  # the token belongs to the reasoning (markers included)


@dataclass(frozen=True)
class EngineWarning:
    message: str


@dataclass(frozen=True)
class CheckpointSaved:
    tokens: int
    bytes: int
    tier: str  # "ram" or "disk"


@dataclass(frozen=True)
class TurnDone:
    text: str  # the answer (a tool call's text taken out: it is in `tool_calls`)
    stats: TurnStats
    reasoning: str = ""  # the reasoning, apart from the answer ("" if the model did not think)
    tool_calls: tuple[ToolCall, ...] = ()  # the calls the reply made (a turn that offered tools)


@dataclass(frozen=True)
class TurnFailed:
    reason: str
    text: str = ""  # partial answer, kept
    reasoning: str = ""  # partial reasoning, kept


EngineEvent = (
    ModelLoading
    | ModelLoaded
    | TurnStarted
    | PrefillProgress
    | TokenDelta
    | EngineWarning
    | CheckpointSaved
    | TurnDone
    | TurnFailed
)
