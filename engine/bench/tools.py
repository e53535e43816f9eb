"""The tools section of `velo-chat bench` (`--tools`): is every step of a tool loop warm?

A tool loop appends only a step's call and its results to the conversation, so each step after
the first should prefill just those and reuse the rest: the state the previous step left at the
end of its call (docs/tools.md). This measures it on a scripted loop in a small Python package
with a failing test, made in a temporary folder (`tools_script.py`): list the files, search,
read, run the tests, fix the bug, run them again, read on (10 steps). Each step's reply is
forced to be exactly its scripted call as the template writes it (`Diagnostics.turn` with
`forced_call`: a grammar whose root is the call's text), so the loop runs on any model, random
weights included; the tools really run in the folder (the caller's `run_tool`: the app's
ToolBox, everything allowed) and their results are really appended.

Before the loop the conversation is filled to a size (`DEFAULT_FILLS`: 8K and 32K tokens) with
reference code attached to its first message, as a session that has read a large file would
be. For each step: its prompt tokens, the tokens it reused, TTFT warm (the loop as it ran) and
TTFT of a cold prefill of the same prompt (an empty context, no checkpoints), side by side.
The target: every step after the first reuses at least `TARGET_REUSE` of its prompt.

The engine cannot import the app: the app passes the tool definitions and a function that runs
a call in a folder. A model whose chat template renders no tools is measured with another
template (`template_source`, `--tools-template`), or refused in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from .. import (
    ChatMessage,
    ChatTemplateError,
    EngineAPI,
    GGUFError,
    ProfileError,
    PromptTooLong,
    ToolCall,
    ToolSpec,
    TurnStats,
)
from ..config import Profile, SamplingSettings, load_profile
from ..diagnostics import Diagnostics, diagnostics
from ..fit import read_facts
from ..setup import chat_template_of, resolve_model_path
from .attach import lines_that_fit
from .result import BenchResult
from .tools_script import SCRIPT, make_fixture, opening, pad_lines

RunTool = Callable[[Path, ToolCall], str]
"""Runs a call with `root` as the working folder; returns the text the model is told."""

DEFAULT_FILLS: Final = (8192, 32768)
TARGET_REUSE: Final = 0.95
LOOP_ROOM: Final = 2048
"""Context kept beyond the fill for what the scripted loop appends (its calls and the results
of its tools, which are small files and short outputs)."""
NO_TOOLS = "the model's chat template has no tool support"


def tools_profile(profile: Profile, model: str | None, fills: Sequence[int] = DEFAULT_FILLS) -> Profile:
    """The profile as `bench --tools` loads it: a context for the largest fill and the loop, no
    larger than the model's training context (a fill that does not fit is measured as large as
    it fits, and the section says so), and checkpoints on (the warm path under test)."""
    n_ctx = max(fills) + LOOP_ROOM
    trained = read_facts(resolve_model_path(profile, model)).n_ctx_train
    if trained > 0:
        n_ctx = min(n_ctx, trained)
    context = dataclasses.replace(profile.context, n_ctx=n_ctx)
    checkpoints = dataclasses.replace(profile.checkpoints, enabled=True)
    return dataclasses.replace(profile, context=context, checkpoints=checkpoints)


def template_source(name_or_path: str) -> str:
    """The chat template `--tools-template` names: a Jinja file, a GGUF (its template), or a
    profile's name (its model's template). `ChatTemplateError`, one line, when there is none."""
    what = f"--tools-template {name_or_path}"
    path = Path(name_or_path).expanduser()
    try:
        if not path.is_file():
            path = resolve_model_path(load_profile(name_or_path))
        with path.open("rb") as f:
            is_gguf = f.read(4) == b"GGUF"
        if not is_gguf:
            return path.read_text(encoding="utf-8")
        source = chat_template_of(path)
    except ProfileError:
        raise ChatTemplateError(f"{what}: no such file, and no profile of that name") from None
    except (OSError, UnicodeDecodeError, GGUFError) as exc:
        raise ChatTemplateError(f"{what}: {exc}") from None
    if not isinstance(source, str) or not source:
        raise ChatTemplateError(f"{what}: {path.name} has no chat template")
    return source


def run_tools_bench(
    engine: EngineAPI,
    specs: Sequence[ToolSpec],
    run_tool: RunTool,
    *,
    fills: Sequence[int] = DEFAULT_FILLS,
    steps: int = len(SCRIPT),
    chat_template: str | None = None,
    template_name: str = "",
    note: Callable[[str], None] = lambda _s: None,
) -> dict[str, Any]:
    """The scripted loop at each fill, warm, then each step's prompt cold (module docstring).
    `chat_template`: render with this template instead of the model's (`template_name` names
    it in the result). Raises `ChatTemplateError` when the template renders no tools and
    `PromptTooLong` when the context holds no fill beside the loop. The live context is empty
    afterwards."""
    diag = diagnostics(engine)
    assert engine.info is not None, "load the engine first"
    if not 1 <= steps <= len(SCRIPT):
        raise ValueError(f"the scripted loop has 1 to {len(SCRIPT)} steps, not {steps}")
    n_ctx = engine.info.n_ctx
    room = n_ctx - LOOP_ROOM
    if room < 512:
        raise PromptTooLong(
            f"bench --tools: a context of {n_ctx:,} tokens leaves no room beside the loop's {LOOP_ROOM:,}"
        )
    with diag.chat_template(chat_template) if chat_template else contextlib.nullcontext():
        fmt = diag.tool_format()
        if fmt is None and chat_template:
            raise ChatTemplateError(f"the chat template {template_name or 'given'} has no tool support")
        if fmt is None:
            raise ChatTemplateError(
                f"{NO_TOOLS}; --tools-template NAME_OR_PATH measures it with one that has (a Jinja "
                "file, a GGUF or a profile: e.g. Qwen3-Coder's template)"
            )
        runs = []
        for fill in fills:
            note(f"tools: the scripted loop at {min(fill, room):,} tokens")
            runs.append(_fill_run(diag, specs, run_tool, fill, room, steps, note))
    return {
        "template": template_name or "the model's",
        "format": fmt.name,
        "n_ctx": n_ctx,
        "steps": steps,
        "target_reuse": TARGET_REUSE,
        "fills": runs,
    }


def _sampling(diag: Diagnostics, call: ToolCall) -> SamplingSettings:
    """Greedy, with room for the call's tokens and the end of generation."""
    fmt = diag.tool_format()
    assert fmt is not None
    room = len(fmt.render(call).encode()) + 8
    return dataclasses.replace(diag.engine.profile.sampling, temperature=0.0, max_tokens=room)


def _fill_run(
    diag: Diagnostics,
    specs: Sequence[ToolSpec],
    run_tool: RunTool,
    fill: int,
    room: int,
    steps: int,
    note: Callable[[str], None],
) -> dict[str, Any]:
    """The loop at one fill: warm (checkpoints on, as a session runs), then each step's prompt
    cold."""
    reasoning = dataclasses.replace(diag.engine.profile.reasoning, enabled="off", budget_tokens=0)
    variables = diag.template_variables(reasoning, specs)
    lines = lines_that_fit(
        lambda n: len(diag.tokens_for(opening(n), variables)), pad_lines(), min(fill, room)
    )
    messages = opening(lines)
    prompts: list[list[ChatMessage]] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="velo-bench-tools-") as tmp:
        root = make_fixture(Path(tmp) / "calc")
        diag.reset()
        with diag.checkpoints_at(Path(tmp) / "checkpoints"):
            for k, scripted in enumerate(SCRIPT[:steps], start=1):
                done = diag.complete(
                    messages, sampling=_sampling(diag, scripted), reasoning=reasoning, tools=specs,
                    forced_call=scripted,
                )  # fmt: skip
                calls = done.tool_calls
                exact = len(calls) == 1 and _same(calls[0], scripted)
                call = calls[0] if exact else scripted
                call = call if call.id else dataclasses.replace(call, id=f"call_{k}_1")
                result = run_tool(root, call)
                prompts.append(messages)
                rows.append(_row(k, scripted, exact, done.stats, len(result)))
                messages = [
                    *messages,
                    ChatMessage("assistant", done.text, done.reasoning, (call,)),
                    ChatMessage("tool", result, tool_call_id=call.id, name=call.name),
                ]
        note(f"tools: the same {steps} prompts cold")
        with diag.checkpoints_at(None):
            for row, prompt, scripted in zip(rows, prompts, SCRIPT, strict=False):
                diag.reset()
                cold = diag.complete(
                    prompt, sampling=_sampling(diag, scripted), reasoning=reasoning, max_tokens=1,
                    tools=specs, forced_call=scripted,
                ).stats  # fmt: skip
                warm = row["warm_ttft_s"]
                row["cold_ttft_s"] = round(cold.ttft_s, 4)
                row["cold_over_warm"] = round(cold.ttft_s / warm, 2) if warm else None
        diag.reset()
    later = [r["reuse"] for r in rows[1:]]
    return {
        "fill_asked": fill,
        "fill": rows[0]["prompt_tokens"],
        "fits": fill <= room,
        "reference_lines": lines,
        "min_reuse_after_first": min(later) if later else None,
        "target_met": all(r >= TARGET_REUSE for r in later),
        "calls_exact": all(r["exact_call"] for r in rows),
        "rows": rows,
    }


def _same(call: ToolCall, scripted: ToolCall) -> bool:
    return not call.error and call.name == scripted.name and dict(call.arguments) == dict(scripted.arguments)


def _row(k: int, scripted: ToolCall, exact: bool, s: TurnStats, result_chars: int) -> dict[str, Any]:
    return {
        "step": k,
        "tool": scripted.name,
        "exact_call": exact,
        "call_tokens": s.decode_tokens,
        "result_chars": result_chars,
        "prompt_tokens": s.prompt_tokens,
        "cached_tokens": s.cached_tokens,
        "prefilled_tokens": s.prefill_tokens,
        "reuse": round(s.cached_tokens / s.prompt_tokens, 4) if s.prompt_tokens else 0.0,
        "source": s.source,
        "warm_ttft_s": round(s.ttft_s, 4),
        # bringing the context to the boundary after the call (before the tool runs)
        "close_s": round(s.checkpoint.close_s, 4) if s.checkpoint is not None else None,
    }


def tools_result(engine: EngineAPI, profile_name: str, section: dict[str, Any]) -> BenchResult:
    """The benchmark's result with this section alone (`bench --tools` runs nothing else)."""
    from .run import _result_of

    result = _result_of(engine, diagnostics(engine), profile_name)
    result.sections["tools"] = section
    return result


def format_lines(section: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"tools     a scripted {section['steps']}-step loop ({section['format']} calls, template: "
        f"{section['template']}), n_ctx {section['n_ctx']:,}",
        f"          target: every step after the first reuses >= {section['target_reuse']:.0%} of its prompt",
    ]
    for run in section["fills"]:
        held = f"{section['n_ctx']:,} hold no more beside the loop"
        fits = "" if run["fits"] else f" (of {run['fill_asked']:,} asked: {held})"
        low = run["min_reuse_after_first"]
        lines += [
            "",
            f"  fill {run['fill']:,} tokens{fits}: lowest reuse after the first step "
            + (f"{low:.1%}" if low is not None else "n/a")
            + (", target met" if run["target_met"] else ", target NOT met")
            + ("" if run["calls_exact"] else "; a reply was not its scripted call"),
            f"  {'step':>4} {'tool':<12} {'prompt':>8} {'cached':>8} {'reuse':>7} {'source':<7}"
            f" {'warm s':>8} {'cold s':>8} {'cold/warm':>9}",
        ]
        for r in run["rows"]:
            ratio = "n/a" if r["cold_over_warm"] is None else f"{r['cold_over_warm']:.1f}x"
            lines.append(
                f"  {r['step']:>4} {r['tool']:<12} {r['prompt_tokens']:>8,} {r['cached_tokens']:>8,}"
                f" {r['reuse']:>7.1%} {r['source']:<7} {r['warm_ttft_s']:>8.3f} {r['cold_ttft_s']:>8.3f}"
                f" {ratio:>9}"
            )
    return lines
