"""Tool steps and undo data in the session store: the schema step that brought them, calls and
results, file versions stored once, undo records, forks, deletion, search and export version 5.
Real SQLite files in tmp_path."""

from __future__ import annotations

import copy
import hashlib
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from velo_chat.store import (
    FORMAT_VERSION,
    SNIPPET_CLOSE,
    SNIPPET_OPEN,
    Attachment,
    InvalidArgument,
    InvalidImport,
    MessageNotFound,
    SessionNotFound,
    SessionStore,
    StoredToolCall,
    ToolResult,
)
from velo_chat.store.migrations import LATEST_VERSION, MIGRATIONS, schema_version

from tests.support.store_helpers import tick_clock

PYTEST = StoredToolCall(
    "call-1", "run_command", {"command": "pytest -q tests/test_parser.py"}, '{"name": "run_command"}'
)
EDIT = StoredToolCall("call-2", "edit_file", {"path": "src/parser.py", "old": "a", "new": "b"}, "<edit>")


def result(index: int, content: str, tool: str = "run_command", **more) -> ToolResult:
    return ToolResult(
        index, f"call-{index + 1}", tool, more.pop("decision", "allowed"), content, True, **more
    )


def step(store: SessionStore, question: str = "fix the parser") -> tuple[str, int]:
    """A session whose reply ran pytest and edited a file; (session id, reply id)."""
    session = store.create_session("coder", working_dir="/work")
    _, reply = store.add_exchange(session.id, question)
    store.set_tool_calls(reply.id, [PYTEST, EDIT])
    store.add_tool_result(reply.id, result(0, "3 failed, 9 passed in 0.42s", details={"exit_code": 1}))
    store.add_tool_result(reply.id, result(1, "edited src/parser.py", tool="edit_file", decision="auto"))
    return session.id, reply.id


def count(store: SessionStore, table: str) -> int:
    with store._transaction() as conn:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


# -- schema -------------------------------------------------------------------------------------


def test_a_version_4_database_gains_tool_steps_and_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with closing(sqlite3.connect(path, isolation_level=None)) as raw:
        for step_ in MIGRATIONS[:4]:
            step_(raw)
        raw.execute("PRAGMA user_version = 4")
        raw.execute(
            "INSERT INTO sessions (id, title, created_at, updated_at, profile, view_start) "
            "VALUES ('a', 'old', 1.0, 2.0, 'default', 0)"
        )
        raw.execute(
            "INSERT INTO messages (session_id, position, role, content, status, created_at, reasoning) "
            "VALUES ('a', 0, 'user', 'hi', 'complete', 1.0, ''), "
            "('a', 1, 'assistant', 'hello', 'complete', 2.0, 'thought')"
        )
        raw.execute(
            "INSERT INTO attachments (message_id, ordinal, path, sha256, size, content, pinned) "
            f"VALUES (1, 0, 'x.py', '{'0' * 64}', 1, 'x', 1)"
        )
    with SessionStore(path) as store:
        user, reply = store.messages("a")
        assert (user.content, user.attachments) == ("hi", (Attachment("x.py", "0" * 64, 1, "x", True),))
        assert (reply.content, reply.reasoning, reply.tool_calls, reply.tool_results) == (
            "hello",
            "thought",
            (),
            (),
        )
        assert store.set_tool_calls(reply.id, [PYTEST]).tool_calls == (PYTEST,)
    with closing(sqlite3.connect(path)) as raw:
        assert schema_version(raw) == LATEST_VERSION == 5
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []


# -- calls and results ----------------------------------------------------------------------------


def test_calls_and_results_round_trip_through_a_reopened_store(db_path: Path) -> None:
    with SessionStore(db_path, clock=tick_clock()) as store:
        session_id, reply_id = step(store)
        made = store.get_message(reply_id)
    with SessionStore(db_path) as store:
        again = store.get_message(reply_id)
        assert again == made == store.messages(session_id)[1]
    assert again.tool_calls == (PYTEST, EDIT)
    first, second = again.tool_results
    assert (first.call_index, first.content, first.ok, first.details) == (
        0,
        "3 failed, 9 passed in 0.42s",
        True,
        {"exit_code": 1},
    )
    assert (second.tool, second.decision, second.created_at) == (
        "edit_file",
        "auto",
        made.tool_results[1].created_at,
    )
    assert first.created_at > 0  # 0 means "now": the store's clock


def test_results_come_in_call_order_and_odd_values_are_stored(store: SessionStore) -> None:
    session = store.create_session("coder")
    _, reply = store.add_exchange(session.id, "go")
    odd = StoredToolCall("x", "run_command", {"command": "echo \ud800", "when": Path("/tmp")}, "t\ud800")
    store.set_tool_calls(reply.id, [odd, PYTEST])
    store.add_tool_result(reply.id, result(1, "second"))
    message = store.add_tool_result(reply.id, result(0, "first \udc00", reason="typed \ud800"))
    assert [r.content for r in message.tool_results] == ["first \ufffd", "second"]
    assert message.tool_results[0].reason == "typed \ufffd"
    assert message.tool_calls[0] == StoredToolCall(
        "x", "run_command", {"command": "echo \ufffd", "when": "/tmp"}, "t\ufffd"
    )


def test_bad_calls_and_results_are_refused_before_anything_is_written(store: SessionStore) -> None:
    session = store.create_session("coder")
    user, reply = store.add_exchange(session.id, "go")
    with pytest.raises(InvalidArgument, match="only a reply"):
        store.set_tool_calls(user.id, [PYTEST])
    with pytest.raises(InvalidArgument, match=r"tool_calls\[1\] must be a StoredToolCall"):
        store.set_tool_calls(reply.id, [PYTEST, "call"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match=r"tool_calls\[0\].arguments must be a mapping"):
        store.set_tool_calls(reply.id, [StoredToolCall("i", "n", ["a"], "t")])  # type: ignore[arg-type]
    with pytest.raises(MessageNotFound):
        store.set_tool_calls(999, [PYTEST])
    with pytest.raises(InvalidArgument, match="has no tool call 0"):
        store.add_tool_result(reply.id, result(0, "too soon"))
    store.set_tool_calls(reply.id, [PYTEST, EDIT])
    with pytest.raises(InvalidArgument, match="decision must be one of"):
        store.add_tool_result(reply.id, result(0, "x", decision="maybe"))
    with pytest.raises(InvalidArgument, match="call_index must be a non-negative integer"):
        store.add_tool_result(reply.id, result(-1, "x"))
    store.add_tool_result(reply.id, result(1, "done"))
    with pytest.raises(InvalidArgument, match="already has a result"):
        store.add_tool_result(reply.id, result(1, "again"))
    with pytest.raises(InvalidArgument, match="has a result for call 1"):
        store.set_tool_calls(reply.id, [PYTEST])
    message = store.get_message(reply.id)
    assert (message.tool_calls, [r.content for r in message.tool_results]) == ((PYTEST, EDIT), ["done"])


def test_reading_a_session_takes_the_same_queries_whatever_its_length(store: SessionStore) -> None:
    def queries(turns: int) -> int:
        session = store.create_session("coder")
        for _ in range(turns):
            _, reply = store.add_exchange(session.id, "go")
            store.set_tool_calls(reply.id, [PYTEST])
            store.add_tool_result(reply.id, result(0, "ok"))
        seen: list[str] = []
        assert store._conn is not None
        store._conn.set_trace_callback(seen.append)
        try:
            messages = store.messages(session.id)
        finally:
            store._conn.set_trace_callback(None)
        assert len(messages) == 2 * turns and all(m.tool_results for m in messages if m.role == "assistant")
        return sum(1 for q in seen if q.lstrip().upper().startswith("SELECT"))

    assert queries(2) == queries(20)


# -- file versions and undo records ----------------------------------------------------------------


def test_blobs_are_stored_once_and_read_back(store: SessionStore) -> None:
    data = b"\x00binary\xff and text\n"
    digest = store.put_blob(data)
    assert digest == hashlib.sha256(data).hexdigest() == store.put_blob(data)
    assert store.blob(digest) == data == store.blob(digest.upper())
    session_id, reply_id = step(store)
    for _ in range(3):  # the same versions, three times: stored once each
        store.add_undo_record(session_id, reply_id, 1, "/work/src/parser.py", data, b"after")
    assert count(store, "file_blobs") == 2
    with pytest.raises(InvalidArgument, match="64 hex"):
        store.blob("abc")
    with pytest.raises(InvalidArgument, match="no stored file version"):
        store.blob("0" * 64)
    with pytest.raises(InvalidArgument, match="must be bytes"):
        store.put_blob("text")  # type: ignore[arg-type]


def test_undo_records_in_order_by_position_and_marked_undone(store: SessionStore) -> None:
    session_id, first = step(store)
    second = store.add_exchange(session_id, "and the lexer")[1].id
    a = store.add_undo_record(session_id, first, 1, "/work/a.py", b"a0", b"a1")
    b = store.add_undo_record(session_id, second, 0, "/work/b.py", None, b"b1")
    c = store.add_undo_record(session_id, second, 1, "/work/a.py", b"a1", None)
    assert (b.before_sha256, c.after_sha256, a.undone_at) == (None, None, None)
    assert store.undo_records(session_id) == [a, b, c]
    assert store.undo_records(session_id, since_position=2) == [b, c]
    assert store.undo_records(session_id, since_position=4) == []
    store.mark_undone([c.id, b.id], when=5.0)
    assert store.undo_records(session_id) == [a]
    assert [r.undone_at for r in store.undo_records(session_id, include_undone=True)] == [None, 5.0, 5.0]
    store.mark_undone([c.id], when=9.0)  # already undone: keeps its time
    assert store.undo_records(session_id, include_undone=True)[2].undone_at == 5.0
    with pytest.raises(InvalidArgument, match="no undo record 999"):
        store.mark_undone([a.id, 999])
    assert store.undo_records(session_id) == [a]  # all or nothing


def test_bad_undo_records_are_refused(store: SessionStore) -> None:
    session_id, reply_id = step(store)
    other, _ = step(store)
    with pytest.raises(InvalidArgument, match="absolute"):
        store.add_undo_record(session_id, reply_id, 0, "src/a.py", b"a", b"b")
    with pytest.raises(InvalidArgument, match="both None"):
        store.add_undo_record(session_id, reply_id, 0, "/a.py", None, None)
    with pytest.raises(InvalidArgument, match="before must be bytes"):
        store.add_undo_record(session_id, reply_id, 0, "/a.py", "a", None)  # type: ignore[arg-type]
    with pytest.raises(MessageNotFound, match="not in session"):
        store.add_undo_record(other, reply_id, 0, "/a.py", b"a", b"b")
    with pytest.raises(SessionNotFound):
        store.add_undo_record("nope", reply_id, 0, "/a.py", b"a", b"b")
    with pytest.raises(SessionNotFound):
        store.undo_records("nope")
    assert count(store, "undo_records") == count(store, "file_blobs") == 0


def test_deleting_a_session_leaves_no_file_version_nothing_names(store: SessionStore) -> None:
    kept, kept_reply = step(store)
    gone, gone_reply = step(store)
    store.add_undo_record(kept, kept_reply, 1, "/work/a.py", b"shared", b"kept only")
    store.add_undo_record(gone, gone_reply, 1, "/work/a.py", b"shared", b"gone only")
    store.put_blob(b"stored but never recorded")
    store.delete(gone)
    with store._transaction() as conn:
        left = {bytes(row[0]) for row in conn.execute("SELECT data FROM file_blobs")}
    assert left == {b"shared", b"kept only"}
    # a regenerate deletes the replies after the question: their records and versions go too
    store.add_exchange(kept, "again", replace_after=-1)
    assert count(store, "undo_records") == count(store, "file_blobs") == count(store, "tool_results") == 0


def test_a_fork_copies_calls_and_results_but_not_undo_records(store: SessionStore) -> None:
    session_id, reply_id = step(store)
    store.add_undo_record(session_id, reply_id, 1, "/work/src/parser.py", b"a", b"b")
    original = store.messages(session_id)
    fork = store.fork(session_id, reply_id)
    copied = store.messages(fork.id)
    assert [(m.tool_calls, m.tool_results) for m in copied] == [
        (m.tool_calls, m.tool_results) for m in original
    ]
    assert copied[1].id != reply_id and store.undo_records(fork.id) == []
    store.add_exchange(session_id, "next")
    revision = store.fork_before(session_id, 2)
    assert [m.tool_results for m in store.messages(revision.id)] == [m.tool_results for m in original]
    assert len(store.undo_records(session_id)) == 1


# -- search -------------------------------------------------------------------------------------


def test_search_finds_a_tool_step_by_its_result_or_its_call(store: SessionStore) -> None:
    session_id, reply_id = step(store)
    store.add_exchange(session_id, "something unrelated")
    [by_result] = store.search("9 passed")
    assert by_result.message.id == reply_id
    assert by_result.snippet.startswith("⚙ run_command: ")
    assert f"{SNIPPET_OPEN}passed{SNIPPET_CLOSE}" in by_result.snippet
    assert by_result.message.tool_results[0].content.startswith("3 failed")
    [by_call] = store.search("pytest test_parser")
    assert by_call.message.id == reply_id and f"{SNIPPET_OPEN}pytest{SNIPPET_CLOSE}" in by_call.snippet
    [by_edit] = store.search("src/parser.py")
    assert by_edit.message.id == reply_id
    assert store.search("pytest", session_id="0" * 32) == []
    assert store.search("pytest nowhere") == []


def test_a_message_matching_by_text_and_by_tool_is_one_hit(store: SessionStore) -> None:
    session_id, reply_id = step(store)
    store.update_message(reply_id, content="I ran pytest for you")
    hits = store.search("pytest")
    assert [h.message.id for h in hits] == [reply_id]
    assert hits[0].snippet.find("⚙") == -1  # the text's own excerpt


# -- export and import --------------------------------------------------------------------------------


def exported(store: SessionStore) -> tuple[str, dict]:
    session_id, reply_id = step(store)
    store.add_undo_record(session_id, reply_id, 1, "/work/src/parser.py", b"old\n", b"new\n")
    store.add_undo_record(session_id, reply_id, 1, "/work/src/created.py", None, b"new\n")
    gone = store.add_undo_record(session_id, reply_id, 0, "/work/build.log", b"\x00log", None)
    store.mark_undone([gone.id], when=7.0)
    return session_id, store.export_json(session_id)


def without_ids(store: SessionStore, session_id: str) -> tuple[list, list]:
    messages = [
        (m.position, m.role, m.content, m.tool_calls, m.tool_results) for m in store.messages(session_id)
    ]
    positions = {m.id: m.position for m in store.messages(session_id)}
    records = [
        (
            positions[r.message_id],
            r.call_index,
            r.path,
            r.before_sha256,
            r.after_sha256,
            r.created_at,
            r.undone_at,
        )
        for r in store.undo_records(session_id, include_undone=True)
    ]
    return messages, records


def test_export_version_5_round_trips_calls_results_and_undo_data(store: SessionStore) -> None:
    session_id, doc = exported(store)
    assert doc["version"] == FORMAT_VERSION == 5
    assert len(doc["blobs"]) == 3 and len(doc["undo_records"]) == 3  # "new\n" once
    assert doc["messages"][1]["tool_calls"][0]["arguments"] == PYTEST.arguments
    text = json.dumps(doc)
    imported = store.import_json(text)
    assert without_ids(store, imported.id) == without_ids(store, session_id)
    [record] = [r for r in store.undo_records(imported.id) if r.before_sha256 is None]
    assert store.blob(record.after_sha256 or "") == b"new\n"
    again = store.export_json(imported.id)
    assert again["blobs"] == doc["blobs"] and again["undo_records"] == doc["undo_records"]


def test_an_older_export_still_imports(store: SessionStore) -> None:
    _, doc = exported(store)
    old = copy.deepcopy(doc)
    old["version"] = 4
    for m in old["messages"]:
        del m["tool_calls"], m["tool_results"]
    del old["undo_records"], old["blobs"]
    imported = store.import_json(old)
    assert [m.content for m in store.messages(imported.id)] == ["fix the parser", ""]
    assert all(m.tool_calls == () for m in store.messages(imported.id))
    assert store.undo_records(imported.id, include_undone=True) == []
    doc["version"] = 4  # a version 4 file's unknown keys are not read
    assert store.messages(store.import_json(doc).id)[1].tool_calls == ()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["blobs"].update({next(iter(d["blobs"])): "bm90IGl0"}), "do not have that sha256"),
        (lambda d: d["undo_records"][0].update(before_sha256="f" * 64), "names no entry of blobs"),
        (lambda d: d["undo_records"][0].update(message_position=9), "names no message"),
        (lambda d: d["undo_records"][0].update(path="relative.py"), "must be absolute"),
        (lambda d: d["messages"][1]["tool_results"][1].update(call_index=5), "has no such call"),
        (lambda d: d["messages"][1]["tool_results"][1].update(call_index=0), "has a result for it already"),
        (lambda d: d["messages"][1]["tool_results"][0].update(decision="maybe"), "decision must be one of"),
        (lambda d: d["messages"][1]["tool_calls"][0].update(arguments="x"), "arguments must be an object"),
    ],
)
def test_a_bad_version_5_file_is_refused_whole(store: SessionStore, change, message: str) -> None:
    _, doc = exported(store)
    before = len(store.list_sessions())
    change(doc)
    with pytest.raises(InvalidImport, match=message):
        store.import_json(doc)
    assert len(store.list_sessions()) == before


def test_markdown_export_shows_calls_and_results(store: SessionStore) -> None:
    session_id, reply_id = step(store)
    _, second = store.add_exchange(session_id, "more")
    store.set_tool_calls(second.id, [StoredToolCall("z", "nope", {}, "??", error="unknown tool")])
    text = store.export_markdown(session_id)
    assert "🔧 Tool call 1: `run_command`" in text
    assert '"command": "pytest -q tests/test_parser.py"' in text
    assert "↳ Result: ok (allowed)\n\n```\n3 failed, 9 passed in 0.42s\n```" in text
    assert "🔧 Tool call 2: `edit_file`" in text and "↳ Result: ok (auto)" in text
    assert "🔧 Tool call 1: `nope` (not a valid call: unknown tool)" in text
    assert "↳ no result (the call was never decided)" in text
