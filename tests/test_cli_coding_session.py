"""`velo-chat ask` in a coding session, through the real CLI in subprocesses: attaching files,
revising any earlier message in a fork, importing an older export, and two processes taking
turns in one session.

Refusals follow the CLI's rule: exit 2, one line on stderr, nothing stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.support.engine_helpers import pythonpath, run_cli
from tests.test_cli import assert_user_error, message_count, session_count

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "app" / "load_rate.py"  # a real source file of this repository


def ask_json(*args: str, cwd: Path | None = None) -> dict:
    proc = run_in(cwd, "ask", *args, "--json", "--max-tokens", "24")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def run_in(cwd: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    if cwd is None:
        return run_cli(*args)
    return subprocess.run(
        [sys.executable, "-m", "velo_chat.app.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": pythonpath(REPO)},
        timeout=300,
    )


def attachments(home: Path) -> list[tuple[str, str, int, str]]:
    with sqlite3.connect(home / "data" / "sessions.sqlite3") as conn:
        return conn.execute("SELECT path, sha256, size, content FROM attachments ORDER BY id").fetchall()


def test_a_file_is_attached_stored_apart_and_reused_by_the_follow_up(velo_home, tmp_path):
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "load_rate.py").write_bytes(SOURCE.read_bytes())
    first = ask_json("-f", "src/load_rate.py", "What does LoadRate measure?", cwd=work)
    (path, sha, size, content), *rest = attachments(velo_home)
    assert not rest
    data = SOURCE.read_bytes()
    assert (path, sha, size, content) == (
        "src/load_rate.py",
        hashlib.sha256(data).hexdigest(),
        len(data),
        data.decode(),
    )
    export = json.loads(run_cli("sessions", "export", first["session_id"], "--format", "json").stdout)
    assert export["version"] == 5
    question = export["messages"][0]
    assert question["content"] == "What does LoadRate measure?"  # the typed text, apart from the file
    assert [a["path"] for a in question["attachments"]] == ["src/load_rate.py"]
    # The file is part of the prompt: the follow-up, in a new process, reuses all of it.
    follow = ask_json("--session", first["session_id"], "And why?", cwd=work)
    assert follow["stats"]["cached_tokens"] >= first["stats"]["prompt_tokens"]
    assert first["stats"]["prompt_tokens"] > 300
    found = run_cli("sessions", "search", "load_rate").stdout
    assert first["session_id"][:8] in found


def test_refused_files_store_nothing(velo_home, tmp_path):
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"ELF\x00\x01\x02text")
    assert_user_error(run_cli("ask", "-f", str(binary), "hi"), "binary", "blob.bin")
    assert_user_error(run_cli("ask", "--file", str(tmp_path / "missing.py"), "hi"), "no such file")
    many = tmp_path / "many"
    many.mkdir()
    for i in range(60):
        (many / f"m{i}.py").write_text(f"x = {i}\n")
    assert_user_error(run_cli("ask", "-f", str(many / "*.py"), "hi"), "60 files", "at most 50")
    big = tmp_path / "big.py"
    big.write_text("".join(f"value_{i} = compute({i}, {i * 3})  # step {i}\n" for i in range(2000)))
    proc = run_cli("ask", "-f", str(big), "hi")
    assert_user_error(proc, "tokens but the context has room for")
    assert session_count(velo_home) == 0 and message_count(velo_home) == 0


def session_export(sid: str) -> dict:
    """A session's export without the time it was made."""
    data = json.loads(run_cli("sessions", "export", sid, "--format", "json").stdout)
    del data["exported_at"]
    return data


def test_edit_and_regenerate_any_message_fork_and_keep_the_session(velo_home):
    first = ask_json("Name a fruit.")
    sid = first["session_id"]
    ask_json("Name a colour.", "--session", sid)
    ask_json("Name a city.", "--session", sid)
    before = session_export(sid)
    edit = ask_json("Name an animal.", "--session", sid, "--edit", "2")
    assert edit["session_id"] != sid
    # The fork holds the messages before message 2, and resumes from the checkpoint there.
    assert edit["stats"]["cached_tokens"] >= first["stats"]["prompt_tokens"]
    fork = json.loads(run_cli("sessions", "export", edit["session_id"], "--format", "json").stdout)
    assert [m["content"] for m in fork["messages"] if m["role"] == "user"] == [
        "Name a fruit.",
        "Name an animal.",
    ]
    assert fork["session"]["parent_session_id"] == sid
    regen = ask_json("--session", sid, "--regenerate", "1")
    again = json.loads(run_cli("sessions", "export", regen["session_id"], "--format", "json").stdout)
    assert [m["content"] for m in again["messages"] if m["role"] == "user"] == ["Name a fruit."]
    assert again["messages"][1]["content"] == first["text"]  # greedy: the same answer again
    assert session_export(sid) == before  # the session is untouched
    assert_user_error(run_cli("ask", "--session", sid, "--edit", "1", "x"), "not yours")
    assert_user_error(run_cli("ask", "--session", sid, "--regenerate", "0"), "not a reply")
    assert_user_error(run_cli("ask", "--session", sid, "--edit", "40", "x"), "no message 40")


def test_an_older_export_still_imports(velo_home, tmp_path):
    old = {
        "format": "velo-chat.session",
        "version": 2,
        "exported_at": 1.0,
        "session": {
            "title": "Old",
            "created_at": 1.0,
            "updated_at": 2.0,
            "profile": "default",
            "system_prompt": "",
        },
        "messages": [
            {"position": 0, "role": "user", "content": "Hi", "status": "complete", "created_at": 1.0},
            {
                "position": 1,
                "role": "assistant",
                "content": "Hello.",
                "reasoning": "",
                "status": "complete",
                "created_at": 2.0,
            },
        ],
    }
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    proc = run_cli("sessions", "import", str(path))
    assert proc.returncode == 0, proc.stderr
    sid = proc.stdout.strip()
    data = json.loads(run_cli("sessions", "export", sid, "--format", "json").stdout)
    assert [m["content"] for m in data["messages"]] == ["Hi", "Hello."]
    assert all(m["attachments"] == [] for m in data["messages"])


def test_two_processes_on_one_session_take_turns(velo_home):
    sid = ask_json("Name a fruit.")["session_id"]
    cmd = [sys.executable, "-m", "velo_chat.app.cli", "ask", "--session", sid, "--max-tokens", "16", "--json"]
    procs = [
        subprocess.Popen([*cmd, q], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for q in ("Name a colour.", "Name a city.")
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    exported = json.loads(run_cli("sessions", "export", sid, "--format", "json").stdout)
    messages = exported["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3  # never interleaved
    assert {m["content"] for m in messages if m["role"] == "user"} == {
        "Name a fruit.",
        "Name a colour.",
        "Name a city.",
    }
    assert all(m["status"] == "complete" and m["content"].strip() for m in messages)
    # each reply answers its own question: it is the one stored right after it
    by_question = {json.loads(out)["text"] for out, _ in outs}
    assert by_question <= {m["content"] for m in messages if m["role"] == "assistant"}
