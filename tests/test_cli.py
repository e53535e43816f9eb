"""The real `velo-chat` CLI in a subprocess: answers, JSON contract, sessions, bad input.

Every bad input must give exit code 2, exactly one line on stderr, no traceback, and leave the
session store as it was.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from velo_chat.engine.fit import machine

from tests.support.engine_helpers import run_cli

STATS_KEYS = {
    "ttft_s",
    "prompt_tokens",
    "cached_tokens",
    "prefill_tokens",
    "prefill_tok_s",
    "decode_tokens",
    "decode_tok_s",
    "graphs_reused",
    "llama_eval_ms",
    "wall_ms",
    "checkpoint",
}


def ask_json(*args: str) -> dict:
    proc = run_cli("ask", *args, "--json", "--max-tokens", "48")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def proc_stderr_is_empty(prompt: str) -> bool:
    """Nothing from llama.cpp or the engine reaches the terminal (it all goes to the log)."""
    proc = run_cli("ask", prompt, "--json", "--max-tokens", "4")
    return proc.returncode == 0 and proc.stderr == ""


def session_count(home: Path) -> int:
    db = home / "data" / "sessions.sqlite3"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]


def message_count(home: Path) -> int:
    db = home / "data" / "sessions.sqlite3"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]


def test_ask_answers_with_the_default_model(velo_home):
    out = ask_json("Write a Python function that reverses a string")
    assert "def " in out["text"]
    assert STATS_KEYS <= set(out["stats"])
    s = out["stats"]
    assert s["decode_tokens"] > 0 and s["decode_tok_s"] > 0
    assert s["prefill_tokens"] + s["cached_tokens"] == s["prompt_tokens"]
    assert session_count(velo_home) == 1 and message_count(velo_home) == 2
    assert proc_stderr_is_empty("Hello")
    assert (velo_home / "logs" / "velo-chat.log").read_text().count("llama_model_loader") > 0


def test_ask_continues_a_session_and_sessions_commands_work(velo_home):
    first = ask_json("Name a fruit.")
    sid = first["session_id"]
    second = ask_json("Name another one.", "--session", sid[:8])
    assert second["session_id"] == sid
    assert second["stats"]["prompt_tokens"] > first["stats"]["prompt_tokens"]
    listed = run_cli("sessions", "list", "--json")
    assert [s["id"] for s in json.loads(listed.stdout)] == [sid]
    shown = run_cli("sessions", "show", sid[:6]).stdout
    assert "Name a fruit." in shown and "Name another one." in shown
    exported = run_cli("sessions", "export", sid, "--format", "json")
    data = json.loads(exported.stdout)
    assert len(data["messages"]) == 4
    forked = run_cli("sessions", "fork", sid).stdout.strip()
    assert forked and forked != sid
    assert run_cli("sessions", "rename", forked, "Fruit fork").returncode == 0
    assert run_cli("sessions", "delete", forked).returncode == 0
    assert session_count(velo_home) == 1


def test_regenerate_and_edit_last_fork_and_resume_from_disk_in_a_new_process(velo_home):
    first = ask_json("Name a fruit.")
    sid = first["session_id"]
    second = ask_json("Name another one.", "--session", sid)
    regen = ask_json("--session", sid, "--regenerate")
    assert regen["text"] == second["text"]  # greedy: the same answer again
    assert regen["session_id"] != sid  # in a fork: the session keeps its answer
    s = regen["stats"]
    # The default profile saves no state before a short prefill: the regenerate resumes at the
    # boundary after the first reply, on disk, and prefills only the last question.
    assert s["checkpoint"]["source"] == "disk"
    assert s["cached_tokens"] >= first["stats"]["prompt_tokens"] + 1
    assert s["prefill_tokens"] < 32
    edit = ask_json("Name a vegetable.", "--session", sid, "--edit-last")
    assert edit["stats"]["checkpoint"]["source"] == "disk"
    assert edit["stats"]["cached_tokens"] >= first["stats"]["prompt_tokens"]
    original = run_cli("sessions", "show", sid).stdout
    assert "Name another one." in original and "Name a vegetable." not in original
    assert original.count("] user") == 2 and original.count("] assistant") == 2
    fork = run_cli("sessions", "show", edit["session_id"]).stdout
    assert "Name a vegetable." in fork and "Name another one." not in fork
    assert fork.count("] user") == 2 and fork.count("] assistant") == 2
    assert_user_error(run_cli("ask", "x", "--regenerate"), "need --session")


def test_ask_streams_plain_text(velo_home):
    proc = run_cli("ask", "Say hello.", "--max-tokens", "12")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


def assert_user_error(proc, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("velo-chat: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_missing_model_path(velo_home, tmp_path):
    proc = run_cli("ask", "hi", "--model", str(tmp_path / "nope.gguf"))
    assert_user_error(proc, "not found", "nope.gguf")
    assert session_count(velo_home) == 0


def test_not_a_gguf(velo_home, tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("this is not a model\n" * 10)
    assert_user_error(run_cli("ask", "hi", "--model", str(bad)), "not a GGUF")
    assert session_count(velo_home) == 0


def test_truncated_gguf(velo_home, tmp_path, smollm2_path):
    cut = tmp_path / "cut.gguf"
    with smollm2_path.open("rb") as src:
        cut.write_bytes(src.read(40_000_000))
    assert_user_error(run_cli("ask", "hi", "--model", str(cut)), "truncated")
    head = tmp_path / "head.gguf"
    with smollm2_path.open("rb") as src:
        head.write_bytes(src.read(5000))
    assert_user_error(run_cli("ask", "hi", "--model", str(head)), "truncated")
    assert session_count(velo_home) == 0


def test_unknown_profile(velo_home):
    assert_user_error(run_cli("ask", "hi", "--profile", "nope"), "unknown profile 'nope'")
    assert_user_error(run_cli("profiles", "show", "nope"), "unknown profile")


def test_invalid_profile_value(velo_home):
    profiles = velo_home / "config" / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "broken.toml").write_text("[sampling]\ntemperature = 9.5\n")
    assert_user_error(
        run_cli("ask", "hi", "--profile", "broken"), "sampling.temperature", "between 0.0 and 5.0"
    )
    (profiles / "typo.toml").write_text("[context]\nn_ctxx = 10\n")
    assert_user_error(run_cli("--profile", "typo", "--print-config"), "context.n_ctxx")
    (profiles / "syntax.toml").write_text("[context\n")
    assert_user_error(run_cli("profiles", "show", "syntax"), "invalid TOML")
    assert session_count(velo_home) == 0


def test_prompt_longer_than_context(velo_home):
    profiles = velo_home / "config" / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "tiny.toml").write_text("[context]\nn_ctx = 256\nn_batch = 64\nn_ubatch = 64\n")
    proc = run_cli("ask", "word " * 400, "--profile", "tiny")
    assert_user_error(proc, "context holds 256")
    assert session_count(velo_home) == 0 and message_count(velo_home) == 0


def test_prompt_too_long_in_an_existing_session_writes_nothing(velo_home):
    sid = ask_json("Hello!")["session_id"]
    before = message_count(velo_home)
    profiles = velo_home / "config" / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "tiny.toml").write_text("[context]\nn_ctx = 256\nn_batch = 64\nn_ubatch = 64\n")
    proc = run_cli("ask", "word " * 400, "--session", sid, "--profile", "tiny")
    assert_user_error(proc, "context holds 256")
    assert message_count(velo_home) == before


def test_default_model_missing_says_how_to_fix(bare_home):
    proc = run_cli("ask", "hi")
    assert_user_error(proc, "velo-chat fetch-model")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("sessions", "show", "zzzz"), "zzzz"),
        (("ask", "   "), "empty"),
        (("bench", "--ple", "stock,cpu"), "--ple"),
        (("bench", "--ple", "stock,stock"), "--ple"),
        (("bench", "--ple", "stock,gpu", "--spec"), "--ple"),
        (("bench", "--spec", "--profile", "remote-llama-server"), "remote profile"),
    ],
)
def test_other_user_errors(velo_home, args, fragment):
    assert_user_error(run_cli(*args), fragment)


def test_bad_flags_exit_2(velo_home):
    proc = run_cli("ask", "hi", "--max-tokens", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_profiles_and_print_config(velo_home):
    listed = run_cli("profiles", "list").stdout
    assert "default" in listed and "spark-qwen38" in listed
    shown = run_cli("profiles", "show", "spark-qwen38").stdout
    assert 'lazy_ple = "on"' in shown and "n_ctx = 131072" in shown
    assert "n_ctx = 262144" in run_cli("profiles", "show", "spark-qwen38-long").stdout
    assert "n_ctx = 65536" in run_cli("profiles", "show", "spark-qwen38-lowmem").stdout
    assert "n_gpu_layers = -1" in shown and 'flash_attn = "on"' in shown
    config = run_cli("--print-config").stdout
    assert str(velo_home) in config and "[sampling]" in config
    assert run_cli("--version").stdout.startswith("velo-chat ")


def test_bench_json_reports_every_number(velo_home):
    proc = run_cli(
        "bench",
        "--json",
        "--prefill-sizes",
        "64,128",
        "--decode-tokens",
        "16",
        "--repeats",
        "1",
        "--resume-tokens",
        "1024",
        "--session-turns",
        "4",
        "--ckpt-sizes",
        "128,384,9999999",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [row["tokens"] > 0 for row in data["prefill"]] == [True, True]
    assert all(row["tok_s"] > 0 and row["ttft_s"] > 0 for row in data["prefill"])
    d = data["decode"]
    assert d["tokens"] == 16 and d["tok_s"] > 0 and d["overhead"] >= 0.9
    assert d["llama_eval_ms"] > 0 and d["wall_ms"] > 0
    s = data["sections"]["resume_session"]
    assert s["turns"] == 4 and s["disk_source"] == "disk" and s["history_reused"] >= 0.95
    assert 0 < s["disk_cached_tokens"] <= s["history_tokens"] < s["conversation_tokens"]
    # the first turn's checkpoints hold whole states; each follow-up's share most of them
    first, *follow = s["growth"]
    assert len(follow) == 2 and first["ram_added_bytes"] >= first["state_bytes"]
    for row in follow:
        assert row["states_saved"] >= 1 and 0 < row["ram_added_bytes"] < 0.9 * row["state_bytes"]
        assert 0 < row["disk_added_bytes"] < 0.9 * row["state_bytes"]
    assert 0 < s["follow_up_ram_over_state"] < 0.9 and 0 < s["follow_up_disk_over_state"] < 0.9
    sizes = data["sections"]["checkpoint_sizes"]
    assert sizes["skipped"] == [9999999] and [r["size"] for r in sizes["sizes"]] == [128, 384]
    small, large = sizes["sizes"]
    assert 0 < small["state_bytes"] < large["state_bytes"]
    for r in sizes["sizes"]:
        assert r["cold"]["source"] == "none" and r["from_ram"]["source"] == "ram"
        assert r["from_disk"]["source"] == r["from_single_file"]["source"] == "disk"
        for restored in (r["from_ram"], r["from_disk"], r["from_single_file"]):
            assert restored["cached_tokens"] >= r["cold"]["prompt_tokens"] - 8 and restored["restore_s"] > 0
        assert (
            r["memory"]["ram_entries"] >= 1 and r["file_bytes"] > 0 and r["chunked_over_single_restore"] > 0
        )
        # the snapshots' own time on the turn's thread, for both ways of writing
        for saving in (r["saving"], r["single_saving"]):
            assert saving["saved"] and 0 < saving["snapshot_s"] < saving["ttft_s"]


def test_bench_ple_compares_the_two_paths(velo_home, qwen_path):
    """`bench --ple stock,gpu` on a qwen4exp model: both runs, and the GPU path that cannot run
    here (no CUDA) reported as run stock, with llama.cpp's reason, not silently."""
    proc = run_cli(
        "bench",
        "--model",
        str(qwen_path),
        "--ple",
        "stock,gpu",
        "--json",
        "--prefill-sizes",
        "32",
        "--decode-tokens",
        "8",
        "--repeats",
        "1",
        "--no-resume",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data["ple"]) == {"stock", "gpu"}
    compare = data["comparison"]
    assert compare["stock"]["ran"] == "stock" and compare["stock"]["decode_tok_s"] > 0
    # every layer on the CPU: one split, except that a CUDA build takes the one-token step's
    # wide ops (qwen4exp has some) onto the GPU (op offload), as in test_ple_provider
    if machine.probe().gpu_offload:
        assert compare["stock"]["graph_splits"] > 1
    else:
        assert compare["stock"]["graph_splits"] == 1
    assert compare["gpu"]["decode_tok_s"] > 0 and compare["gpu"]["decode_ratio"] > 0
    gpu_ple = data["ple"]["gpu"]["sections"]["ple"]
    assert gpu_ple["mode"] == compare["gpu"]["ran"]
    if gpu_ple["mode"] == "stock":  # a CPU build: the reason is said
        assert "CUDA" in gpu_ple["reason"] or "GPU" in gpu_ple["reason"], gpu_ple
    assert len(compare["lines"]) == 2 and compare["lines"][1].startswith("gpu")
