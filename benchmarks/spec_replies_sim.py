"""The shipped speculation stepper on real replies, timed with a measured cost table.

    python benchmarks/spec_replies_sim.py [--tokens 512] [--costs h200-smollm2 | BENCH.json]
        [--spec-file FILE] [--novel-file FILE ...] [--keep-costs] [--profile NAME]
        [--model PATH] [--pooled-acceptance] [--replies FILE] [--json]

What would speculation do with these replies on a backend we cannot run now (the H200, a
Spark)? The model decodes `bench --spec`'s prompts plainly on this machine (greedy, end of
generation ignored: the text the other backend gives too, up to its batch rounding); then
`engine/speculation/stepper.py`'s `SpecStepper`, unchanged, runs over each reply. A stand-in for the
live sequence answers each step and each verify batch with the recorded reply's tokens (a
drafted token is accepted exactly when the plain reply has it there, as in greedy decoding)
and a virtual clock charges each call what the cost table says a call of its size costs: in
one-token steps, after a call of the same size (its graph reused) or after another size (a new
graph). The warm-up's sizes count as verified (`--no-warm-up`: none). Prints, per workload, the
speedup over plain one-token steps, what was drafted and accepted, the batches, and the steps
the verify batches gained or lost: what the shipped rule decides with these texts on that
backend. A simulation, not a measurement: the table is the only thing measured on the other
backend, and its time is charged as it was measured there.

`--novel-file FILE`: also a row whose reply is that file's code (400 tokens from its first
`def`) after the novel prompt, the file not in the session: new code as a model might write it,
where only the code's own repeats can be drafted. `--keep-costs`: the rows run as turns of one
context that keeps its cost model from turn to turn (`speculation.keep_costs`, on), in the
order printed; without it each row is a fresh context's first turn. `--pooled-acceptance`:
the stepper with one acceptance rate for a draft's first token and the tokens after it
(`cli_pooled_acceptance.py`), for a side-by-side run. `--replies FILE`: the recorded replies
are read from FILE where it exists, else recorded and written there, so that runs with other
options simulate the same texts (a recording is not the same from run to run: `default`'s
threads follow the machine's load, and with them the rounding of the model's greedy reply).

`--costs`: "h200-smollm2" (SmolLM2-135M Q4_1, every layer on an H200, per-shape CUDA graphs:
docs/speculation.md, "Per-shape CUDA graphs" and "Steps and the guard") or the output of
`velo-chat bench --spec --json` from any machine (its `cost` and `cost_alternating`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from velo_chat.engine.bench.spec import workloads
from velo_chat.engine.bench.spec_source import copy_edit_source
from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.config.profile_schema import SpeculationSettings
from velo_chat.engine.config.profiles import load_profile
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import TokenDelta
from velo_chat.engine.speculation.cost import CostModel
from velo_chat.engine.speculation import stepper as speculation
from velo_chat.engine.speculation.stepper import SpecStepper

Table = dict[int, float]

H200_SMOLLM2: tuple[Table, Table] = (
    # after a call of the same size (graph reused); 8 from the step search's runs (1.41-1.46)
    {1: 1.0, 2: 1.127, 3: 1.173, 5: 1.275, 8: 1.43, 9: 2.798, 17: 3.139},
    # after a call of another size (a new graph); 8 assumed 5's extra over back to back
    {1: 1.685, 2: 1.79, 3: 1.833, 5: 1.934, 8: 2.09, 9: 3.461, 17: 3.794},
)


def _steps(table: Table, n: int) -> float:
    """A call of `n` tokens in one-token steps, interpolated between the table's sizes."""
    sizes = sorted(table)
    if n <= sizes[0]:
        return table[sizes[0]]
    for lo, hi in zip(sizes, sizes[1:], strict=False):
        if lo <= n <= hi:
            return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)
    return table[sizes[-1]] + (table[sizes[-1]] - table[sizes[-2]]) / (sizes[-1] - sizes[-2]) * (
        n - sizes[-1]
    )


def load_costs(name: str) -> tuple[Table, Table]:
    if name == "h200-smollm2":
        return H200_SMOLLM2
    data = json.loads(Path(name).read_text())
    spec = data.get("sections", {}).get("speculation", data)
    return (
        {int(k): float(v) for k, v in spec["cost"].items()},
        {int(k): float(v) for k, v in spec["cost_alternating"].items()},
    )


class RecordedLive:
    """The live sequence as `SpecStepper` uses it, answering from a recorded greedy reply:
    the token after position p of the reply is `reply[p + 1]`, whatever was drafted before it
    (the stepper stops reading a verify batch at its first wrong draft). Each decode call
    advances `now` by the table's cost of its size (in one-token steps)."""

    def __init__(
        self, prompt: int, reply: Sequence[int], costs: tuple[Table, Table], max_draft: int, warm: bool
    ) -> None:
        self.prompt, self.reply, self.costs = prompt, list(reply), costs
        self.n = prompt
        self.n_ctx = prompt + len(reply) + max_draft + 8
        self.max_draft = max_draft
        self.verified_sizes: set[int] = set(range(1, max_draft + 2)) if warm else set()
        self.spec_costs: CostModel | None = None  # what the context's earlier turns timed (`simulate`)
        self.gpu_resident = True  # the tables are a GPU's: a context keeps its costs where asked to
        # (the tables price a batch by size and switch only: no call's graph is stale here)
        self.now = 0.0
        self._last = 1
        self._base = 0

    def __len__(self) -> int:
        return self.n

    def _charge(self, size: int) -> None:
        same, other = self.costs
        self.now += _steps(same if size == self._last else other, size)
        self._last = size

    def graph_stale(self, n: int) -> bool:
        return False

    def append(self, token: int) -> None:
        self._charge(1)
        self.n += 1

    def sample(self, sampler: object, i: int = -1) -> int:
        return self.reply[self.n - self.prompt]

    def verify(self, tokens: Sequence[int]) -> None:
        self._charge(len(tokens))
        self._base = self.n - self.prompt
        self.n += len(tokens)
        self.verified_sizes.add(len(tokens))

    def pick(self, sampler: object, i: int) -> int:
        return self.reply[self._base + 1 + i]

    def rollback(self, n: int) -> None:
        self.n -= n


class SimContext:
    """What a context keeps from one simulated turn to the next: its cost model."""

    def __init__(self) -> None:
        self.spec_costs: CostModel | None = None


def simulate(
    prompt: Sequence[int],
    reply: Sequence[int],
    costs: tuple[Table, Table],
    settings: SpeculationSettings,
    *,
    warm: bool,
    source: Sequence[int] = (),
    context: SimContext | None = None,
) -> dict:
    """The stepper over `reply` (its first token sampled after the prompt): the virtual time
    of the reply's tokens after the first, against as many one-token steps back to back.
    `source`: the draft source beyond the prompt (the replay row: the plain reply, as
    `Engine.spec_replay` gives it). `context`: the turn is one of that context's, which
    keeps its cost model across them where `settings.keep_costs` says so (None: a fresh
    context)."""
    tokens = len(reply) - 1  # the last token is never decoded
    live = RecordedLive(len(prompt), reply, costs, settings.max_draft, warm)
    if context is not None:
        live.spec_costs = context.spec_costs
    stepper = SpecStepper(live, None, settings, [*prompt, *source])  # type: ignore[arg-type]
    stepper.clock = lambda: live.now
    produced, token = 1, reply[0]
    while produced < tokens:
        out = stepper.step(token, tokens - produced)
        produced += len(out)
        token = out[-1]
    if context is not None:
        context.spec_costs = live.spec_costs
    c = stepper.counters
    plain = (produced - 1) * costs[0][1]
    return {
        "tokens": produced,
        "speedup": round(plain / live.now, 3),
        "drafted": c.drafted,
        "accepted": c.accepted,
        "acceptance": round(c.accepted / c.drafted, 3) if c.drafted else 0.0,
        "tokens_per_call": round((produced - 1) / c.decode_calls, 2) if c.decode_calls else 0.0,
        "batches": {str(k): v for k, v in sorted(c.batches.items())},
        "declined": c.declined,
        "guarded": c.guarded,
    }


def record(
    engine: Engine, messages: list[ChatMessage], tokens: int, *, ignore_eos: bool
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
    with Engine(load_profile(args.profile), model_path=args.model) as engine:
        engine.load()
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
    ap.add_argument(
        "--pooled-acceptance", action="store_true", help="one acceptance rate (cli_pooled_acceptance.py)"
    )
    ap.add_argument("--replies", help="JSON of the recorded replies: read if it exists, else written")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.pooled_acceptance:  # run as a script: benchmarks/ is on the path
        from cli_pooled_acceptance import PooledAcceptance

        speculation.Acceptance = PooledAcceptance  # type: ignore[misc]

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
