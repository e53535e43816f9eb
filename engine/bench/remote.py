"""`velo-chat bench` against a remote server: the same sections (prefill, TTFT, decode), measured
through the engine's public surface, so a local and a remote profile can be compared.

There is no local tokenizer for a remote model: a prefill size is reached with text of about
four characters per token, and the row reports the server's own prompt count when it sends one
(llama-server's `timings`, vLLM's usage chunk). Each prefill run opens with a different line, so
the server's prompt cache cannot shorten it. Decode asks for a fixed number of tokens with
`ignore_eos` (llama-server and vLLM honour it; a server that stops early shows fewer tokens).
Rates are the server's when it reports them, else measured from the chunks' arrival.
"""

from __future__ import annotations

import platform
import statistics
from collections.abc import Callable, Sequence

from .. import ChatMessage, EngineAPI, TurnDone, TurnFailed, TurnStats
from ..diagnostics import turn_past_eos
from .result import FILLER, BenchResult

CHARS_PER_TOKEN = 4


def _turn(engine: EngineAPI, messages: Sequence[ChatMessage], max_tokens: int, ignore_eos: bool) -> TurnStats:
    if ignore_eos:
        turn = turn_past_eos(engine, messages, max_tokens=max_tokens)
    else:
        turn = engine.turn(messages, max_tokens=max_tokens)
    try:
        for event in turn:
            if isinstance(event, TurnDone):
                return event.stats
            if isinstance(event, TurnFailed):
                raise RuntimeError(event.reason)
    finally:
        turn.close()
    raise RuntimeError("the turn ended without TurnDone")


def _filler(tokens: int, run: int) -> list[ChatMessage]:
    reps = max(1, tokens * CHARS_PER_TOKEN // len(FILLER))
    return [ChatMessage("user", f"Run {run}. " + FILLER * reps + "\nSummarise this in one word.")]


def run_remote_bench(
    engine: EngineAPI,
    *,
    profile_name: str,
    prefill_sizes: Sequence[int],
    decode_tokens: int = 256,
    repeats: int = 3,
    on_progress: Callable[[str], None] | None = None,
) -> BenchResult:
    note = on_progress or (lambda _s: None)
    info = engine.info
    assert info is not None, "load the engine first"
    result = BenchResult(
        model=info.path,
        architecture="remote",
        profile=profile_name,
        n_ctx=info.n_ctx,
        n_threads=0,
        hybrid=False,
        machine=f"client {platform.machine()} {platform.system()}",
        threads={"plan": f"remote: {info.path.rsplit(' · ', 1)[0]}"},
    )
    for size in sorted(set(prefill_sizes)):
        rows = []
        for i in range(repeats):
            note(f"prefill ~{size} tokens (run {i + 1}/{repeats})")
            rows.append(_turn(engine, _filler(size, i), 1, False))
        tokens = int(statistics.median(r.prompt_tokens for r in rows)) or size
        # the server's prefill rate, or (not reported) the prompt over the time to first token
        rates = [r.prefill_tok_s or (tokens / r.ttft_s if r.ttft_s > 0 else 0.0) for r in rows]
        result.prefill.append(
            {
                "tokens": tokens,
                "tok_s": round(statistics.median(rates), 1),
                "ttft_s": round(statistics.median(r.ttft_s for r in rows), 4),
                "server_reported": any(r.prompt_tokens for r in rows),
            }
        )
    runs = []
    for i in range(repeats):
        note(f"decode {decode_tokens} tokens (run {i + 1}/{repeats})")
        runs.append(
            _turn(
                engine, [ChatMessage("user", "Write a long story about a lighthouse.")], decode_tokens, True
            )
        )
    result.decode = {
        "tokens": int(statistics.median(r.decode_tokens for r in runs)),
        "tok_s": round(statistics.median(r.decode_tok_s for r in runs), 2),
        "tok_s_runs": [round(r.decode_tok_s, 2) for r in runs],
        "client_tok_s": round(statistics.median(r.server.client_tok_s if r.server else 0.0 for r in runs), 2),
        "ttft_s": round(statistics.median(r.ttft_s for r in runs), 4),
        "wall_ms": round(statistics.median(r.decode_s * 1000.0 for r in runs), 2),
        # the server's own decode time, where it reports one (llama.cpp's server does)
        "llama_eval_ms": round(
            statistics.median((r.server and r.server.predicted_ms) or 0.0 for r in runs), 2
        ),
        "overhead": None,
        "overhead_runs": [],
        "graphs_reused": 0,
        "repeats": repeats,
    }
    return result


def format_remote_lines(result: BenchResult) -> list[str]:
    d = result.decode
    return [
        f"client    decode rate from the chunks' arrival: {d['client_tok_s']:.1f} tok/s "
        f"(the row above is the server's own figure when it reports one)",
    ]
