"""What a running engine tells its caller: plain frozen dataclasses, no UI types.

A turn is an iterator of these events, always in this order:
`TurnStarted`, `PrefillProgress`* (one per ubatch), `TokenDelta`* (one per generated token that
completes some text), optional `EngineWarning`s anywhere, then exactly one of `TurnDone` or
`TurnFailed`. Loading a model emits `ModelLoading`* then `ModelLoaded`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelLoading:
    progress: float  # 0.0 .. 1.0


@dataclass(frozen=True)
class ModelLoaded:
    path: str
    architecture: str
    n_params: int
    size_bytes: int
    n_ctx: int
    n_threads: int  # decode threads as planned (fewer while the machine is busy)
    hybrid: bool  # recurrent or hybrid memory: prefixes resume only at checkpoint boundaries
    load_s: float
    n_threads_batch: int = 0  # prefill threads as planned
    threads: str = ""  # the thread plan in words: settings, counts and why (threads.py)
    fingerprint: str = ""  # identifies the weights (sessions and checkpoints record it)
    n_vocab: int = 0
    ple_gather: str = ""  # where qwen4exp PLE rows are gathered: "gpu" (velo-chat kernel) or "stock"
    ple_reason: str = ""  # why that mode, in words (and the table's GPU access mode)
    ple_table: bool = False  # the model has a PLE table (qwen4exp): the panel then shows the path
    graph_splits: int = 0  # graph splits of a decode step (backend hand-overs); 0: not logged
    # speculation's state and guarantee in words: "off", "on: bit-identical to plain decoding",
    # "on: plain decoding up to the batch rounding (why)", or off and why (speculation_mode)
    speculation: str = ""
    # the same as it would read with speculation.enabled switched on (`Engine.speculation_if_enabled`:
    # what switching it on in the settings gets on this loaded model, before any reload)
    speculation_if_enabled: str = ""


@dataclass(frozen=True)
class ResumePreview:
    """What the next turn would reuse (`Engine.preview`), shown before sending."""

    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    source: str  # "live", "ram", "disk" or "none"
    est_prefill_s: float | None  # None until a prefill rate has been measured


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
    (`thinking.py`): the reasoning text goes to `reasoning`, the answer's to `text`. Either may
    be "" while a multi-byte character is incomplete or a reasoning marker may be starting."""

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
class TurnStats:
    """Numbers for one turn; `to_json` is the `stats` object of `velo-chat ask --json`."""

    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    prefill_s: float
    prefill_tok_s: float
    decode_tokens: int
    decode_s: float
    decode_tok_s: float
    graphs_reused: int
    llama_eval_ms: float  # llama.cpp's own time in llama_decode during the decode phase
    llama_prompt_eval_ms: float
    wall_ms: float  # wall time of the decode phase (compare with llama_eval_ms)
    total_s: float
    finish_reason: str  # "stop", "length", "context", "cancelled"
    checkpoint: dict[str, Any] = field(default_factory=dict)
    reasoning_tokens: int = 0  # of decode_tokens, those of the reasoning (markers included)
    first_answer_s: float | None = None  # from the start of the turn to the first answer text
    backend: str = "local"  # "local" (this process) or "remote" (an OpenAI-compatible server)
    server: dict[str, Any] = field(default_factory=dict)  # what a remote server reported
    spec_drafted: int = 0  # speculation: draft tokens verified
    spec_accepted: int = 0  # of those, accepted
    spec_rounds: int = 0  # verify batches
    spec_declined: int = 0  # plain steps at which a draft was there but did not pay
    spec_guarded: int = 0  # times drafting stopped because the verify batches lost time
    spec_batches: dict[int, int] = field(default_factory=dict)  # verify batch size -> batches
    # what a verify batch of each size cost in this turn, in one-token steps (its mean over the
    # batches timed: a context's first batch of a size is not), and the plain step after one:
    # set against `bench --spec`'s back-to-back table, the difference is the turn's own cost
    spec_batch_steps: dict[int, float] = field(default_factory=dict)
    spec_after_verify_steps: float = 0.0
    decode_calls: int = 0  # llama_decode calls after the first token (verify batches included)
    # what speculation guaranteed: "bit-identical" (to plain decoding), "batch rounding: why"
    # (the same model up to the backend's batch rounding: docs/speculation.md); "": not used
    spec_exactness: str = ""
    # the decode threads of the one-token steps, averaged: the governor lowers them while other
    # processes want the cores (engine/scheduling/threads.py), which explains a slower decode; 0: unknown
    decode_threads: float = 0.0

    @property
    def answer_tokens(self) -> int:
        return self.decode_tokens - self.reasoning_tokens

    @property
    def spec_acceptance(self) -> float:
        """Accepted over drafted tokens (0 when nothing was drafted)."""
        return self.spec_accepted / self.spec_drafted if self.spec_drafted else 0.0

    @property
    def tokens_per_call(self) -> float:
        """Reply tokens per llama_decode call of the decode phase (1.0 without speculation)."""
        return (self.decode_tokens - 1) / self.decode_calls if self.decode_calls else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "ttft_s": round(self.ttft_s, 4),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefill_tokens": self.prefill_tokens,
            "prefill_tok_s": round(self.prefill_tok_s, 2),
            "decode_tokens": self.decode_tokens,
            "decode_tok_s": round(self.decode_tok_s, 2),
            "graphs_reused": self.graphs_reused,
            "llama_eval_ms": round(self.llama_eval_ms, 3),
            "llama_prompt_eval_ms": round(self.llama_prompt_eval_ms, 3),
            "wall_ms": round(self.wall_ms, 3),
            "total_s": round(self.total_s, 4),
            "finish_reason": self.finish_reason,
            "checkpoint": dict(self.checkpoint),
            "reasoning_tokens": self.reasoning_tokens,
            "answer_tokens": self.answer_tokens,
            "first_answer_s": None if self.first_answer_s is None else round(self.first_answer_s, 4),
            "backend": self.backend,
            "decode_threads": round(self.decode_threads, 2),
            "speculation": {
                "drafted": self.spec_drafted,
                "accepted": self.spec_accepted,
                "acceptance": round(self.spec_acceptance, 4),
                "rounds": self.spec_rounds,
                "declined": self.spec_declined,
                "guarded": self.spec_guarded,
                "batches": {str(n): c for n, c in sorted(self.spec_batches.items())},
                "batch_steps": {str(n): round(v, 3) for n, v in sorted(self.spec_batch_steps.items())},
                "after_verify_steps": round(self.spec_after_verify_steps, 3),
                "decode_calls": self.decode_calls,
                "tokens_per_call": round(self.tokens_per_call, 3),
                "exactness": self.spec_exactness,
            },
            **({"server": dict(self.server)} if self.server else {}),
        }


@dataclass(frozen=True)
class TurnDone:
    text: str  # the answer
    stats: TurnStats
    reasoning: str = ""  # the reasoning, apart from the answer ("" if the model did not think)


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
