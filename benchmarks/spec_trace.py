"""Where a speculative turn's time goes, step by step.

    python benchmarks/spec_trace.py --model M.gguf --profile NAME [--workload copy-edit|novel]
        [--tokens 512] [--repeats 2] [--show-text] [--before copy-edit]

Runs `bench --spec`'s workload with the profile's speculation (it must be enabled), timing every
`SpecStepper.step` (a plain step or a verify batch, with the stepper's own Python), and the same
turn with drafting switched off inside the stepper (every step plain, the same code path) and
with speculation disabled (the engine's plain loop), alternately, `--repeats` times. Prints one
JSON object: per kind of step (plain with no draft, plain with a draft declined, verify, the
plain step right after a verify) the count and time in one-token steps; the turn's decode rate
each way; and with `--show-text` the reply with the tokens of plain steps in brackets (where a
copy stops being drafted). A diagnosis tool: `bench --spec` says how much, this says where.
`--before W` first runs workload W once with speculation on, untraced, so the traced turns meet
the verify graphs another part of the context left (stale on a GPU, as in a session whose
earlier turns drafted at other lengths of context); with `--repeats 1` the trace is then a
context's first speculative turn of the workload, the one `bench --spec` finds slowest.

On a CUDA build each kind also counts what ggml-cuda's debug log says it did with the step's
CUDA graph (`cuda_graph`): `reused` (llama.cpp reused its graph, so the captured CUDA graph was
launched at once), `changed` (a graph built anew whose nodes differ from the captured one's:
run eagerly, without a CUDA graph, and captured again at the next step of that shape),
`captured` (the step after a change: captured and updated), none of these (a graph built anew
that matched the captured one: launched after checking every node). `stale` counts the steps
`LiveSequence.graph_stale` marked before they ran (their KV window moved since the last call
of their size), with their time and how many of them ggml-cuda ran eagerly
(`stale_and_changed`): where the two agree, the cost model's `stale` is what those cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from typing import Any

from velo_chat.engine import TokenDelta, TurnDone, make_engine
from velo_chat.engine.bench import with_speculation, workloads
from velo_chat.engine.config import load_profile
from velo_chat.engine.diagnostics import Diagnostics, SpecStepper, diagnostics, llama_log_lines


class _Traced(SpecStepper):
    rows: list[dict[str, Any]] = []
    drafting = True

    def step(self, token: int, room: int) -> list[int]:
        prev = self.cost.last
        draft, _ = self.index.draft(max(min(self.k_max, room - 1), 1))
        if not self.drafting:
            self._skip = 1 << 30
        stale = [False, *(self.live.graph_stale(n) for n in range(1, self.k_max + 2))]
        with llama_log_lines() as logged:
            t0 = time.perf_counter()
            out = super().step(token, room)
            seconds = time.perf_counter() - t0
        size = self.cost.last
        kind = "verify" if size > 1 else ("after-verify" if prev > 1 else ("declined" if draft else "plain"))
        graph = {name: sum(words in line for line in logged) for name, words in _GRAPH_LINES.items()}
        self.rows.append(
            {
                "kind": kind,
                "size": size,
                "tokens": len(out),
                "s": seconds,
                "ids": out,
                "graph": graph,
                "stale": stale[size],
            }
        )
        return out


_GRAPH_LINES = {"reused": "CUDA Graph id", "changed": "warmup reset", "captured": "warmup complete"}
"""ggml-cuda's debug lines (ggml-cuda.cu, `ggml_backend_cuda_graph_compute`) for what it did
with a step's CUDA graph."""


def _turn(
    diag: Diagnostics, name: str, tokens: int, enabled: bool, drafting: bool
) -> tuple[TurnDone, list[dict[str, Any]], list[str]]:
    """The turn's end, the stepper's rows, and each reply token's text, in order."""
    with_speculation(diag.engine, enabled)
    _Traced.rows, _Traced.drafting = [], drafting
    diag.reset()
    deltas: list[TokenDelta] = []
    done = diag.complete(workloads()[name], max_tokens=tokens, deltas=deltas)
    return done, list(_Traced.rows), [d.reasoning + d.text for d in deltas]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--workload", default="novel", choices=sorted(workloads()))
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--show-text", action="store_true")
    ap.add_argument("--before", choices=sorted(workloads()), help="a workload to run once first, untraced")
    args = ap.parse_args()
    rates: dict[str, list[float]] = {"off": [], "plain-stepper": [], "on": []}
    out: dict[str, Any] = {"workload": args.workload}
    engine = make_engine(load_profile(args.profile), model_path=args.model)
    diag = diagnostics(engine)
    with contextlib.closing(engine), diag.stepper(_Traced):
        engine.load()
        if args.before:
            _turn(diag, args.before, max(args.tokens, 2048), True, True)
        for _ in range(args.repeats):
            done_off, _, _ = _turn(diag, args.workload, args.tokens, False, False)
            rates["off"].append(done_off.stats.decode_tok_s)
            done_ps, rows_ps, _ = _turn(diag, args.workload, args.tokens, True, False)
            rates["plain-stepper"].append(done_ps.stats.decode_tok_s)
            done_on, rows, texts = _turn(diag, args.workload, args.tokens, True, True)
            rates["on"].append(done_on.stats.decode_tok_s)
        mode = diag.speculation_if_enabled
    if not any(r["kind"] == "plain" for r in rows_ps):
        raise SystemExit(f"spec_trace: the stepper never ran with this model and profile: {mode}")
    step = statistics.median(r["s"] for r in rows_ps if r["kind"] == "plain")
    out["one_step_ms"] = round(step * 1000, 4)
    out["rates"] = {k: [round(v, 1) for v in vs] for k, vs in rates.items()}
    out["identical"] = done_on.text == done_off.text
    out["tokens"] = {"off": done_off.stats.decode_tokens, "on": done_on.stats.decode_tokens}
    kinds: dict[str, dict[str, float]] = {}
    for r in rows:
        k = kinds.setdefault(r["kind"], {"steps": 0, "tokens": 0, "time_in_steps": 0.0})
        k["steps"] += 1
        k["tokens"] += r["tokens"]
        k["time_in_steps"] += r["s"] / step
        for name, n in r["graph"].items():
            k[f"cuda_graph_{name}"] = k.get(f"cuda_graph_{name}", 0) + n
        if r["graph"]["changed"]:  # what the steps run without a CUDA graph cost
            k["changed_time_in_steps"] = k.get("changed_time_in_steps", 0.0) + r["s"] / step
        if r["stale"]:  # LiveSequence.graph_stale said so before the step
            k["stale"] = k.get("stale", 0) + 1
            k["stale_time_in_steps"] = k.get("stale_time_in_steps", 0.0) + r["s"] / step
            k["stale_and_changed"] = k.get("stale_and_changed", 0) + int(r["graph"]["changed"] > 0)
    out["on"] = {
        k: {n: round(x, 1) if isinstance(x, float) else x for n, x in v.items()} for k, v in kinds.items()
    }
    out["on_total_in_steps"] = round(sum(r["s"] for r in rows) / step, 1)
    out["plain_stepper_total_in_steps"] = round(sum(r["s"] for r in rows_ps) / step, 1)
    out["sizes"] = [r["size"] for r in rows]
    if args.show_text:  # the first token comes from the prefill; each row's from its step
        parts, at = [texts[0] if texts else ""], 1
        for r in rows:
            text = "".join(texts[at : at + r["tokens"]])
            at += r["tokens"]
            parts.append(text if r["kind"] == "verify" else f"[{text}]")
        out["text"] = "".join(parts)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
