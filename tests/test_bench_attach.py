"""`velo-chat bench --attach`: a coding session with an attached file, its follow-up resumed from
disk in a fresh process; and `bench --spec`'s copy-edit prompt built through the attach path.

Real engine, the real SmolLM2 GGUF, real checkpoint files, a real fresh process. The file is
cut to a few lines so a test turn stays short on two cores; the section's ratios are printed by
`bench`, never asserted here (they depend on the machine's load)."""

from __future__ import annotations

import argparse
import colorsys
import inspect
from pathlib import Path

from velo_chat.engine import ChatMessage, render_block, render_user_content
from velo_chat.engine.bench import AttachedFile, copy_edit_source, format_table, run_bench
from velo_chat.engine.bench.attach import (
    ATTACH_PATH,
    MARGIN_TOKENS,
    QUESTIONS,
    first_message,
    fitted_file,
    lines_that_fit,
    source_lines,
)
from velo_chat.engine.bench.spec import workloads
from velo_chat.engine.bench.spec_source import colorsys_source
from velo_chat.engine.diagnostics import diagnostics
from velo_chat.engine.engine import Engine

from tests.support.engine_helpers import run_cli, test_profile

TEST_LINES = 100  # about 900 tokens of argparse.py: the section's whole path, quickly

SECTION_KEYS = {
    "file",
    "file_lines",
    "file_lines_asked",
    "file_tokens",
    "first_prompt_tokens",
    "first_ttft_s",
    "reply_tokens",
    "conversation_tokens",
    "history_tokens",
    "turns",
    "cold_ttft_s",
    "warm_ttft_s",
    "warm_cached_tokens",
    "disk_ttft_s",
    "disk_source",
    "disk_cached_tokens",
    "disk_restore_s",
    "history_reused",
    "cold_over_disk",
    "resumed_from_disk",
}


def _engine(smollm2_path: Path, checkpoints: Path) -> Engine:
    engine = Engine(test_profile(smollm2_path), checkpoint_root=checkpoints)
    engine.load()
    return engine


def test_the_attach_section_resumes_the_follow_up_from_disk(smollm2_path: Path, tmp_path: Path) -> None:
    """The whole section through `run_bench`: the first turn prefills the file, the follow-up in
    a fresh process restores at least that whole first prompt from the disk checkpoints."""
    engine = _engine(smollm2_path, tmp_path / "checkpoints")
    try:
        file = source_lines(TEST_LINES)
        file_tokens = engine.count_tokens(render_block(file))
        result = run_bench(
            engine,
            profile_name="test",
            prefill_sizes=(64,),
            decode_tokens=4,
            repeats=1,
            attach_lines=TEST_LINES,
        )
        assert not engine.loaded  # closed before the fresh process loaded the model again
    finally:
        engine.close()
    r = result.sections["attach"]
    assert set(r) == SECTION_KEYS
    assert "resume" not in result.sections and "resume_session" not in result.sections
    assert (r["file"], r["file_lines"], r["file_lines_asked"]) == (ATTACH_PATH, TEST_LINES, TEST_LINES)
    assert r["file_tokens"] == file_tokens
    assert r["first_prompt_tokens"] > r["file_tokens"]  # the block is inside the first prompt
    assert r["resumed_from_disk"] is True and r["disk_source"] == "disk"
    assert r["disk_cached_tokens"] >= r["first_prompt_tokens"]
    assert r["conversation_tokens"] > r["disk_cached_tokens"]  # the question is prefilled
    table = format_table(result)
    assert f"attach    argparse.py: {TEST_LINES} lines, {file_tokens:,} tokens" in table
    assert "(did not resume from disk)" not in table


def test_the_file_is_the_start_of_argparse_attached_as_a_user_attaches_it() -> None:
    file = source_lines(TEST_LINES)
    assert file == AttachedFile("argparse.py", "".join(inspect.getsource(argparse).splitlines(True)[:100]))
    assert file.lines == TEST_LINES
    assert first_message(file).content == render_user_content([file], QUESTIONS[0])
    assert first_message(file).content.startswith("argparse.py\n```python\n")


def test_a_context_too_small_for_the_file_takes_the_lines_that_fit(
    smollm2_path: Path, tmp_path: Path
) -> None:
    """The test profile's 2,048-token context cannot hold 1,500 lines: the section keeps the
    most lines whose first prompt leaves room for two replies and the second question."""
    engine = _engine(smollm2_path, tmp_path / "checkpoints")
    try:
        diag = diagnostics(engine)
        file = fitted_file(diag, 2048, lines=1500, reply_tokens=64)
        question = len(diag.tokens_for([ChatMessage("user", QUESTIONS[1])]))
        used = len(diag.tokens_for([first_message(file)]))
        more = len(diag.tokens_for([first_message(source_lines(file.lines + 1))]))
    finally:
        engine.close()
    budget = 2048 - 2 * 64 - question - MARGIN_TOKENS
    assert 0 < file.lines < 1500
    assert file == source_lines(file.lines)
    assert used <= budget < more


def test_lines_that_fit_is_the_most_that_stay_within_the_budget() -> None:
    def ten_per_line(n: int) -> int:
        return 10 * n + 5

    assert lines_that_fit(ten_per_line, 1500, 95) == 9
    assert lines_that_fit(ten_per_line, 3, 95) == 3
    assert lines_that_fit(ten_per_line, 1500, 14) == 0


def test_the_copy_edit_prompt_is_the_attached_file_and_the_instruction() -> None:
    """`bench --spec` sends what a user attaching the file and asking for the rename sends."""
    text = inspect.getsource(colorsys)
    instruction = (
        "Rename the function `_v` to `_value` everywhere (its definition and every call) and give "
        "back the whole file, nothing else."
    )
    expected = render_user_content([AttachedFile("colorsys.py", text)], instruction)
    assert colorsys_source().message().content == expected
    assert workloads()["copy-edit"][0].content == expected
    picked = copy_edit_source("notes.sh", "greet() {\n  echo hi\n}\nfunction run { greet; }\nrun\n")
    assert picked.message().content == render_user_content(
        [AttachedFile("notes.sh", picked.text)],
        f"Rename the name `{picked.old}` to `{picked.new}` everywhere (its definition and every use) "
        "and give back the whole file, nothing else.",
    )


def test_attach_with_spec_is_refused_in_one_line() -> None:
    run = run_cli("bench", "--attach", "--spec")
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "--attach" in run.stderr
    assert "Traceback" not in run.stderr
