"""The shipped speculation stepper on real replies, timed with a measured cost table.

    python benchmarks/spec_replies_sim.py [--tokens 512] [--costs h200-smollm2 | BENCH.json]
        [--spec-file FILE] [--novel-file FILE ...] [--keep-costs] [--profile NAME]
        [--model PATH] [--replies FILE] [--json]

What would speculation do with these replies on a backend we cannot run now (the H200, a
Spark)? The model decodes `bench --spec`'s prompts plainly on this machine (greedy, end of
generation ignored: the text the other backend gives too, up to its batch rounding); then
`engine/speculation/stepper.py`'s `SpecStepper`, unchanged, runs over each reply
(`devkit/spec_sim.py`). A stand-in for the live sequence answers each step and each verify
batch with the recorded reply's tokens (a drafted token is accepted exactly when the plain
reply has it there, as in greedy decoding) and a virtual clock charges each call what the cost
table says a call of its size costs: in one-token steps, after a call of the same size (its
graph reused) or after another size (a new graph). The warm-up's sizes count as verified
(`--no-warm-up`: none). Prints, per workload, the speedup over plain one-token steps, what was
drafted and accepted, the batches, and the steps the verify batches gained or lost: what the
shipped rule decides with these texts on that backend. A simulation, not a measurement: the
table is the only thing measured on the other backend, and its time is charged as it was
measured there.

`--novel-file FILE`: also a row whose reply is that file's code (400 tokens from its first
`def`) after the novel prompt, the file not in the session: new code as a model might write it,
where only the code's own repeats can be drafted. `--keep-costs`: the rows run as turns of one
context that keeps its cost model from turn to turn (`speculation.keep_costs`, on), in the
order printed; without it each row is a fresh context's first turn. `--replies FILE`: the
recorded replies are read from FILE where it exists, else recorded and written there, so that
runs with other options simulate the same texts (a recording is not the same from run to run:
`default`'s threads follow the machine's load, and with them the rounding of the model's greedy
reply).

`--costs`: "h200-smollm2" (SmolLM2-135M Q4_1, every layer on an H200, per-shape CUDA graphs:
docs/results/speculation.md, 2026-12-02, "Per-shape CUDA graphs" and "Steps and the guard") or
the output of `velo-chat bench --spec --json` from any machine (its `cost` and
`cost_alternating`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from velo_chat.engine import ChatMessage, TokenDelta, make_engine
from velo_chat.engine.bench import copy_edit_source, workloads
from velo_chat.engine.config import SpeculationSettings, load_profile
from velo_chat.engine.diagnostics import Diagnostics, diagnostics

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: devkit/
from devkit.spec_sim import SimContext, load_costs, simulate  # noqa: E402


def record(
    engine: Diagnostics, messages: list[ChatMessage], tokens: int, *, ignore_eos: bool
) -> tuple[list[int], list[int]]:
    """The prompt's tokens and a plain greedy reply of at most `tokens` tokens, as `bench
    --spec` decodes it (a turn's reply ends at its end-of-generation token, which is never
    decoded; replay's runs past it)."""
    prompt = engine.tokens_for(messages, engine.template_variables())
    reply: list[int] = []
    for event in engine.turn(messages, max_tokens=tokens, ignore_eos=ignore_eos):
        if isinstance(event, TokenDelta):
            reply.append(event.token_id)
    engine.reset()
    return prompt, reply


Recorded = dict[str, tuple[list[int], list[int], list[int]]]


def record_all(args: argparse.Namespace, prompts: dict[str, list[ChatMessage]]) -> Recorded:
    """Each row's prompt, plain reply and extra draft source, in the order the rows print."""
    recorded: Recorded = {}
    loaded = make_engine(load_profile(args.profile), model_path=args.model)
    try:
        loaded.load()
        engine = diagnostics(loaded)
        for name, messages in prompts.items():
            print(f"recording {name} ...", file=sys.stderr)
            prompt, reply = record(engine, messages, args.tokens, ignore_eos=False)
            recorded[name] = (prompt, reply, [])
            if name == "novel":  # replay: the reply (past its end) again, itself in the source
                prompt, reply = record(engine, messages, args.tokens, ignore_eos=True)
                recorded["replay"] = (prompt, reply, reply)
        novel, variables = prompts["novel"], engine.template_variables()
        prompt = engine.tokens_for(novel, variables)
        for name in args.novel_file:
            text = Path(name).read_text()
            code = text[max(text.find("\ndef "), 0) :][:6000]  # ample for 400 tokens
            full = engine.tokens_for([*novel, ChatMessage("assistant", code)], variables)
            if full[: len(prompt)] != prompt:
                raise SystemExit(
                    "spec_replies_sim: the template puts a reply after other tokens than its prompt"
                )
            recorded[f"novel {Path(name).name}"] = (prompt, full[len(prompt) :][:400], [])
    finally:
        loaded.close()
    return recorded


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--costs", default="h200-smollm2")
    ap.add_argument("--spec-file", help="also a copy-edit of this file (bench --spec --spec-file)")
    ap.add_argument("--profile", default="default")
    ap.add_argument("--model", help="GGUF instead of the profile's")
    ap.add_argument("--max-draft", type=int, default=SpeculationSettings().max_draft)
    ap.add_argument("--no-warm-up", action="store_true")
    ap.add_argument("--novel-file", action="append", default=[], help="a row whose reply is this file's code")
    ap.add_argument("--keep-costs", action="store_true", help="the rows as turns of one context")
    ap.add_argument("--replies", help="JSON of the recorded replies: read if it exists, else written")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    costs = load_costs(args.costs)
    keep = "on" if args.keep_costs else "off"
    settings = SpeculationSettings(enabled=True, max_draft=args.max_draft, keep_costs=keep)
    context = SimContext()
    prompts = dict(workloads())
    if args.spec_file:
        path = Path(args.spec_file)
        source = copy_edit_source(path.name, path.read_text())
        prompts[f"copy-edit {path.name}"] = [source.message()]
    saved = Path(args.replies) if args.replies else None
    if saved is not None and saved.exists():
        recorded = {name: (p, r, src) for name, (p, r, src) in json.loads(saved.read_text()).items()}
    else:
        recorded = record_all(args, prompts)
        if saved is not None:
            saved.write_text(json.dumps(recorded))
    results = {
        name: simulate(
            prompt, reply, costs, settings, warm=not args.no_warm_up, source=source, context=context
        )
        for name, (prompt, reply, source) in recorded.items()
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    head = f"{'workload':>24} {'tokens':>6} {'x':>6} {'accept':>7} {'tok/call':>9}"
    print(f"{head}  batches; declined, guarded")
    for name, r in results.items():
        batches = ", ".join(f"{k} x{v}" for k, v in r["batches"].items()) or "none"
        print(
            f"{name:>24} {r['tokens']:>6} {r['speedup']:>6.2f} {r['acceptance']:>7.2f} "
            f"{r['tokens_per_call']:>9.2f}  {batches}; {r['declined']}, {r['guarded']}"
        )


if __name__ == "__main__":
    main()
