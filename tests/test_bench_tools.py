"""`velo-chat bench --tools`: a scripted tool loop, warm at every step (`engine/bench/tools.py`).

Real engine, the tiny qwen4exp (random weights) with Qwen3-Coder's template, the tools really
run by the app's ToolBox in a temporary package, 3 steps in a 4,096-token context so a run stays
short on two cores. What is deterministic is asserted: every reply is exactly its scripted call
(the grammar admits nothing else), the tools ran those calls, and each step after the first
prefills exactly what the step appended (the results and the template's tokens around them), all
before it reused. Times are printed by `bench`, never asserted (they depend on the machine's
load)."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest

from velo_chat.app.tools.specs import SPECS, TOOL_NAMES
from velo_chat.app.tools.toolbox import ToolBox
from velo_chat.engine import ChatMessage, ChatTemplateError, ToolCall
from velo_chat.engine.bench import tools as bench_tools
from velo_chat.engine.bench.tools_script import SCRIPT, make_fixture, opening
from velo_chat.engine.config import ToolSettings
from velo_chat.engine.diagnostics import diagnostics, follow_up_prefix
from velo_chat.engine.engine import Engine

from devkit.gguf_template import with_chat_template
from tests.support.engine_helpers import run_cli, test_profile
from tests.support.llama_templates import read_template, templates_dir
from tests.test_cli import assert_user_error

TEMPLATES = templates_dir()
needs_templates = pytest.mark.skipif(TEMPLATES is None, reason="llama.cpp's chat templates are unavailable")
STEPS = 3
SPEC_LIST = [SPECS[name] for name in TOOL_NAMES]
SECTION_KEYS = {"template", "format", "n_ctx", "steps", "target_reuse", "fills"}
FILL_KEYS = {
    "fill_asked",
    "fill",
    "fits",
    "reference_lines",
    "min_reuse_after_first",
    "target_met",
    "calls_exact",
    "rows",
}
ROW_KEYS = {
    "step",
    "tool",
    "exact_call",
    "call_tokens",
    "result_chars",
    "prompt_tokens",
    "cached_tokens",
    "prefilled_tokens",
    "reuse",
    "source",
    "warm_ttft_s",
    "close_s",
    "cold_ttft_s",
    "cold_over_warm",
}


@pytest.fixture(scope="module")
def coder_jinja() -> str:
    assert TEMPLATES is not None
    return read_template(TEMPLATES, "Qwen3-Coder")


@pytest.fixture(scope="module")
def coder_path(qwen_path: Path, coder_jinja: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_chat_template(qwen_path, coder_jinja, tmp_path_factory.mktemp("coder") / "coder.gguf")


def _runner(ran: list[ToolCall]) -> bench_tools.RunTool:
    settings = ToolSettings(offered="all")

    def run_tool(root: Path, call: ToolCall) -> str:
        ran.append(call)
        box = ToolBox(root, settings)
        prepared = box.prepare(call)
        assert not prepared.error, prepared.error
        return box.run(prepared, threading.Event()).content

    return run_tool


@needs_templates
def test_every_step_after_the_first_prefills_only_what_it_appended(coder_path: Path, tmp_path: Path) -> None:
    profile = test_profile(coder_path, context={"n_ctx": 4096})
    ran: list[ToolCall] = []
    with Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine:
        engine.load()
        r = bench_tools.run_tools_bench(engine, SPEC_LIST, _runner(ran), fills=(2048,), steps=STEPS)
        assert set(r) == SECTION_KEYS and json.loads(json.dumps(r)) == r
        assert r["format"] == "qwen3-coder-xml" and r["n_ctx"] == 4096 and r["steps"] == STEPS
        (run,) = r["fills"]
        assert set(run) == FILL_KEYS and run["fits"] and run["calls_exact"]
        rows = run["rows"]
        assert [set(row) for row in rows] == [ROW_KEYS] * STEPS
        # the replies were the scripted calls, and the tools ran exactly those
        assert [(c.name, dict(c.arguments)) for c in ran] == [
            (c.name, dict(c.arguments)) for c in SCRIPT[:STEPS]
        ]
        assert all(c.id and c.text for c in ran)  # as parsed from the reply (the loop keeps its id)
        assert all(row["exact_call"] and row["result_chars"] > 0 for row in rows)
        # the fill: reference code up to 2,048 tokens, then the loop
        assert run["reference_lines"] > 0 and 1900 <= run["fill"] <= 2048
        assert rows[0]["cached_tokens"] == 0 and rows[0]["prompt_tokens"] == run["fill"]

        # each later step starts from the live context at the previous call's boundary: it
        # reuses all of it (the call included) and prefills the results
        diag = diagnostics(engine)
        reasoning = dataclasses.replace(profile.reasoning, enabled="off")
        variables = diag.template_variables(reasoning, SPEC_LIST)
        messages = opening(run["reference_lines"])
        root = make_fixture(tmp_path / "again")
        for k in range(1, STEPS):
            call = ran[k - 1]
            boundary = follow_up_prefix(
                diag.tokens_for, messages, "", variables=variables, tool_calls=(call,)
            )
            result = _runner([])(root, call)
            messages = [
                *messages,
                ChatMessage("assistant", "", tool_calls=(call,)),
                ChatMessage("tool", result, tool_call_id=call.id, name=call.name),
            ]
            row = rows[k]
            assert row["prompt_tokens"] == len(diag.tokens_for(messages, variables))
            assert row["source"] == "live" and row["cached_tokens"] == len(boundary), k
            assert row["cached_tokens"] > rows[k - 1]["prompt_tokens"]
            assert row["reuse"] == round(row["cached_tokens"] / row["prompt_tokens"], 4) >= 0.95
        assert run["min_reuse_after_first"] == min(row["reuse"] for row in rows[1:])
        assert run["target_met"]
        table = "\n".join(bench_tools.format_lines(r))
        assert "target met" in table and "cold/warm" in table and "list_files" in table


def test_tools_profile_fits_the_fills_within_the_training_context(qwen_path: Path) -> None:
    profile = test_profile(qwen_path, checkpoints={"enabled": False})
    big = bench_tools.tools_profile(profile, None, (8192, 32768))
    assert big.context.n_ctx == 32768  # the tiny qwen4exp's training context, not 32,768 + the loop
    assert big.checkpoints.enabled
    assert bench_tools.tools_profile(profile, None, (1024,)).context.n_ctx == 1024 + bench_tools.LOOP_ROOM


@needs_templates
def test_template_source_reads_a_jinja_file_or_a_gguf(
    coder_path: Path, coder_jinja: str, tmp_path: Path
) -> None:
    jinja = tmp_path / "coder.jinja"
    jinja.write_text(coder_jinja, encoding="utf-8")
    assert bench_tools.template_source(str(jinja)) == coder_jinja
    assert bench_tools.template_source(str(coder_path)) == coder_jinja
    with pytest.raises(ChatTemplateError, match="no such file, and no profile"):
        bench_tools.template_source("no-such-template")


def test_a_template_without_tools_is_refused_in_one_line(qwen_path: Path, velo_home: Path) -> None:
    # the tiny qwen4exp's own template is SmolLM2's: no tools
    assert_user_error(
        run_cli("bench", "--model", str(qwen_path), "--tools", "--tools-fills", "512", "--tools-steps", "1"),
        "the model's chat template has no tool support",
    )
    assert_user_error(run_cli("bench", "--tools", "--spec"), "--tools runs alone")
    assert_user_error(run_cli("bench", "--tools-template", "x.jinja"), "goes with --tools")


@needs_templates
def test_bench_tools_on_the_command_line_with_another_template(
    qwen_path: Path, coder_jinja: str, velo_home: Path, tmp_path: Path
) -> None:
    jinja = tmp_path / "Qwen3-Coder.jinja"
    jinja.write_text(coder_jinja, encoding="utf-8")
    args = ("--tools", "--tools-template", str(jinja), "--tools-fills", "1024", "--tools-steps", "2")
    proc = run_cli("bench", "--model", str(qwen_path), *args, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["n_ctx"] == 1024 + bench_tools.LOOP_ROOM
    section = out["sections"]["tools"]
    assert set(section) == SECTION_KEYS and section["template"] == "Qwen3-Coder.jinja"
    (run,) = section["fills"]
    assert run["calls_exact"] and [row["tool"] for row in run["rows"]] == ["list_files", "search"]
    assert run["rows"][1]["source"] == "live" and run["rows"][1]["reuse"] >= 0.95
