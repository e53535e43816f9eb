"""A full context on the command line, through the real CLI in subprocesses (docs/compaction.md):
`ask` into a full session under each `context.when_full` policy, `ask --pin`, and
`sessions compact ID [--focus TEXT]`.

Every `ask` is a new process, so a turn after a compaction resumes from the checkpoints the
compacting process left on disk. The profile is the default one (SmolLM2) with a 1,024-token
context that acts at 60% full.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.engine_helpers import pythonpath, run_cli
from tests.test_cli import assert_user_error, message_count, session_count

REPO = Path(__file__).resolve().parents[1]
LONG = (
    "We are porting the scheduler to the new queue. The worker pool drains the queue in order, "
    "retries a failed job twice and then parks it. "
) * 3
SOURCE = "def area(r):\n    return 3.14159 * r * r\n"


def profile(home: Path, name: str, when_full: str) -> str:
    folder = home / "config" / "profiles"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text(
        "[context]\nn_ctx = 1024\nn_batch = 256\nn_ubatch = 64\ncompact_at = 0.6\n"
        f'when_full = "{when_full}"\n'
    )
    return name


def ask(*args: str, cwd: Path | None = None) -> tuple[dict, list[str]]:
    """One `ask --json` (short replies); its JSON and its stderr lines."""
    command = [sys.executable, "-m", "velo_chat.app.cli", "ask", *args, "--json", "--max-tokens", "24"]
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={
            **os.environ,
            "PYTHONPATH": pythonpath(REPO),
        },
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr.strip().splitlines()


def export(session_id: str) -> dict:
    proc = run_cli("sessions", "export", session_id, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    del data["exported_at"]
    return data


def reuse(stats: dict) -> float:
    return stats["cached_tokens"] / stats["prompt_tokens"]


def until(line_part: str, session_id: str) -> tuple[dict, list[str], dict]:
    """Long turns into `session_id` until one says `line_part` on stderr: that turn's JSON and
    stderr, and the session's export just before it."""
    for _ in range(12):
        before = export(session_id)
        out, err = ask("--session", session_id, LONG)
        if any(line_part in line for line in err):
            return out, err, before
        assert out["session_id"] == session_id and "compacted_from" not in out
    raise AssertionError(f"no turn said {line_part!r}")


def test_ask_into_a_full_session_compacts_it_into_a_continuation(velo_home: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "geometry.py").write_text(SOURCE)
    first, _ = ask("--profile", profile(velo_home, "tiny", "compact"), "--pin", "geometry.py", LONG, cwd=work)
    sid = first["session_id"]
    assert export(sid)["messages"][0]["attachments"][0]["pinned"] is True
    out, err, before = until("compacting session", sid)
    cont = out["session_id"]
    assert out["compacted_from"] == sid and cont != sid
    [line] = [x for x in err if "full" in x]
    assert line.startswith("velo-chat: the context is ")
    assert line.endswith(f"% full: compacting session {sid[:8]} into a continuation ...")
    assert any(f"session {cont[:8]}, which continues {sid[:8]}" in x for x in err)
    assert export(sid) == before  # the original holds every message, as it was
    doc = export(cont)
    assert doc["session"]["continues"] is True and doc["session"]["parent_session_id"] == sid
    request, summary = doc["messages"][0], doc["messages"][1]
    assert [(a["path"], a["pinned"]) for a in request["attachments"]] == [("geometry.py", True)]
    # the summary request reused the history the last turn left (in this new process: from disk)
    last = before["messages"][-1]
    assert summary["stats"]["cached_tokens"] >= 0.95 * (last["prompt_tokens"] + last["completion_tokens"])
    assert summary["content"].strip()
    follow, _ = ask("--session", cont, "What next?")
    assert follow["session_id"] == cont and "compacted_from" not in follow
    assert reuse(follow["stats"]) >= 0.9, follow["stats"]
    listed = run_cli("sessions", "list").stdout
    assert "(continued)" in listed


def test_ask_into_a_full_session_drops_its_oldest_turns(velo_home: Path) -> None:
    first, _ = ask("--profile", profile(velo_home, "tinydrop", "drop_oldest"), LONG)
    sid = first["session_id"]
    out, err, before = until("dropping the oldest turns", sid)
    assert out["session_id"] == sid and "compacted_from" not in out
    [line] = [x for x in err if "full" in x]
    assert line.endswith(f"% full: dropping the oldest turns of session {sid[:8]} from the model's view ...")
    after = export(sid)
    assert after["messages"][: len(before["messages"])] == before["messages"]  # nothing lost
    assert after["session"]["view_start"] > 0
    assert after["messages"][after["session"]["view_start"]]["role"] == "user"
    shown = run_cli("sessions", "show", sid).stdout
    assert "the model's view begins here" in shown
    follow, _ = ask("--session", sid, "What next?")
    assert reuse(follow["stats"]) >= 0.9, follow["stats"]
    assert export(sid)["session"]["view_start"] == after["session"]["view_start"]


def test_ask_into_a_full_session_under_refuse_is_refused_in_one_line(velo_home: Path) -> None:
    first, _ = ask("--profile", profile(velo_home, "tinyrefuse", "refuse"), LONG)
    sid = first["session_id"]
    for _ in range(2):
        out, err = ask("--session", sid, LONG)
        assert not any("full" in line for line in err)  # below the context: no policy acts
    messages = message_count(velo_home)
    proc = run_cli("ask", "--session", sid, LONG * 7, "--max-tokens", "24")
    assert_user_error(proc, "context holds 1,024", 'context.when_full is "refuse"')
    assert message_count(velo_home) == messages and session_count(velo_home) == 1


def test_sessions_compact_prints_the_continuation_which_resumes_from_disk(velo_home: Path) -> None:
    first, _ = ask("--profile", profile(velo_home, "tiny", "compact"), LONG)
    sid = first["session_id"]
    for _ in range(2):
        ask("--session", sid, LONG)
    before = export(sid)
    proc = run_cli("sessions", "compact", sid[:8], "--focus", "the retries")
    assert proc.returncode == 0, proc.stderr
    [cont] = proc.stdout.split()
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"velo-chat: session {cont[:8]} continues {sid[:8]}: a summary of ")
    assert "the summary turn reused" in line
    assert export(sid) == before
    doc = export(cont)
    assert doc["messages"][0]["content"].endswith("\n\nFocus on: the retries")
    assert doc["session"]["continues"] and doc["session"]["parent_session_id"] == sid
    # the continuation's prefill was checkpointed at once: its first turn resumes from the disk
    follow, _ = ask("--session", cont, "What next?")
    assert follow["stats"]["checkpoint"]["source"] == "disk"
    assert reuse(follow["stats"]) >= 0.9, follow["stats"]
    assert_user_error(run_cli("sessions", "compact", "zzzz"), "no session id starts with")
