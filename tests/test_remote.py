"""The remote backend against real servers: llama-cpp-python's own OpenAI-compatible server on
SmolLM2 (started and stopped here, on a free port), and a small misbehaving server of ours for
the faults a user meets. Every fault gives one line (CLI) or a dialog (TUI) and loses nothing."""

from __future__ import annotations

import asyncio
import json
import re
import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.config import locations
from velo_chat.engine.config.profiles import build_profile
from velo_chat.engine.events import PrefillProgress, TokenDelta, TurnDone
from velo_chat.engine.remote.engine import RemoteEngine
from velo_chat.store import SessionStore

from tests.support.engine_helpers import pythonpath, run_cli
from tests.support.openai_faults import MODEL, FaultServer, free_port

pytest.importorskip("openai")
KEY_ENV = "VELO_TEST_REMOTE_KEY"
SECRET = "sk-velo-test-5f1c2b9e-never-write-me"


def remote_profile(name: str, base_url: str, **backend) -> str:
    """Write a user profile pointing at `base_url`; returns its name."""
    lines = [
        "[backend]",
        'kind = "remote"',
        f'base_url = "{base_url}"',
        *(f"{k} = {json.dumps(v)}" for k, v in backend.items()),
        "[sampling]",
        "temperature = 0.0",
        "max_tokens = 16",
    ]
    folder = locations.user_profiles_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return name


@pytest.fixture(scope="module")
def llama_server(smollm2_path: Path) -> Iterator[str]:
    """`python -m llama_cpp.server` on SmolLM2, model alias "smol", on a free port."""
    pytest.importorskip("llama_cpp.server.app")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(smollm2_path),
            "--model_alias",
            "smol",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_threads",
            "1",
            "--n_ctx",
            "2048",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
            if proc.poll() is not None:
                pytest.fail("llama_cpp.server exited at start")
        else:
            pytest.fail("llama_cpp.server did not start in 120 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def faults() -> Iterator[FaultServer]:
    with FaultServer() as server:
        yield server


async def until(cond, timeout: float = 60.0) -> None:
    """Wait for a condition of the app under test (a real server answers in its own time)."""
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def remote_app(profile, tmp_path: Path):
    from velo_chat.app.app import make_app
    from velo_chat.app.settings import AppSettings

    store = SessionStore(tmp_path / "sessions.db")
    return make_app(profile, store=store, settings=AppSettings(), memory_interval=None, cursor_blink=False)


async def send_when_ready(app, pilot, text: str):
    """Once the model is ready, type `text` into the composer and press Enter; the chat screen."""
    from velo_chat.app.screens.chat import ChatScreen
    from velo_chat.app.widgets.composer.composer import Composer

    screen = next(s for s in app.screen_stack if isinstance(s, ChatScreen))
    await until(lambda: screen.model_ready)
    screen.query_one(Composer).load_text(text)
    await pilot.press("enter")
    return screen


def ask_json(profile: str, *args: str) -> dict:
    proc = run_cli("ask", "--profile", profile, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def stored(home: Path) -> list[tuple[str, str, str]]:
    db = locations.database_path()
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT role, content, status FROM messages ORDER BY session_id, position"
        ).fetchall()


# -- a real server ------------------------------------------------------------------------------


def test_ask_streams_from_a_real_server_and_records_the_backend(llama_server, isolated_home):
    name = remote_profile("smol-remote", llama_server, model="smol")
    first = ask_json(name, "Name a colour.")
    stats = first["stats"]
    assert first["text"].strip() and stats["backend"] == "remote"
    assert stats["decode_tokens"] > 1 and stats["ttft_s"] > 0 and stats["decode_tok_s"] > 0
    assert stats["server"]["client_tok_s"] > 0
    session = first["session_id"]
    follow = ask_json(name, "--session", session, "And another?")
    again = ask_json(name, "--session", session, "--regenerate")
    assert follow["session_id"] == session and again["session_id"] != session  # a fork
    with sqlite3.connect(locations.database_path()) as conn:

        def rows_of(sid: str) -> list[tuple[str, str, str]]:
            return conn.execute(
                "SELECT role, content, status FROM messages WHERE session_id = ? ORDER BY position", (sid,)
            ).fetchall()

        original, fork = rows_of(session), rows_of(again["session_id"])
    for rows in (original, fork):
        assert [(r[0], r[2]) for r in rows] == [("user", "complete"), ("assistant", "complete")] * 2
        assert rows[0][1] == "Name a colour." and rows[2][1] == "And another?"
    assert original[3][1] == follow["text"] and fork[3][1] == again["text"]  # the session keeps its reply


def test_bench_reports_the_same_sections_for_a_remote_server(llama_server):
    name = remote_profile("smol-bench", llama_server, model="smol")
    proc = run_cli(
        "bench",
        "--profile",
        name,
        "--json",
        "--prefill-sizes",
        "64",
        "--decode-tokens",
        "8",
        "--repeats",
        "1",
        "--no-resume",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["architecture"] == "remote"
    assert [row["tokens"] for row in result["prefill"]] == [64] and result["prefill"][0]["ttft_s"] > 0
    assert result["decode"]["tokens"] == 8 and result["decode"]["tok_s"] > 0


def test_cancel_closes_the_stream_and_keeps_the_partial_reply(llama_server):
    profile = build_profile("r", {"backend": {"kind": "remote", "base_url": llama_server, "model": "smol"}})
    with RemoteEngine(profile) as engine:
        engine.load()
        turn = engine.turn([ChatMessage("user", "Count from one to fifty in words.")], max_tokens=200)
        deltas = []
        for event in turn:
            if isinstance(event, TokenDelta):
                deltas.append(event.text)
                if len(deltas) == 3:
                    turn.cancel()
            if isinstance(event, TurnDone):
                done = event
        assert done.stats.finish_reason == "cancelled"
        assert done.text == "".join(deltas) and len(deltas) == 3
        # the server is free again at once: a new turn streams
        second = [e for e in engine.turn([ChatMessage("user", "Hi")], max_tokens=4)]
        assert isinstance(second[-1], TurnDone) and second[-1].text


async def test_the_live_panel_shows_what_a_real_server_streamed(llama_server, tmp_path):
    profile = build_profile(
        "r",
        {
            "backend": {"kind": "remote", "base_url": llama_server, "model": "smol"},
            "sampling": {"temperature": 0.0, "max_tokens": 12},
        },
    )
    app = remote_app(profile, tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await send_when_ready(app, pilot, "Say hello.")
        await until(lambda: screen.session is not None and not screen.busy)
        await pilot.pause()
        reply = app.store.messages(screen.session.id)[-1]
        assert reply.status == "complete" and reply.content and reply.stats["backend"] == "remote"
        decode = str(screen.query_one("#panel-decode").render())
        avg = float(re.search(r"avg ([\d,.]+)", decode).group(1).replace(",", ""))
        # the final rate, as stored, to the panel's rounding: one decimal below 1,000 tok/s,
        # none above (a fast machine streams 12 tokens at more than that)
        stored = reply.stats["decode_tok_s"]
        assert abs(avg - stored) <= (0.05 if stored < 1000 else 0.5) + 0.01
        context = str(screen.query_one("#panel-context").render())
        assert f"cached {reply.stats['cached_tokens']:,}" in context


# -- faults -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault, expected",
    [
        ("401", "refused the API key (401)"),
        ("403", "denied access (403)"),
        ("nomodel", f"has no model {MODEL!r}"),
        ("404", "(404)"),
        ("500", "failed (500) (after 1 retries)"),
    ],
)
def test_a_server_that_refuses_gives_one_line_and_stores_nothing(faults, isolated_home, fault, expected):
    name = remote_profile(f"f{fault}", faults.url(fault), model=MODEL, max_retries=1)
    proc = run_cli("ask", "--profile", name, "Hello there")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in proc.stderr
    assert not locations.database_path().exists() or stored(isolated_home) == []


def test_unreachable_servers_say_why(isolated_home):
    for url, expected in [
        (f"http://127.0.0.1:{free_port()}/v1", "connection refused by 127.0.0.1"),
        (
            "http://no-such-host.invalid/v1",
            "cannot resolve the server's host name 'no-such-host.invalid' (DNS)",
        ),
    ]:
        name = remote_profile("down", url, max_retries=0)
        proc = run_cli("ask", "--profile", name, "Hello")
        assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_tls_to_a_plain_server_is_a_tls_error(faults):
    name = remote_profile("tls", faults.url("ok").replace("http://", "https://"), max_retries=0)
    proc = run_cli("ask", "--profile", name, "Hello")
    assert proc.returncode == 2 and "TLS error talking to 127.0.0.1" in proc.stderr, proc.stderr


def test_429_is_retried_with_backoff_then_streams(faults, isolated_home):
    before = faults.calls["429then"]
    out = ask_json(remote_profile("busy", faults.url("429then"), model=MODEL, max_retries=3), "Hello")
    assert out["text"] == "Hello from the fake server."
    assert faults.calls["429then"] - before == 3  # two refusals, then the stream


@pytest.mark.parametrize("fault", ["cut", "garbage"])
def test_a_broken_stream_keeps_the_partial_reply_marked_interrupted(faults, isolated_home, fault):
    name = remote_profile(f"b{fault}", faults.url(fault), model=MODEL, max_retries=0)
    proc = run_cli("ask", "--profile", name, "Hello")
    assert proc.returncode == 2
    assert proc.stdout == "Hello from the\n"  # streamed before the break, not lost
    assert "the reply was cut" in proc.stderr and "Traceback" not in proc.stderr
    assert stored(isolated_home) == [
        ("user", "Hello", "complete"),
        ("assistant", "Hello from the", "interrupted"),
    ]


def test_what_llama_server_reports_becomes_the_turns_stats(faults, isolated_home):
    """Prefill progress, `timings` and the usage chunk: cached tokens (the server's prompt
    cache), the server's own rates and its speculation counts."""
    profile = build_profile(
        "r", {"backend": {"kind": "remote", "base_url": faults.url("llamacpp"), "model": MODEL}}
    )
    with RemoteEngine(profile) as engine:
        engine.load()
        events = list(engine.turn([ChatMessage("user", "Hello")]))
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    assert [(p.done, p.total) for p in progress] == [(5, 5)]
    stats = events[-1].stats
    assert (stats.prompt_tokens, stats.cached_tokens, stats.prefill_tokens) == (17, 12, 5)
    assert (stats.prefill_tok_s, stats.decode_tok_s, stats.decode_tokens) == (1250.0, 100.0, 6)
    assert stats.source == "server" and stats.backend == "remote"
    assert stats.server.draft_n == 4 and stats.server.draft_n_accepted == 3
    out = ask_json(remote_profile("lcpp", faults.url("llamacpp"), model=MODEL), "Hello")
    assert out["stats"]["cached_tokens"] == 12 and out["stats"]["server"]["cache_n"] == 12


def test_without_the_openai_package_a_remote_profile_says_which_extra(faults, tmp_path):
    """The `remote` extra not installed: one line naming it, exit 2."""
    shim = tmp_path / "shim" / "openai"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('openai is not installed')\n")
    name = remote_profile("noextra", faults.url("ok"), model=MODEL)
    proc = run_cli("ask", "--profile", name, "Hello", env={"PYTHONPATH": pythonpath(shim.parent)})
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "velo-chat: error: a remote backend needs the openai package: pip install 'velo-chat[remote]'"
    )


def test_the_api_key_is_sent_but_never_written(faults, isolated_home, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    name = remote_profile("keyed", faults.url("ok"), model=MODEL, api_key_env=KEY_ENV)
    out = ask_json(name, "Hello")
    assert (
        run_cli("sessions", "export", out["session_id"], "-o", str(isolated_home / "export.json")).returncode
        == 0
    )
    sent = [{k.lower(): v for k, v in h.items()} for h in faults.headers]
    assert any(h.get("authorization") == f"Bearer {SECRET}" for h in sent)
    written = [p for p in isolated_home.rglob("*") if p.is_file()]
    assert written and all(SECRET.encode() not in p.read_bytes() for p in written)


def test_a_key_variable_that_is_not_set_is_one_line(faults):
    os.environ.pop("VELO_TEST_UNSET_KEY", None)
    name = remote_profile("nokey", faults.url("ok"), model=MODEL, api_key_env="VELO_TEST_UNSET_KEY")
    proc = run_cli("ask", "--profile", name, "Hello")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "velo-chat: error: the environment variable VELO_TEST_UNSET_KEY (backend.api_key_env) is not set"
    )


async def test_a_refused_turn_in_the_tui_is_a_dialog_and_the_text_stays(faults, tmp_path):
    from velo_chat.app.dialogs.message import MessageDialog
    from velo_chat.app.widgets.composer.composer import Composer

    profile = build_profile(
        "r",
        {"backend": {"kind": "remote", "base_url": faults.url("500"), "model": MODEL, "max_retries": 0}},
    )
    app = remote_app(profile, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await send_when_ready(app, pilot, "keep this text")
        await until(lambda: isinstance(app.screen, MessageDialog))
        assert "failed (500)" in app.screen.body
        assert screen.query_one(Composer).text == "keep this text"
        assert app.store.list_sessions() == []
