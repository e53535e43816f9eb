"""Attachments, drafts, the working folder, forks before a message, search by file name, export
version 3 and the schema step that brought them: real SQLite files in tmp_path."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from velo_chat.store import (
    FORMAT,
    FORMAT_VERSION,
    SNIPPET_CLOSE,
    SNIPPET_OPEN,
    Attachment,
    Draft,
    DraftNotFound,
    InvalidArgument,
    InvalidImport,
    MessageNotFound,
    SessionNotFound,
    SessionStore,
)
from velo_chat.store.migrations import LATEST_VERSION, MIGRATIONS, ensure_search_index, schema_version

from tests.support.store_helpers import HAS_FTS5, tick_clock


def attached(path: str, content: str) -> Attachment:
    """An attachment as the app makes one: the hash and size of the file's bytes as read."""
    data = content.encode("utf-8")
    return Attachment(path=path, sha256=hashlib.sha256(data).hexdigest(), size=len(data), content=content)


FILES = (
    attached("src/parser.py", "def parse(text):\n    return text.split()\n"),
    attached("docs/naïve café 😀.md", "# Grüße\n\n日本語のテキスト\n"),
    attached("empty.txt", ""),
)


def raw_count(db_path: Path, table: str) -> int:
    with closing(sqlite3.connect(db_path)) as raw:
        return int(raw.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


# -- round trip ---------------------------------------------------------------------------------


def test_attachments_round_trip_apart_from_the_typed_text(store: SessionStore) -> None:
    session = store.create_session("fast", working_dir="/home/someone/project")
    assert store.get_session(session.id).working_dir == "/home/someone/project"
    user, reply = store.add_exchange(session.id, "What does this do?", attachments=FILES)
    assert (user.content, user.attachments) == ("What does this do?", FILES)
    assert reply.attachments == ()
    assert store.get_message(user.id).attachments == FILES
    assert [m.attachments for m in store.messages(session.id)] == [FILES, ()]
    assert store.get_session(session.id).title == "What does this do?"  # from the text, not files

    later = store.add_message(session.id, "user", "and these?", attachments=list(reversed(FILES)))
    assert store.get_message(later.id).attachments == tuple(reversed(FILES))  # the order given
    assert store.update_message(later.id, content="and these two?").attachments == tuple(reversed(FILES))
    assert store.messages(session.id)[-1].attachments == tuple(reversed(FILES))


def test_an_uppercase_hash_is_stored_lowercase(store: SessionStore) -> None:
    session = store.create_session("fast")
    loud = Attachment("a.txt", FILES[0].sha256.upper(), FILES[0].size, FILES[0].content)
    user, _ = store.add_exchange(session.id, "x", attachments=[loud])
    assert user.attachments[0].sha256 == FILES[0].sha256


def test_a_session_without_a_working_dir_and_an_empty_one_refused(store: SessionStore) -> None:
    assert store.create_session("fast").working_dir is None
    with pytest.raises(InvalidArgument, match="working_dir"):
        store.create_session("fast", working_dir="  ")


GOOD = FILES[0]
BAD_ATTACHMENTS: list[tuple[Any, str]] = [
    ([Attachment("", GOOD.sha256, 1, "x")], r"attachments\[0\]\.path"),
    ([GOOD, Attachment("  ", GOOD.sha256, 1, "x")], r"attachments\[1\]\.path"),
    ([Attachment(3, GOOD.sha256, 1, "x")], r"attachments\[0\]\.path"),  # type: ignore[arg-type]
    ([Attachment("a", "abc", 1, "x")], r"attachments\[0\]\.sha256"),
    ([Attachment("a", "g" * 64, 1, "x")], r"attachments\[0\]\.sha256"),
    ([Attachment("a", GOOD.sha256, -1, "x")], r"attachments\[0\]\.size"),
    ([Attachment("a", GOOD.sha256, True, "x")], r"attachments\[0\]\.size"),
    ([Attachment("a", GOOD.sha256, 1.5, "x")], r"attachments\[0\]\.size"),  # type: ignore[arg-type]
    ([Attachment("a", GOOD.sha256, 1, b"x")], r"attachments\[0\]\.content"),  # type: ignore[arg-type]
    ([{"path": "a"}], r"attachments\[0\] must be an Attachment"),
    ("src/parser.py", "attachments must be a sequence"),
]


@pytest.mark.parametrize(("attachments", "expected"), BAD_ATTACHMENTS)
def test_a_bad_attachment_is_refused_and_nothing_written(
    store: SessionStore, db_path: Path, attachments: Any, expected: str
) -> None:
    session = store.create_session("fast")
    for write in (
        lambda: store.add_exchange(session.id, "keep me?", attachments=attachments),
        lambda: store.add_message(session.id, "user", "keep me?", attachments=attachments),
        lambda: store.add_draft(session.id, "keep me?", attachments),
    ):
        with pytest.raises(InvalidArgument, match=expected):
            write()
    assert store.messages(session.id) == [] and store.drafts(session.id) == []
    assert store.get_session(session.id) == session
    assert raw_count(db_path, "attachments") == 0


def test_attachments_go_with_their_messages(store: SessionStore, db_path: Path) -> None:
    session = store.create_session("fast")
    store.add_exchange(session.id, "first", attachments=FILES[:1])
    store.add_exchange(session.id, "again", attachments=FILES[1:], replace_after=-1)
    assert [(m.content, m.attachments) for m in store.messages(session.id)] == [
        ("again", FILES[1:]),
        ("", ()),
    ]
    assert raw_count(db_path, "attachments") == 2
    store.delete(session.id)
    assert raw_count(db_path, "attachments") == 0


# -- forks --------------------------------------------------------------------------------------


def conversation(store: SessionStore) -> tuple[str, list[Any]]:
    """A session of two turns, each question with files, its replies complete."""
    session = store.create_session(
        "code-edit", system_prompt="sys", model_fingerprint="fp", working_dir="/work/project"
    )
    made = []
    for text, files in (("first question", FILES[:2]), ("second question", FILES[2:])):
        user, reply = store.add_exchange(session.id, text, attachments=files)
        made += [user, store.update_message(reply.id, content=f"reply to {text}", status="complete")]
    return session.id, made


def test_fork_copies_the_attachments(store: SessionStore) -> None:
    parent_id, made = conversation(store)
    child = store.fork(parent_id, made[2].id)
    copied = store.messages(child.id)
    assert [(m.content, m.attachments) for m in copied] == [(m.content, m.attachments) for m in made[:3]]
    assert child.working_dir == "/work/project"
    assert store.messages(parent_id) == made


def test_fork_before_holds_everything_before_the_message(store: SessionStore) -> None:
    parent_id, made = conversation(store)
    before = store.get_session(parent_id)

    revise = store.fork_before(parent_id, 2)  # "revise message 2": the fork holds turn one
    assert (revise.parent_session_id, revise.forked_from_message_id) == (parent_id, made[1].id)
    assert (revise.profile, revise.system_prompt, revise.model_fingerprint, revise.working_dir) == (
        "code-edit",
        "sys",
        "fp",
        "/work/project",
    )
    assert revise.title == "first question (fork)"
    copied = store.messages(revise.id)
    assert [(m.position, m.role, m.content, m.attachments) for m in copied] == [
        (m.position, m.role, m.content, m.attachments) for m in made[:2]
    ]
    assert {m.id for m in copied}.isdisjoint(m.id for m in made)
    user, _ = store.add_exchange(revise.id, "second question, revised", attachments=FILES[:1])
    assert user.position == 2 and user.attachments == FILES[:1]

    regenerate = store.fork_before(parent_id, 3)  # "regenerate reply 3"
    assert regenerate.forked_from_message_id == made[2].id
    assert [m.attachments for m in store.messages(regenerate.id)] == [FILES[:2], (), FILES[2:]]

    assert store.messages(parent_id) == made  # the original never changes
    assert store.get_session(parent_id) == before


def test_fork_before_the_first_message_is_an_empty_fork(store: SessionStore) -> None:
    parent_id, made = conversation(store)
    empty = store.fork_before(parent_id, 0)
    assert store.messages(empty.id) == []
    assert (empty.parent_session_id, empty.forked_from_message_id) == (parent_id, None)
    assert (empty.working_dir, empty.title) == ("/work/project", "first question (fork)")
    assert store.fork_before(parent_id, 0, title="  my   fork ").title == "my fork"
    assert store.messages(parent_id) == made


def test_fork_before_needs_a_message_of_the_session(store: SessionStore) -> None:
    parent_id, made = conversation(store)
    for position in (-1, len(made), 99):
        with pytest.raises(MessageNotFound):
            store.fork_before(parent_id, position)
    with pytest.raises(MessageNotFound):
        store.fork_before(store.create_session("fast").id, 0)
    with pytest.raises(SessionNotFound):
        store.fork_before("nope", 0)
    with pytest.raises(InvalidArgument):
        store.fork_before(parent_id, True)
    assert [s.id for s in store.list_sessions()].count(parent_id) == 1
    assert len(store.list_sessions()) == 2  # nothing was forked


# -- drafts -------------------------------------------------------------------------------------


def test_drafts_are_kept_in_order_and_changed_whole(store: SessionStore) -> None:
    session = store.create_session("fast")
    store.add_message(session.id, "user", "sent")
    updated_at = store.get_session(session.id).updated_at
    one = store.add_draft(session.id, "queued one", FILES[:1])
    two = store.add_draft(session.id, "")  # files only, or typed later: still kept
    three = store.add_draft(session.id, "queued three 😀", FILES)
    assert isinstance(one, Draft) and one.session_id == session.id and one.attachments == FILES[:1]
    assert store.drafts(session.id) == [one, two, three]

    edited = store.update_draft(one.id, "queued one, edited")
    assert (edited.text, edited.attachments, edited.created_at) == (
        "queued one, edited",
        FILES[:1],
        one.created_at,
    )
    cleared = store.update_draft(one.id, "no files now", attachments=[])
    assert cleared.attachments == ()
    store.delete_draft(two.id)
    assert [d.text for d in store.drafts(session.id)] == ["no files now", "queued three 😀"]

    assert store.get_session(session.id).updated_at == updated_at  # drafts are not messages
    assert [m.content for m in store.messages(session.id)] == ["sent"]
    assert store.search("queued") == []
    for call in (
        lambda: store.update_draft(two.id, "x"),
        lambda: store.delete_draft(two.id),
        lambda: store.update_draft(12345, "x"),
    ):
        with pytest.raises(DraftNotFound):
            call()
    with pytest.raises(SessionNotFound):
        store.add_draft("nope", "x")
    with pytest.raises(InvalidArgument):
        store.update_draft(three.id, "x", attachments=[Attachment("", "0" * 64, 0, "")])
    assert store.drafts(session.id)[-1] == three


def test_drafts_go_with_their_session(store: SessionStore, db_path: Path) -> None:
    keep, gone = store.create_session("fast"), store.create_session("fast")
    mine = store.add_draft(keep.id, "mine")
    store.add_draft(gone.id, "theirs", FILES)
    store.delete(gone.id)
    assert store.drafts(keep.id) == [mine]
    assert raw_count(db_path, "drafts") == 1
    with pytest.raises(SessionNotFound):
        store.drafts(gone.id)


# -- search by file name ------------------------------------------------------------------------


def test_search_finds_a_message_by_its_attachments_paths(store: SessionStore) -> None:
    a, b = store.create_session("fast"), store.create_session("fast")
    by_name, _ = store.add_exchange(
        a.id, "what is wrong here?", attachments=[*FILES, attached("lib/Parser.rs", "")]
    )
    by_both, _ = store.add_exchange(b.id, "the parser crashes", attachments=FILES[:1])
    store.add_exchange(b.id, "nothing to see", attachments=[attached("notes.txt", "parser inside")])

    found = store.search("parser")
    hits = {h.message.id: h for h in found}
    assert len(found) == 2 and set(hits) == {
        by_name.id,
        by_both.id,
    }  # an attachment's content is not searched
    assert hits[by_name.id].snippet == f"src/{SNIPPET_OPEN}parser{SNIPPET_CLOSE}.py"  # first in order
    assert hits[by_name.id].message.attachments == by_name.attachments
    assert hits[by_name.id].session.id == a.id
    assert f"the {SNIPPET_OPEN}parser{SNIPPET_CLOSE} crashes" in hits[by_both.id].snippet  # one hit

    assert [h.snippet for h in store.search("PARSER.rs")] == [f"lib/{SNIPPET_OPEN}Parser.rs{SNIPPET_CLOSE}"]
    assert {h.message.id for h in store.search("src .py")} == {by_name.id, by_both.id}
    assert [h.message.id for h in store.search("café")] == [by_name.id]
    assert [h.message.id for h in store.search("parser", session_id=a.id)] == [by_name.id]
    assert store.search("parser.py docs") == []  # every term in one path
    assert len(store.search("parser", limit=1)) == 1
    for hostile in ["%", "_", "\\", '"src']:
        store.search(hostile)  # never a syntax error


def test_search_by_path_keeps_the_content_order(store: SessionStore) -> None:
    """On the LIKE path content and path hits share one order (newest session first); on the FTS
    path the ranked content hits come first, then the path hits."""
    old, new = store.create_session("fast"), store.create_session("fast")
    in_text, _ = store.add_exchange(old.id, "the config loader")
    in_path, _ = store.add_exchange(new.id, "look", attachments=[attached("app/config.toml", "x = 1")])
    found = [h.message.id for h in store.search("config")]
    assert found == ([in_text.id, in_path.id] if store.uses_fts else [in_path.id, in_text.id])


# -- export / import ----------------------------------------------------------------------------


def test_export_round_trip_with_files(store: SessionStore) -> None:
    session_id, made = conversation(store)
    store.add_draft(session_id, "queued while it streamed", FILES[1:])
    doc = store.export_json(session_id)
    assert (doc["format"], doc["version"]) == (FORMAT, FORMAT_VERSION) == (FORMAT, 5)
    assert doc["session"]["working_dir"] == "/work/project"
    assert doc["messages"][0]["attachments"] == [
        {"path": f.path, "sha256": f.sha256, "size": f.size, "content": f.content, "pinned": False}
        for f in FILES[:2]
    ]
    assert doc["messages"][1]["attachments"] == []
    assert [d["text"] for d in doc["drafts"]] == ["queued while it streamed"]

    again = store.import_json(json.dumps(doc))
    assert again.working_dir == "/work/project"
    assert [(m.content, m.attachments) for m in store.messages(again.id)] == [
        (m.content, m.attachments) for m in made
    ]
    assert [(d.text, d.attachments) for d in store.drafts(again.id)] == [
        ("queued while it streamed", FILES[1:])
    ]
    second = store.export_json(again.id)
    assert (second["messages"], second["drafts"]) == (doc["messages"], doc["drafts"])


def test_markdown_export_holds_the_files(store: SessionStore) -> None:
    session = store.create_session("fast", working_dir="/work/project")
    tricky = attached("README.md", "```python\nprint(1)\n```")
    store.add_exchange(session.id, "Explain", attachments=[FILES[0], tricky])
    store.add_draft(session.id, "and later this")
    md = store.export_markdown(session.id)
    assert "- Working folder: `/work/project`" in md
    assert (
        f"## User\n\nExplain\n\n📎 `src/parser.py` ({FILES[0].size} bytes)\n\n```\n{FILES[0].content}\n```"
        in md
    )
    assert f"📎 `README.md` ({tricky.size} bytes)\n\n````\n{tricky.content}\n````" in md
    assert "## Drafts (not sent)" in md and "and later this" in md


def v2_document() -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": 2,
        "session": {"created_at": 1.0, "profile": "default", "title": "old"},
        "messages": [
            {"role": "user", "content": "question"},
            {"role": "assistant", "content": "answer", "reasoning": "thought"},
        ],
    }


@pytest.mark.parametrize("version", [1, 2])
def test_older_session_files_still_import(store: SessionStore, version: int) -> None:
    doc = v2_document() | {"version": version}
    session = store.import_json(doc)
    assert (session.title, session.working_dir) == ("old", None)
    messages = store.messages(session.id)
    assert [(m.content, m.attachments) for m in messages] == [("question", ()), ("answer", ())]
    assert store.drafts(session.id) == []
    assert store.export_json(session.id)["version"] == 5


BAD_V3: list[tuple[dict[str, Any], str]] = [
    (
        {"messages": [{"role": "user", "content": "x", "attachments": {}}]},
        "messages[0].attachments must be a list",
    ),
    (
        {"messages": [{"role": "user", "content": "x", "attachments": [1]}]},
        "messages[0].attachments[0] must be",
    ),
    (
        {"attachments": [{"path": "a", "sha256": "xyz", "size": 1, "content": ""}]},
        "messages[1].attachments[0].sha256",
    ),
    (
        {"attachments": [{"path": " ", "sha256": GOOD.sha256, "size": 1, "content": ""}]},
        "attachments[0].path",
    ),
    (
        {"attachments": [{"path": "a", "sha256": GOOD.sha256, "size": -1, "content": ""}]},
        "attachments[0].size",
    ),
    (
        {"attachments": [{"path": "a", "sha256": GOOD.sha256, "content": ""}]},
        "messages[1].attachments[0].size",
    ),
    (
        {"attachments": [{"path": "a", "sha256": GOOD.sha256, "size": 1}]},
        "messages[1].attachments[0].content",
    ),
    ({"drafts": {}}, "drafts must be a list"),
    ({"drafts": [{"attachments": []}]}, "drafts[0].text"),
    ({"drafts": [{"text": "x", "attachments": [{"path": "a"}]}]}, "drafts[0].attachments[0].sha256"),
    ({"drafts": [{"text": "x", "created_at": "now"}]}, "drafts[0].created_at"),
    ({"session": {"profile": "p", "created_at": 1.0, "working_dir": 7}}, "session.working_dir"),
]


@pytest.mark.parametrize(("change", "expected"), BAD_V3)
def test_a_bad_version_3_file_names_the_field(
    store: SessionStore, change: dict[str, Any], expected: str
) -> None:
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": 3,
        "session": {"profile": "p", "created_at": 1.0},
        "messages": [{"role": "user", "content": "fine"}, {"role": "user", "content": "x"}],
    }
    if "attachments" in change:
        doc["messages"][1]["attachments"] = change["attachments"]
    else:
        doc |= change
    with pytest.raises(InvalidImport) as info:
        store.import_json(doc)
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert store.list_sessions() == []


# -- the schema step ----------------------------------------------------------------------------


def version_2_database(path: Path) -> None:
    """The database the released velo-chat (schema 2) leaves: its schema, index and rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        MIGRATIONS[0](conn)
        MIGRATIONS[1](conn)
        conn.execute("PRAGMA user_version = 2")
        ensure_search_index(conn, HAS_FTS5)
        conn.execute(
            "INSERT INTO sessions (id, title, created_at, updated_at, profile, system_prompt) "
            "VALUES ('s2', 'released', 1, 2, 'default', 'be brief')"
        )
        for position, (role, content, reasoning) in enumerate(
            [("user", "how do tokenizers work?", ""), ("assistant", "They split text.", "think")]
        ):
            conn.execute(
                "INSERT INTO messages (session_id, position, role, content, status, stats, "
                "created_at, reasoning) VALUES ('s2', ?, ?, ?, 'complete', '{\"ttft_s\": 0.5}', ?, ?)",
                (position, role, content, position, reasoning),
            )


def test_a_version_2_database_is_upgraded_in_place(db_path: Path) -> None:
    version_2_database(db_path)
    with SessionStore(db_path, clock=tick_clock()) as store:
        session = store.get_session("s2")
        assert (session.title, session.system_prompt, session.working_dir) == ("released", "be brief", None)
        messages = store.messages("s2")
        assert [(m.role, m.content, m.reasoning, m.stats, m.attachments) for m in messages] == [
            ("user", "how do tokenizers work?", "", {"ttft_s": 0.5}, ()),
            ("assistant", "They split text.", "think", {"ttft_s": 0.5}, ()),
        ]
        assert [h.message.id for h in store.search("tokenizers")] == [messages[0].id]
        user, _ = store.add_exchange("s2", "and this file?", attachments=FILES[:1])
        assert store.messages("s2")[2].attachments == FILES[:1] == user.attachments
        assert store.add_draft("s2", "later").text == "later"
        assert store.fork_before("s2", 2).working_dir is None
    with closing(sqlite3.connect(db_path)) as raw:
        assert schema_version(raw) == LATEST_VERSION == 5
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with SessionStore(db_path) as store:  # a second open changes nothing
        assert [m.attachments for m in store.messages("s2")][2] == FILES[:1]
