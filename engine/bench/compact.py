"""The compaction section of `velo-chat bench` (`--compact`): what a full context costs.

A conversation is filled to `context.compact_at` of the context (one long first message and a
reply), then the compaction that `context.when_full = "compact"` makes is timed the way the app
makes it (docs/compaction.md):

- the summary turn: the profile's `summary_prompt` appended to the conversation as a user
  message. Its prompt is the history plus that request, so the history comes from the live
  context (the state the reply left) and only the request is prefilled. Its TTFT is set against
  a cold prefill of the same prompt (no checkpoints, an empty context): the ratio is what a
  compaction saves (docs/results/compaction.md has what was measured and the target);
- the continuation's prefill (`EngineAPI.warm`: the request, the summary and the last turn if it
  fits `keep_share`), checkpointed at its follow-up boundary;
- the first follow-up in the continuation: warm, from what `warm` left.

The app's compaction lives in `app/compaction.py`; the engine cannot import it, so the few
lines that build the same conversations are repeated here (the summary request, the kept turn).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from .. import ChatMessage, EngineAPI, PromptTooLong
from ..diagnostics import diagnostics, follow_up_prefix
from .result import conversation_of

FOLLOW_UP = "Go on from your summary: what is the next step?"
REPLY_TOKENS = 64
SUMMARY_TOKENS = 128


def summary_request(engine: EngineAPI) -> ChatMessage:
    """The summary request the app sends (`app/compaction.summary_request`, without a focus)."""
    return ChatMessage("user", engine.profile.context.summary_prompt.strip())


def run_compact_bench(
    engine: EngineAPI, *, reply_tokens: int = REPLY_TOKENS, summary_tokens: int = SUMMARY_TOKENS
) -> dict[str, Any]:
    """Fill a conversation to `compact_at`, then time the summary turn warm and cold, the
    continuation's prefill and its first follow-up (module docstring). The engine stays loaded;
    its live context is empty afterwards."""
    diag = diagnostics(engine)
    assert engine.info is not None, "load the engine first"
    n_ctx = engine.info.n_ctx
    settings = engine.profile.context
    request = summary_request(engine)
    room = n_ctx - reply_tokens - summary_tokens - len(diag.tokens_for([request])) - 16
    target = min(int(settings.compact_at * n_ctx) - reply_tokens, room)
    if target < 64:
        raise PromptTooLong(
            f"bench --compact: a context of {n_ctx:,} tokens leaves no room to fill; use a larger n_ctx"
        )
    first = conversation_of(engine, target)
    with tempfile.TemporaryDirectory(prefix="velo-bench-compact-") as tmp:
        diag.reset()
        with diag.checkpoints_at(Path(tmp)):
            filled = diag.complete(first, max_tokens=reply_tokens, ignore_eos=True)
            history = [*first, ChatMessage("assistant", filled.text, filled.reasoning)]
            history_tokens = len(
                follow_up_prefix(diag.tokens_for, first, filled.text, reasoning=filled.reasoning)
            )
            summary = diag.complete([*history, request], max_tokens=summary_tokens, ignore_eos=True)
            continuation = _continuation(engine, history, request, summary.text)
            t0 = time.perf_counter()
            warmed = engine.warm(continuation) or 0
            warm_s = time.perf_counter() - t0
            follow = diag.complete([*continuation, ChatMessage("user", FOLLOW_UP)], max_tokens=1).stats
        diag.reset()
        with diag.checkpoints_at(None):
            cold = diag.complete([*history, request], max_tokens=1).stats
        diag.reset()
    warm = summary.stats
    return {
        "n_ctx": n_ctx,
        "compact_at": settings.compact_at,
        "history_tokens": history_tokens,
        "fill": round(history_tokens / n_ctx, 4),
        "summary_prompt_tokens": warm.prompt_tokens,
        "summary_cached_tokens": warm.cached_tokens,
        "summary_reused": round(min(warm.cached_tokens, history_tokens) / max(history_tokens, 1), 4),
        "summary_tokens": warm.decode_tokens,
        "summary_ttft_s": round(warm.ttft_s, 4),
        "cold_ttft_s": round(cold.ttft_s, 4),
        "cold_over_summary": round(cold.ttft_s / warm.ttft_s, 2) if warm.ttft_s else None,
        "continuation_messages": len(continuation),
        "continuation_prefill_tokens": warmed,
        "continuation_warm_s": round(warm_s, 4),
        "follow_up_prompt_tokens": follow.prompt_tokens,
        "follow_up_cached_tokens": follow.cached_tokens,
        "follow_up_source": follow.source,
        "follow_up_ttft_s": round(follow.ttft_s, 4),
    }


def _continuation(
    engine: EngineAPI, history: list[ChatMessage], request: ChatMessage, summary: str
) -> list[ChatMessage]:
    """The continuation the app would make: the system prompt, the request, the summary, and the
    last turn of `history` when it fits `keep_share` of the context."""
    system = [m for m in history if m.role == "system"]
    opening = [*system, request, ChatMessage("assistant", summary)]
    last_turn = [m for m in history if m.role != "system"][-2:]
    assert engine.info is not None
    share = engine.profile.context.keep_share * engine.info.n_ctx
    size = sum(engine.count_tokens(m.content) or 0 for m in last_turn)
    return [*opening, *last_turn] if size <= share else opening


def format_lines(r: dict[str, Any]) -> list[str]:
    ratio = "n/a" if r["cold_over_summary"] is None else f"{r['cold_over_summary']:.1f}x"
    return [
        "",
        f"compact   a conversation of {r['history_tokens']:,} tokens ({r['fill']:.0%} of {r['n_ctx']:,}; "
        f"compact_at {r['compact_at']:.2f}), then its summary turn:",
        f"          TTFT warm {r['summary_ttft_s']:.3f} s (reused {r['summary_cached_tokens']:,} of "
        f"{r['summary_prompt_tokens']:,} prompt tokens, {r['summary_reused']:.1%} of the history)   "
        f"cold {r['cold_ttft_s']:.3f} s   cold/warm {ratio}",
        f"          continuation: {r['continuation_prefill_tokens']:,} tokens prefilled and checkpointed "
        f"in {r['continuation_warm_s']:.3f} s; first follow-up TTFT {r['follow_up_ttft_s']:.3f} s "
        f"(reused {r['follow_up_cached_tokens']:,} of {r['follow_up_prompt_tokens']:,}, "
        f"source {r['follow_up_source']})",
    ]
