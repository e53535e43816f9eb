"""One total contract for a turn, on the real engine (SmolLM2) and a real SQLite store: every
path ends in exactly one final event (engine) or message (app), the user's message is stored or
handed back, and the reply shows what was generated.

Paths: success, cancel, the context limit, a user error, an engine failure mid-reply, a store
that refuses the start of a turn or the reply as it streams, an unexpected exception.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from pathlib import Path

import pytest

from velo_chat.app.engine_host import EngineHost
from velo_chat.app.generation import TurnRequest, run_turn
from velo_chat.app.messages import TurnAccepted, TurnEnded, TurnRejected
from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.engine import Engine, PromptTooLong
from velo_chat.engine.events import TokenDelta, TurnDone, TurnFailed
from velo_chat.store import SessionStore
from velo_chat.engine.diagnostics import diagnostics

from tests.support.engine_helpers import run_cli, test_profile
from devkit.fake_engine import FakeFactory, FakeScript

FINAL = (TurnDone, TurnFailed)


def finals(events) -> list:
    return [e for e in events if isinstance(e, FINAL)]


@pytest.fixture
def engine(smollm2_path: Path, tmp_path: Path):
    with Engine(test_profile(smollm2_path, context={"n_ctx": 256}), checkpoint_root=tmp_path / "ckpt") as e:
        e.load()
        yield e


# -- the engine ---------------------------------------------------------------------------------


def test_the_context_limit_keeps_the_reply_and_the_live_state(engine: Engine):
    n_ctx = engine._ctx.n_ctx
    question = [ChatMessage("user", "Count from one upwards, in words: " + "one two " * 40)]
    prompt = len(diagnostics(engine).tokens_for(question))
    assert prompt < n_ctx - 20
    events = list(diagnostics(engine).turn(question, max_tokens=4 * n_ctx, ignore_eos=True))
    assert len(finals(events)) == 1 and events[-1] is finals(events)[0]
    done = events[-1]
    assert isinstance(done, TurnDone), done
    assert done.stats.finish_reason == "context"
    assert done.text and done.stats.decode_tokens == n_ctx - prompt  # the last one not decoded
    assert len(list(engine._live.tokens)) == n_ctx - 1  # the state is kept, not cleared
    with pytest.raises(PromptTooLong):  # the follow-up does not fit: a user error, at once
        engine.turn([*question, ChatMessage("assistant", done.text), ChatMessage("user", "and more")])


def test_an_engine_fault_mid_reply_is_one_turn_failed_with_the_text(engine: Engine, monkeypatch):
    question = [ChatMessage("user", "Name three colours.")]
    clean = diagnostics(engine).complete(question, max_tokens=8)
    diagnostics(engine).reset()
    real = engine._model.token_bytes
    calls = [0]

    def flaky(token: int, **kw) -> bytes:
        calls[0] += 1
        if calls[0] == 4:
            raise RuntimeError("injected fault")
        return real(token, **kw)

    monkeypatch.setattr(engine._model, "token_bytes", flaky)
    events = list(engine.turn(question, max_tokens=8))
    assert len(finals(events)) == 1 and isinstance(events[-1], TurnFailed)
    failed = events[-1]
    assert "RuntimeError: injected fault" in failed.reason
    streamed = "".join(e.text for e in events if isinstance(e, TokenDelta))
    assert failed.text == streamed and clean.text.startswith(failed.text)
    assert list(engine._live.tokens) == []  # unknown state: the next turn starts cold
    monkeypatch.undo()
    again = diagnostics(engine).complete(question, max_tokens=8)
    assert again.text == clean.text


def test_cancel_is_one_turn_done_marked_cancelled(engine: Engine):
    cancel = threading.Event()
    events = []
    for event in engine.turn([ChatMessage("user", "Tell me a story.")], max_tokens=50, cancel=cancel):
        events.append(event)
        if isinstance(event, TokenDelta):
            cancel.set()
    assert len(finals(events)) == 1 and isinstance(events[-1], TurnDone)
    assert events[-1].stats.finish_reason == "cancelled" and events[-1].stats.decode_tokens == 1


# -- the app's worker (generation.run_turn) -----------------------------------------------------


class Recorder:
    def __init__(self, on_accepted=None) -> None:
        self.messages: list = []
        self.on_accepted = on_accepted

    def __call__(self, message) -> None:
        self.messages.append(message)
        if isinstance(message, TurnAccepted) and self.on_accepted:
            self.on_accepted()

    def final(self):
        last = [m for m in self.messages if isinstance(m, (TurnEnded, TurnRejected))]
        assert len(last) == 1, self.messages
        return last[0]


def host_for(engine) -> EngineHost:
    host = EngineHost(lambda _p: engine)
    host.engine = engine
    return host


def request(engine, text: str, session=None) -> TurnRequest:
    profile = engine.profile  # replies of at most 8 tokens
    profile = dataclasses.replace(profile, sampling=dataclasses.replace(profile.sampling, max_tokens=8))
    return TurnRequest(text, session, profile)


def turn(host, store, req, post) -> None:
    run_turn(host, store, req, post, threading.Event(), lambda: False)


def hold_write_lock(db: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def test_success_stores_both_and_ends_once(engine: Engine, tmp_path: Path):
    with SessionStore(tmp_path / "s.db") as store:
        post = Recorder()
        turn(host_for(engine), store, request(engine, "Say hi."), post)
        end = post.final()
        assert isinstance(end, TurnEnded) and end.saved and end.failed is None
        stored = store.messages(store.list_sessions()[0].id)
        assert [m.content for m in stored] == ["Say hi.", end.text]
        assert stored[-1].status == "complete"


def test_a_store_that_refuses_the_start_stores_nothing_and_gives_the_text_back(
    engine: Engine, tmp_path: Path
):
    db = tmp_path / "s.db"
    with SessionStore(db, busy_timeout_s=0.05) as store:
        post = Recorder()
        turn(host_for(engine), store, request(engine, "first"), post)
        session = store.list_sessions()[0]
        for target in (None, session):  # a new session, and an existing one
            holder = hold_write_lock(db)
            try:
                post = Recorder()
                turn(host_for(engine), store, request(engine, "refused", target), post)
            finally:
                holder.execute("ROLLBACK")
                holder.close()
            end = post.final()
            assert isinstance(end, TurnRejected) and end.text == "refused"
            assert "locked" in end.reason
        assert [s.id for s in store.list_sessions()] == [session.id]  # no empty session left
        assert [m.content for m in store.messages(session.id)][0] == "first"
        assert len(store.messages(session.id)) == 2


def test_a_store_that_refuses_the_reply_still_shows_all_of_it(engine: Engine, tmp_path: Path):
    db = tmp_path / "s.db"
    with SessionStore(db, busy_timeout_s=0.05) as store:
        held: list[sqlite3.Connection] = []
        post = Recorder(on_accepted=lambda: held.append(hold_write_lock(db)))
        try:
            turn(host_for(engine), store, request(engine, "Name a fruit."), post)
        finally:
            for holder in held:
                holder.execute("ROLLBACK")
                holder.close()
        end = post.final()
        assert isinstance(end, TurnEnded) and not end.saved and "locked" in end.save_error
        assert end.stats is not None and end.stats.decode_tokens > 0 and end.text
        stored = store.messages(store.list_sessions()[0].id)
        assert stored[0].content == "Name a fruit."  # the question is safe
        assert stored[-1].status == "interrupted" and len(stored[-1].content) < len(end.text)


def test_a_user_error_is_rejected_with_the_text(engine: Engine, tmp_path: Path):
    with SessionStore(tmp_path / "s.db") as store:
        post = Recorder()
        turn(host_for(engine), store, request(engine, "word " * 400), post)
        end = post.final()
        assert isinstance(end, TurnRejected) and "context holds" in end.reason
        assert end.text == "word " * 400 and store.list_sessions() == []


def test_an_unexpected_exception_at_the_start_is_rejected_with_the_text(tmp_path: Path):
    factory = FakeFactory(FakeScript(turn_error=KeyError("surprise")))
    fake = factory(test_profile(Path("/nonexistent.gguf")))
    fake.load()
    with SessionStore(tmp_path / "s.db") as store:
        post = Recorder()
        turn(host_for(fake), store, request(fake, "keep me"), post)
        end = post.final()
        assert isinstance(end, TurnRejected) and end.text == "keep me"
        assert "KeyError" in end.reason and store.list_sessions() == []


# -- the CLI ------------------------------------------------------------------------------------


def test_cli_context_limit_keeps_the_reply_and_says_why(velo_home, smol_engine):
    profiles = velo_home / "config" / "profiles"
    profiles.mkdir(parents=True)
    (profiles / "tight.toml").write_text(
        "[context]\nn_ctx = 256\nn_threads = 2\n[sampling]\ntemperature = 0.0\n"
    )
    words = 1
    while True:  # a prompt that leaves a few tokens of room (same model, same template)
        prompt = "List every number you know, in words: " + "one two " * words
        if len(diagnostics(smol_engine).tokens_for([ChatMessage("user", prompt)])) >= 256 - 6:
            break
        words += 1
    proc = run_cli("ask", prompt, "--profile", "tight", "--json", "--max-tokens", "200")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["stats"]["finish_reason"] == "context" and out["text"]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "end of the context" in lines[0]
    with SessionStore(velo_home / "data" / "sessions.sqlite3") as store:
        stored = store.messages(out["session_id"])
    assert [m.status for m in stored] == ["complete", "complete"]
    assert stored[-1].content == out["text"]
