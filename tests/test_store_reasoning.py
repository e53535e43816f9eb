"""A reply's reasoning, stored apart from its answer: the schema step that moved it out of the
content of replies stored before (a real version 1 database, upgraded), the store API, and the
export formats (JSON version 2, a version 1 file still read; Markdown)."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from velo_chat.store import FORMAT_VERSION, SessionStore
from velo_chat.store.migrations import (
    LATEST_VERSION,
    MIGRATIONS,
    ensure_search_index,
    schema_version,
)
from velo_chat.store.reasoning import split_inline

from tests.support.store_helpers import HAS_FTS5, tick_clock

OLD_REPLIES = {  # content a version 1 velo-chat stored -> (reasoning, content) after the upgrade
    "<think>\nplan the answer\n</think>\n\nThe answer.": ("plan the answer", "The answer."),
    "\n<think>half a thought": ("half a thought", ""),  # interrupted inside its reasoning
    "No reasoning. <think> is text here.": ("", "No reasoning. <think> is text here."),
    "<think></think>Direct.": ("", "Direct."),
}


def version_1_database(path: Path) -> None:
    """The database a version 1 velo-chat leaves: its schema, its search index, its rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        MIGRATIONS[0](conn)
        conn.execute("PRAGMA user_version = 1")
        ensure_search_index(conn, HAS_FTS5)
        conn.execute(
            "INSERT INTO sessions (id, title, created_at, updated_at, profile) "
            "VALUES ('s1', 'old', 1, 2, 'default')"
        )
        rows = [("user", "<think>typed by the user</think> stays")]
        rows += [("assistant", content) for content in OLD_REPLIES]
        for position, (role, content) in enumerate(rows):
            conn.execute(
                "INSERT INTO messages (session_id, position, role, content, status, "
                "stats, created_at) VALUES ('s1', ?, ?, ?, 'complete', '{}', ?)",
                (position, role, content, position),
            )


def test_an_old_database_is_upgraded_and_its_reasoning_moved_out(db_path):
    version_1_database(db_path)
    with SessionStore(db_path, clock=tick_clock()) as store:
        messages = store.messages("s1")
        assert messages[0].content == "<think>typed by the user</think> stays"  # a user's text
        assert messages[0].reasoning == ""
        got = {old: (m.reasoning, m.content) for old, m in zip(OLD_REPLIES, messages[1:], strict=True)}
        assert got == OLD_REPLIES
        if store.uses_fts:  # the index follows the moved text
            assert [h.message.content for h in store.search("answer")] == ["The answer."]
            assert store.search("plan") == []
    with closing(sqlite3.connect(db_path)) as raw:
        assert schema_version(raw) == LATEST_VERSION == 5
    with SessionStore(db_path) as store:  # a second open changes nothing
        assert store.messages("s1")[1].reasoning == "plan the answer"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("  <think>\n\na\n\n</think>\n\nb\n", ("a", "b\n")),
        ("<think>x", ("x", "")),
        ("plain", (None, "plain")),
    ],
)
def test_split_inline(text, expected):
    assert split_inline(text) == expected


def test_replies_keep_their_reasoning_through_updates_forks_and_exports(store):
    session = store.create_session("default")
    user, reply = store.add_exchange(session.id, "Why?")
    reply = store.update_message(reply.id, content="Because.", reasoning="Think first.", status="complete")
    assert (reply.content, reply.reasoning) == ("Because.", "Think first.")
    assert store.update_message(reply.id, status="complete").reasoning == "Think first."
    fork = store.fork(session.id, reply.id)
    assert store.messages(fork.id)[-1].reasoning == "Think first."

    doc = store.export_json(session.id)
    assert doc["version"] == FORMAT_VERSION == 5
    assert [m["reasoning"] for m in doc["messages"]] == ["", "Think first."]
    again = store.import_json(json.dumps(doc))
    assert [(m.content, m.reasoning) for m in store.messages(again.id)] == [
        ("Why?", ""),
        ("Because.", "Think first."),
    ]

    markdown = store.export_markdown(session.id)
    assert "<details><summary>Reasoning</summary>\n\nThink first.\n\n</details>\n\nBecause." in markdown


def test_a_version_1_session_file_has_its_inline_reasoning_moved_out(store):
    doc = {
        "format": "velo-chat.session",
        "version": 1,
        "session": {"created_at": 1.0, "profile": "default"},
        "messages": [
            {"role": "user", "content": "<think>mine</think>"},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nYes."},
        ],
    }
    session = store.import_json(doc)
    assert [(m.content, m.reasoning) for m in store.messages(session.id)] == [
        ("<think>mine</think>", ""),
        ("Yes.", "hmm"),
    ]
