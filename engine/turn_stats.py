"""A turn's numbers (`TurnStats`, in `TurnDone`): a core every backend reports, and typed
parts only some backends have (None where a backend has no such thing). `to_json` is the `stats`
object of `velo-chat ask --json` and what the session store keeps with each reply; `from_json`
reads that back, older replies' JSON included."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class SavedCheckpoint:
    tokens: int
    bytes: int
    seconds: float = 0.0  # the engine's thread taking it: llama.cpp's copy, handed to the tiers


@dataclass(frozen=True)
class CheckpointStats:
    """What the checkpoints did in a turn of the in-process engine (`TurnStats.checkpoint`)."""

    restore_s: float = 0.0  # restoring the state the turn started from
    saved: tuple[SavedCheckpoint, ...] = ()  # in the order saved
    close_s: float = 0.0  # bringing the context to the follow-up boundary after the reply
    # a usable checkpoint restored or its tokens prefilled, by expected cost (docs/checkpoints.md):
    # "restore", "prefill", or "" when no checkpoint was weighed; the two estimates in seconds
    decision: str = ""
    restore_est_s: float | None = None
    prefill_est_s: float | None = None

    @classmethod
    def of(
        cls, restore_s: float, saved: tuple[SavedCheckpoint, ...], close_s: float, choice: Any
    ) -> CheckpointStats:
        """The stats with the live sequence's `RestoreChoice` (None: no checkpoint was weighed)."""
        if choice is None:
            return cls(restore_s, saved, close_s)
        return cls(restore_s, saved, close_s, choice.decision, choice.restore_est_s, choice.prefill_est_s)

    def to_json(self) -> dict[str, Any]:
        """`decision` and its estimates are there only when a checkpoint was weighed."""
        return {
            "restore_s": round(self.restore_s, 4),
            "saved": [_saved_json(s) for s in self.saved],
            "close_s": round(self.close_s, 4),
            **(
                {
                    "decision": self.decision,
                    "restore_est_s": _round_or_none(self.restore_est_s),
                    "prefill_est_s": _round_or_none(self.prefill_est_s),
                }
                if self.decision
                else {}
            ),
        }


def _saved_json(saved: SavedCheckpoint) -> dict[str, Any]:
    """Rows stored before a snapshot's seconds were kept have none, and write back without."""
    row: dict[str, Any] = {"tokens": saved.tokens, "bytes": saved.bytes}
    if saved.seconds:
        row["s"] = round(saved.seconds, 4)
    return row


def _round_or_none(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


@dataclass(frozen=True)
class SpeculationStats:
    """What speculation did in a turn of the in-process engine (`TurnStats.speculation`; all
    zero when it was off)."""

    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # of those, accepted
    rounds: int = 0  # verify batches
    declined: int = 0  # plain steps at which a draft was there but did not pay
    guarded: int = 0  # times drafting stopped because the verify batches lost time
    batches: Mapping[int, int] = field(default_factory=dict)  # verify batch size -> batches
    # what a verify batch of each size cost in this turn, in one-token steps (its mean over the
    # batches timed: a context's first batch of a size is not), and the plain step after one:
    # set against `bench --spec`'s back-to-back table, the difference is the turn's own cost
    batch_steps: Mapping[int, float] = field(default_factory=dict)
    after_verify_steps: float = 0.0
    decode_calls: int = 0  # llama_decode calls after the first token (verify batches included)
    # what speculation guaranteed: "bit-identical" (to plain decoding), "batch rounding: why"
    # (the same model up to the backend's batch rounding: docs/speculation.md); "": not used
    exactness: str = ""

    @property
    def acceptance(self) -> float:
        """Accepted over drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def tokens_per_call(self, decode_tokens: int) -> float:
        """Reply tokens per llama_decode call of the decode phase (1.0 without speculation)."""
        return (decode_tokens - 1) / self.decode_calls if self.decode_calls else 0.0

    def to_json(self, decode_tokens: int) -> dict[str, Any]:
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.acceptance, 4),
            "rounds": self.rounds,
            "declined": self.declined,
            "guarded": self.guarded,
            "batches": {str(n): c for n, c in sorted(self.batches.items())},
            "batch_steps": {str(n): round(v, 3) for n, v in sorted(self.batch_steps.items())},
            "after_verify_steps": round(self.after_verify_steps, 3),
            "decode_calls": self.decode_calls,
            "tokens_per_call": round(self.tokens_per_call(decode_tokens), 3),
            "exactness": self.exactness,
        }


@dataclass(frozen=True)
class LlamaTimings:
    """llama.cpp's own account of a turn of the in-process engine (`TurnStats.llama`)."""

    graphs_reused: int
    eval_ms: float  # llama.cpp's own time in llama_decode during the decode phase
    prompt_eval_ms: float  # ... during the prefill
    wall_ms: float  # wall time of the decode phase (compare with eval_ms)
    # the decode threads of the one-token steps, averaged: the governor lowers them while other
    # processes want the cores (engine/scheduling/threads.py), which explains a slower decode; 0: unknown
    decode_threads: float = 0.0


@dataclass(frozen=True)
class ServerStats:
    """What a remote server reported about a turn (`TurnStats.server`): its `timings` (llama.cpp's
    server sends them; None: not reported) and its `usage` object as sent, with the rate the
    client saw the reply arrive at."""

    client_tok_s: float
    prompt_n: int | None = None
    cache_n: int | None = None
    prompt_ms: float | None = None
    prompt_per_second: float | None = None
    predicted_ms: float | None = None
    predicted_per_second: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    usage: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"client_tok_s": round(self.client_tok_s, 2)}
        for f in fields(self)[1:]:
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = dict(value) if f.name == "usage" else value
        return out


@dataclass(frozen=True)
class TurnStats:
    """Numbers for one turn: the core every backend reports, and the parts only some have (None
    where a backend has no such thing). `to_json` is the `stats` object of `velo-chat ask
    --json` and what the store keeps with each reply; `from_json` reads it back."""

    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    prefill_s: float
    prefill_tok_s: float
    decode_tokens: int
    decode_s: float
    decode_tok_s: float
    total_s: float
    finish_reason: str  # "stop", "length", "context", "cancelled", "interrupted" (remote)
    # where the reused prefix came from: "live", "ram", "disk", "none", "server" (a remote
    # server's prompt cache; "none" when it reported nothing cached)
    source: str = "none"
    reasoning_tokens: int = 0  # of decode_tokens, those of the reasoning (markers included)
    first_answer_s: float | None = None  # from the start of the turn to the first answer text
    reasoning_budget_hit: bool = False  # the thinking budget closed the reasoning (docs/thinking.md)
    backend: str = "local"  # "local" (this process) or "remote" (an OpenAI-compatible server)
    checkpoint: CheckpointStats | None = None
    speculation: SpeculationStats | None = None
    llama: LlamaTimings | None = None
    server: ServerStats | None = None

    @property
    def answer_tokens(self) -> int:
        return self.decode_tokens - self.reasoning_tokens

    @property
    def tokens_per_call(self) -> float:
        """Reply tokens per llama_decode call of the decode phase (1.0 without speculation; 0
        where unknown)."""
        return self.speculation.tokens_per_call(self.decode_tokens) if self.speculation else 0.0

    def to_json(self) -> dict[str, Any]:
        """The keys are the same for every backend; those of a part the turn lacks are null
        (a remote turn: the llama.cpp timings and speculation). `reasoning_budget_hit` is
        there only when the thinking budget cut the reasoning, so rows stay as they were."""
        llama = self.llama
        return {
            "ttft_s": round(self.ttft_s, 4),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefill_tokens": self.prefill_tokens,
            "prefill_tok_s": round(self.prefill_tok_s, 2),
            "decode_tokens": self.decode_tokens,
            "decode_tok_s": round(self.decode_tok_s, 2),
            "graphs_reused": llama.graphs_reused if llama else None,
            "llama_eval_ms": round(llama.eval_ms, 3) if llama else None,
            "llama_prompt_eval_ms": round(llama.prompt_eval_ms, 3) if llama else None,
            "wall_ms": round(llama.wall_ms, 3) if llama else None,
            "total_s": round(self.total_s, 4),
            "finish_reason": self.finish_reason,
            "checkpoint": {"source": self.source, **(self.checkpoint.to_json() if self.checkpoint else {})},
            "reasoning_tokens": self.reasoning_tokens,
            "answer_tokens": self.answer_tokens,
            "first_answer_s": None if self.first_answer_s is None else round(self.first_answer_s, 4),
            "backend": self.backend,
            "decode_threads": round(llama.decode_threads, 2) if llama else None,
            "speculation": self.speculation.to_json(self.decode_tokens) if self.speculation else None,
            **({"server": self.server.to_json()} if self.server else {}),
            **({"reasoning_budget_hit": True} if self.reasoning_budget_hit else {}),  # only when it cut
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TurnStats:
        """The stats `to_json` wrote (a stored reply's, of this version or an older one: keys
        added since are read as absent). Raises ValueError for what holds no turn's stats (a
        user message's `{}`, a failed turn's `{"error": ...}`)."""
        return _stats_from_json(data)


def _stats_from_json(d: Mapping[str, Any]) -> TurnStats:
    """`TurnStats.from_json`. prefill_s and decode_s are not stored: they come back from the
    token counts and the (rounded) rates. A remote reply stored before the parts existed kept
    the server's own times in llama_eval_ms and llama_prompt_eval_ms: they are read into its
    server part."""
    if not isinstance(d, Mapping) or "decode_tokens" not in d or "finish_reason" not in d:
        raise ValueError("the JSON holds no turn stats")
    backend = str(d.get("backend") or "local")
    local = backend == "local"
    raw_ck = d.get("checkpoint")
    ck: Mapping[str, Any] = raw_ck if isinstance(raw_ck, Mapping) else {}
    prefill_tokens, decode_tokens = int(d.get("prefill_tokens") or 0), int(d["decode_tokens"])
    prefill_tok_s, decode_tok_s = float(d.get("prefill_tok_s") or 0.0), float(d.get("decode_tok_s") or 0.0)
    first_answer = d.get("first_answer_s")
    return TurnStats(
        ttft_s=float(d.get("ttft_s") or 0.0),
        prompt_tokens=int(d.get("prompt_tokens") or 0),
        cached_tokens=int(d.get("cached_tokens") or 0),
        prefill_tokens=prefill_tokens,
        prefill_s=prefill_tokens / prefill_tok_s if prefill_tok_s > 0 else 0.0,
        prefill_tok_s=prefill_tok_s,
        decode_tokens=decode_tokens,
        decode_s=(decode_tokens - 1) / decode_tok_s if decode_tokens > 1 and decode_tok_s > 0 else 0.0,
        decode_tok_s=decode_tok_s,
        total_s=float(d.get("total_s") or 0.0),
        finish_reason=str(d["finish_reason"]),
        source=str(ck.get("source") or "none"),
        reasoning_tokens=int(d.get("reasoning_tokens") or 0),
        first_answer_s=None if first_answer is None else float(first_answer),
        reasoning_budget_hit=bool(d.get("reasoning_budget_hit") or False),
        backend=backend,
        checkpoint=_checkpoint_from_json(ck) if local and ("saved" in ck or "restore_s" in ck) else None,
        speculation=_speculation_from_json(d["speculation"])
        if local and isinstance(d.get("speculation"), Mapping)
        else None,
        llama=_llama_from_json(d) if local and d.get("llama_eval_ms") is not None else None,
        server=_server_from_json(d) if isinstance(d.get("server"), Mapping) else None,
    )


def _checkpoint_from_json(ck: Mapping[str, Any]) -> CheckpointStats:
    saved = tuple(
        SavedCheckpoint(int(s["tokens"]), int(s["bytes"]), float(s.get("s") or 0.0))
        for s in ck.get("saved") or ()
    )
    restore_est, prefill_est = ck.get("restore_est_s"), ck.get("prefill_est_s")
    return CheckpointStats(
        float(ck.get("restore_s") or 0.0),
        saved,
        float(ck.get("close_s") or 0.0),
        decision=str(ck.get("decision") or ""),
        restore_est_s=None if restore_est is None else float(restore_est),
        prefill_est_s=None if prefill_est is None else float(prefill_est),
    )


def _speculation_from_json(s: Mapping[str, Any]) -> SpeculationStats:
    return SpeculationStats(
        drafted=int(s.get("drafted") or 0),
        accepted=int(s.get("accepted") or 0),
        rounds=int(s.get("rounds") or 0),
        declined=int(s.get("declined") or 0),
        guarded=int(s.get("guarded") or 0),
        batches={int(n): int(c) for n, c in (s.get("batches") or {}).items()},
        batch_steps={int(n): float(v) for n, v in (s.get("batch_steps") or {}).items()},
        after_verify_steps=float(s.get("after_verify_steps") or 0.0),
        decode_calls=int(s.get("decode_calls") or 0),
        exactness=str(s.get("exactness") or ""),
    )


def _llama_from_json(d: Mapping[str, Any]) -> LlamaTimings:
    return LlamaTimings(
        graphs_reused=int(d.get("graphs_reused") or 0),
        eval_ms=float(d.get("llama_eval_ms") or 0.0),
        prompt_eval_ms=float(d.get("llama_prompt_eval_ms") or 0.0),
        wall_ms=float(d.get("wall_ms") or 0.0),
        decode_threads=float(d.get("decode_threads") or 0.0),
    )


def _server_from_json(d: Mapping[str, Any]) -> ServerStats:
    s: Mapping[str, Any] = d["server"]

    def count(key: str) -> int | None:
        return None if s.get(key) is None else int(s[key])

    def number(key: str, older: str) -> float | None:
        if s.get(key) is not None:
            return float(s[key])
        return float(d[older]) if d.get(older) else None  # an older row: the server's time was there

    usage = s.get("usage")
    return ServerStats(
        client_tok_s=float(s.get("client_tok_s") or 0.0),
        prompt_n=count("prompt_n"),
        cache_n=count("cache_n"),
        prompt_ms=number("prompt_ms", "llama_prompt_eval_ms"),
        prompt_per_second=None if s.get("prompt_per_second") is None else float(s["prompt_per_second"]),
        predicted_ms=number("predicted_ms", "llama_eval_ms"),
        predicted_per_second=None
        if s.get("predicted_per_second") is None
        else float(s["predicted_per_second"]),
        draft_n=count("draft_n"),
        draft_n_accepted=count("draft_n_accepted"),
        usage=dict(usage) if isinstance(usage, Mapping) else None,
    )
