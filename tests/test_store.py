"""Session store tests: real SQLite files in tmp_path, real second processes for the faults."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest

from velo_chat.store import (
    FORMAT,
    FORMAT_VERSION,
    SNIPPET_CLOSE,
    SNIPPET_OPEN,
    AmbiguousId,
    IncompatibleStore,
    InvalidArgument,
    InvalidImport,
    MessageNotFound,
    SessionNotFound,
    SessionStore,
    StoreCorrupt,
    StoreError,
    make_title,
)
from velo_chat.store.migrations import LATEST_VERSION

from tests.support.store_helpers import delete_messages_after, needs_fts5


# -- schema -------------------------------------------------------------------------------------


def test_migrates_an_empty_file_and_reopens_idempotently(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.touch()
    with SessionStore(db_path) as s:
        session = s.create_session("fast")
        s.add_message(session.id, "user", "hello")
    with SessionStore(db_path) as s:
        assert [m.content for m in s.messages(session.id)] == ["hello"]
    raw = sqlite3.connect(db_path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"sessions", "messages"} <= tables
    assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_newer_schema_is_refused(db_path: Path) -> None:
    SessionStore(db_path).close()
    raw = sqlite3.connect(db_path)
    raw.execute(f"PRAGMA user_version = {LATEST_VERSION + 1}")
    raw.close()
    with pytest.raises(IncompatibleStore, match="newer"):
        SessionStore(db_path)


def test_not_a_database(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"this is not sqlite " * 200)
    with pytest.raises(StoreCorrupt, match="not a velo-chat session database"):
        SessionStore(db_path)


@needs_fts5
def test_fts_index_catches_up_after_a_run_without_fts(db_path: Path) -> None:
    with SessionStore(db_path) as s:
        session = s.create_session("fast")
        s.add_message(session.id, "user", "indexed quaternion")
    with SessionStore(db_path, use_fts=False) as s:  # a build without FTS5 writes meanwhile
        s.add_message(session.id, "user", "unindexed octonion")
        assert [h.message.content for h in s.search("octonion")] == ["unindexed octonion"]
    with SessionStore(db_path) as s:
        assert s.uses_fts
        assert [h.message.content for h in s.search("octonion")] == ["unindexed octonion"]
        assert [h.message.content for h in s.search("quaternion")] == ["indexed quaternion"]


# -- sessions -----------------------------------------------------------------------------------


def test_create_get_list_rename_update(store: SessionStore) -> None:
    a = store.create_session("fast", system_prompt="be brief", model_fingerprint="fp1")
    b = store.create_session("code-edit", title="  Refactor \n the parser ")
    assert store.get_session(a.id) == a
    assert b.title == "Refactor the parser"
    assert [s.id for s in store.list_sessions()] == [b.id, a.id]
    store.add_message(a.id, "user", "hi")
    assert [s.id for s in store.list_sessions()] == [a.id, b.id]
    assert [s.id for s in store.list_sessions(limit=1)] == [a.id]

    renamed = store.rename(b.id, "New name")
    assert renamed.title == "New name" and renamed.updated_at == b.updated_at
    with pytest.raises(InvalidArgument):
        store.rename(b.id, "   ")
    changed = store.update_session(a.id, profile="long-context", model_fingerprint="fp2")
    assert (changed.profile, changed.system_prompt, changed.model_fingerprint) == (
        "long-context",
        "be brief",
        "fp2",
    )
    with pytest.raises(InvalidArgument):
        store.create_session("")


def test_unknown_ids(store: SessionStore) -> None:
    for call in (
        lambda: store.get_session("nope"),
        lambda: store.messages("nope"),
        lambda: store.add_message("nope", "user", "x"),
        lambda: store.rename("nope", "x"),
        lambda: store.delete("nope"),
        lambda: store.export_json("nope"),
    ):
        with pytest.raises(SessionNotFound, match="nope"):
            call()
    with pytest.raises(MessageNotFound):
        store.update_message(12345, content="x")


def test_delete_cascades_messages(store: SessionStore, db_path: Path) -> None:
    keep = store.create_session("fast")
    gone = store.create_session("fast")
    store.add_message(keep.id, "user", "keep me")
    for text in ("one", "two", "three"):
        store.add_message(gone.id, "user", text)
    store.delete(gone.id)
    with pytest.raises(SessionNotFound):
        store.get_session(gone.id)
    raw = sqlite3.connect(db_path)
    assert raw.execute("SELECT session_id FROM messages").fetchall() == [(keep.id,)]
    assert store.search("two") == []
    assert [h.message.content for h in store.search("keep")] == ["keep me"]


def test_resolve_id_prefix(store: SessionStore) -> None:
    sessions = [store.create_session("fast")]
    while True:  # at most 17 sessions before two share a first hex digit
        firsts = [s.id[0] for s in sessions]
        shared = next((c for c in firsts if firsts.count(c) > 1), None)
        if shared:
            break
        sessions.append(store.create_session("fast"))
    one = sessions[0]
    assert store.resolve_id(one.id) == one.id
    assert store.resolve_id(one.id[:10].upper()) == one.id
    with pytest.raises(AmbiguousId, match="matches 2 sessions|matches \\d+ sessions"):
        store.resolve_id(shared)
    with pytest.raises(SessionNotFound):
        store.resolve_id("zz")
    with pytest.raises(InvalidArgument):
        store.resolve_id(" ")


# -- messages -----------------------------------------------------------------------------------


def test_title_rule(store: SessionStore) -> None:
    s = store.create_session("fast")
    store.add_message(s.id, "system", "You are helpful")
    assert store.get_session(s.id).title is None
    long = "\n  Please   explain why the checkpoint loader " + "rejects files " * 10 + "\nmore"
    store.add_message(s.id, "user", long)
    title = store.get_session(s.id).title
    assert title is not None and len(title) <= 60 and title.endswith("…")
    assert title.startswith("Please explain why the checkpoint loader rejects")
    store.add_message(s.id, "user", "second question")
    assert store.get_session(s.id).title == title
    titled = store.create_session("fast", title="Mine")
    store.add_message(titled.id, "user", "not the title")
    assert store.get_session(titled.id).title == "Mine"
    assert make_title(" \n\t ") is None
    assert make_title("short") == "short"


def test_streaming_reply_pattern(store: SessionStore) -> None:
    s = store.create_session("fast")
    user = store.add_message(s.id, "user", "Write a haiku", prompt_tokens=5)
    reply = store.add_message(s.id, "assistant", "", status="interrupted")
    assert (user.position, reply.position) == (0, 1)
    for partial in ("Autumn", "Autumn moon", "Autumn moonlight—"):
        store.update_message(reply.id, content=partial)
    done = store.update_message(
        reply.id,
        content="Autumn moonlight— a worm digs silently",
        status="complete",
        completion_tokens=9,
        stats={"ttft_s": 0.12, "decode_tok_s": 151.0, "checkpoint": {"source": "disk"}},
    )
    assert done.status == "complete" and done.completion_tokens == 9
    assert done.stats["checkpoint"] == {"source": "disk"}
    assert store.messages(s.id) == [user, done]
    assert store.get_message(reply.id) == done
    assert store.get_session(s.id).updated_at > s.updated_at
    with pytest.raises(InvalidArgument):
        store.add_message(s.id, "bot", "x")
    with pytest.raises(InvalidArgument):
        store.update_message(reply.id, status="finished")
    with pytest.raises(InvalidArgument):
        store.add_message(s.id, "user", "x", prompt_tokens=-1)


def test_delete_messages_after_for_regenerate(store: SessionStore) -> None:
    s = store.create_session("fast")
    for i, role in enumerate(["user", "assistant", "user", "assistant"]):
        store.add_message(s.id, role, f"m{i}")
    assert delete_messages_after(store, s.id, 2) == 1  # regenerate the last reply
    again = store.add_message(s.id, "assistant", "m3 again")
    assert again.position == 3
    assert delete_messages_after(store, s.id, 1) == 2  # edit the last user message
    assert [m.content for m in store.messages(s.id)] == ["m0", "m1"]
    assert delete_messages_after(store, s.id, 5) == 0


def test_unicode_content(store: SessionStore) -> None:
    s = store.create_session("fast")
    texts = [
        "Grüße, café naïve 😀",
        "日本語のテキスト",
        "עברית ← RTL",
        "e\u0301 combining",
        "tab\tnl\n",
    ]
    for text in texts:
        store.add_message(s.id, "user", text)
    assert [m.content for m in store.messages(s.id)] == texts
    assert store.get_session(s.id).title == "Grüße, café naïve 😀"
    assert [h.message.content for h in store.search("café")] == [texts[0]]
    assert [h.message.content for h in store.search("😀")] == [texts[0]]


def test_two_threads_share_one_store(store: SessionStore) -> None:
    s = store.create_session("fast")

    def write(tag: str) -> None:
        for i in range(40):
            store.add_message(s.id, "user", f"{tag}{i}")

    threads = [threading.Thread(target=write, args=(tag,)) for tag in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    positions = [m.position for m in store.messages(s.id)]
    assert positions == list(range(80))


def test_closed_store_raises(db_path: Path) -> None:
    s = SessionStore(db_path)
    s.close()
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.list_sessions()


# -- search -------------------------------------------------------------------------------------


def test_search(store: SessionStore) -> None:
    a = store.create_session("fast")
    b = store.create_session("fast")
    store.add_message(a.id, "user", "How do I fix the tokenizer crash?")
    store.add_message(a.id, "assistant", "Update the tokenizer and rebuild.\nThen rerun.")
    store.add_message(b.id, "user", "100% of tests pass, 1000 warnings_left")
    hits = store.search("tokenizer")
    assert {h.message.content for h in hits} == {
        "How do I fix the tokenizer crash?",
        "Update the tokenizer and rebuild.\nThen rerun.",
    }
    assert all(h.session.id == a.id for h in hits)
    assert all(f"{SNIPPET_OPEN}tokenizer{SNIPPET_CLOSE}" in h.snippet for h in hits)
    assert all("\n" not in h.snippet for h in hits)
    assert [h.message.role for h in store.search("tokenizer rebuild")] == ["assistant"]
    assert store.search("tokenizer", session_id=b.id) == []
    assert len(store.search("tokenizer", limit=1)) == 1
    assert [h.session.id for h in store.search("100%")] == [b.id]
    assert store.search("") == []
    for hostile in ['"unbalanced', "NEAR(a b", "a* OR -b", "%", "_", "\\"]:
        store.search(hostile)  # never a syntax error


# -- fork ---------------------------------------------------------------------------------------


def test_fork_shares_history_and_is_independent(store: SessionStore) -> None:
    parent = store.create_session("code-edit", system_prompt="sys", model_fingerprint="fp")
    msgs = [
        store.add_message(parent.id, role, text, stats={"i": i})
        for i, (role, text) in enumerate(
            [("user", "first question"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2")]
        )
    ]
    child = store.fork(parent.id, msgs[1].id)
    assert child.parent_session_id == parent.id and child.forked_from_message_id == msgs[1].id
    assert (child.profile, child.system_prompt, child.model_fingerprint) == (
        "code-edit",
        "sys",
        "fp",
    )
    assert child.title == "first question (fork)"
    copied = store.messages(child.id)
    assert [(m.role, m.content, m.stats, m.position) for m in copied] == [
        (m.role, m.content, m.stats, m.position) for m in msgs[:2]
    ]
    assert {m.id for m in copied}.isdisjoint(m.id for m in msgs)

    store.add_message(child.id, "user", "a different q2")
    store.update_message(msgs[0].id, content="edited in parent")
    assert [m.content for m in store.messages(parent.id)] == ["edited in parent", "a1", "q2", "a2"]
    assert [m.content for m in store.messages(child.id)] == [
        "first question",
        "a1",
        "a different q2",
    ]

    other = store.create_session("fast")
    with pytest.raises(MessageNotFound):
        store.fork(other.id, msgs[0].id)
    store.delete(parent.id)
    orphan = store.get_session(child.id)
    assert orphan.parent_session_id is None and len(store.messages(child.id)) == 3


# -- export / import ----------------------------------------------------------------------------


def test_export_markdown(store: SessionStore) -> None:
    s = store.create_session("fast", system_prompt="Be terse.", title="Haiku")
    store.add_message(s.id, "user", "Write a haiku")
    store.add_message(s.id, "assistant", "Autumn moon", status="interrupted")
    md = store.export_markdown(s.id)
    assert md.startswith("# Haiku\n")
    assert f"`{s.id}`" in md and "## System prompt\n\nBe terse." in md
    assert "## User\n\nWrite a haiku" in md
    assert "## Assistant\n\nAutumn moon\n\n*(interrupted)*" in md


def test_export_import_round_trip(store: SessionStore) -> None:
    s = store.create_session("fast", system_prompt="sys", model_fingerprint="fp")
    store.add_message(s.id, "user", "Grüße 😀", prompt_tokens=4)
    store.add_message(s.id, "assistant", "hi", completion_tokens=1, stats={"ttft_s": 0.5})
    store.add_message(s.id, "assistant", "cut", status="interrupted")
    s = store.get_session(s.id)
    doc = store.export_json(s.id)
    assert (doc["format"], doc["version"]) == (FORMAT, FORMAT_VERSION)
    text = json.dumps(doc)

    first, second = store.import_json(text), store.import_json(json.loads(text))
    assert len({s.id, first.id, second.id}) == 3
    for imported in (first, second):
        assert (imported.title, imported.profile, imported.system_prompt) == (
            s.title,
            "fast",
            "sys",
        )
        assert (imported.created_at, imported.updated_at) == (s.created_at, s.updated_at)
        exported = store.export_json(imported.id)
        assert exported["messages"] == doc["messages"]


BAD_IMPORTS = [
    ("{not json", "not JSON"),
    ([], "the file must be an object"),
    ({"format": "other", "version": 1}, "format must be"),
    ({"format": FORMAT, "version": 99}, "newer"),
    ({"format": FORMAT, "version": True}, "version must be"),
    ({"format": FORMAT, "version": 1}, "session must be an object"),
    ({"format": FORMAT, "version": 1, "session": {"created_at": 1.0}}, "session.profile"),
    ({"session": {"profile": "p", "created_at": "yesterday"}}, "session.created_at"),
    ({"session": {"profile": "p", "created_at": 1.0}, "messages": {}}, "messages must be a list"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x", "status": "done"}]}, "messages[0].status"),
    ({"messages": [{"role": "user", "content": "x", "prompt_tokens": -3}]}, "prompt_tokens"),
    ({"messages": [{"role": "user", "content": "x", "stats": [1]}]}, "messages[0].stats"),
]


@pytest.mark.parametrize(("data", "expected"), BAD_IMPORTS)
def test_bad_import(store: SessionStore, data: object, expected: str) -> None:
    if isinstance(data, dict) and "format" not in data:
        base = {"format": FORMAT, "version": 1, "session": {"profile": "p", "created_at": 1.0}}
        data = {**base, "messages": [], **data}
    with pytest.raises(InvalidImport) as info:
        store.import_json(data)  # type: ignore[arg-type]
    message = str(info.value)
    assert expected in message and "\n" not in message
    assert store.list_sessions() == []
