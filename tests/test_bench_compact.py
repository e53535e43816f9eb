"""`velo-chat bench --compact`: a conversation filled to `compact_at`, its summary turn warm
against cold, and the continuation's first follow-up (`engine/bench/compact.py`).

Real engine, the real SmolLM2 GGUF, a 1,024-token context so a run stays short on two cores. What
the section reuses is asserted (that is the engine's doing); its times and ratios are printed by
`bench`, never asserted here (they depend on the machine's load)."""

from __future__ import annotations

import json
from pathlib import Path

from velo_chat.engine.bench import BenchResult, format_table, run_compact_bench
from velo_chat.engine.engine import Engine

from tests.support.engine_helpers import run_cli, test_profile
from tests.test_cli import assert_user_error

KEYS = {
    "n_ctx",
    "compact_at",
    "history_tokens",
    "fill",
    "summary_prompt_tokens",
    "summary_cached_tokens",
    "summary_reused",
    "summary_tokens",
    "summary_ttft_s",
    "cold_ttft_s",
    "cold_over_summary",
    "continuation_messages",
    "continuation_prefill_tokens",
    "continuation_warm_s",
    "follow_up_prompt_tokens",
    "follow_up_cached_tokens",
    "follow_up_source",
    "follow_up_ttft_s",
}


def test_the_summary_turn_reuses_the_history_and_the_follow_up_the_continuation(
    smollm2_path: Path, tmp_path: Path
) -> None:
    profile = test_profile(smollm2_path, context={"n_ctx": 1024, "compact_at": 0.7})
    with Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine:
        engine.load()
        r = run_compact_bench(engine, reply_tokens=32, summary_tokens=32)
        assert set(r) == KEYS
        assert r["n_ctx"] == 1024 and 0.5 <= r["fill"] <= 0.72
        assert r["summary_reused"] >= 0.95  # only the request was prefilled
        assert r["summary_prompt_tokens"] - r["summary_cached_tokens"] < 0.15 * r["summary_prompt_tokens"]
        assert r["summary_tokens"] == 32 and r["continuation_prefill_tokens"] > 0
        assert r["follow_up_source"] == "live"
        # all of the continuation was reused: only the question (and its template tokens) is new
        assert r["follow_up_prompt_tokens"] - r["follow_up_cached_tokens"] <= 32
        result = BenchResult("m", "llama", "test", 1024, 2, False, "x86_64 Linux")
        result.sections["compaction"] = r
        table = format_table(result)
        assert "compact   a conversation of" in table and "cold/warm" in table


def test_bench_compact_on_the_command_line(velo_home: Path) -> None:
    profiles = velo_home / "config" / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "tiny.toml").write_text("[context]\nn_ctx = 1024\nn_batch = 256\nn_ubatch = 64\n")
    args = ("--prefill-sizes", "64", "--decode-tokens", "8", "--repeats", "1", "--no-resume")
    proc = run_cli("bench", "--profile", "tiny", "--compact", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    section = json.loads(proc.stdout)["sections"]["compaction"]
    assert set(section) == KEYS and section["summary_reused"] >= 0.95
    assert_user_error(run_cli("bench", "--compact", "--spec"), "--compact", "not with --spec")
