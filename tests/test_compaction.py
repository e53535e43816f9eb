"""A full context is not a dead end (docs/compaction.md): the store's side of it (schema v4,
continuations, the model's view, pinned files, exports), then real conversations on real models
and templates that overflow a small context and go on through compaction and through
drop_oldest.

The models: SmolLM2 (attention, ChatML) and the tiny hybrid qwen4exp with Qwen3.5's thinking
template from llama.cpp's collection (the template drops earlier replies' reasoning, and its
`enable_thinking` switch lets the summary turn run without thinking). Reuse is read from the
engine's own numbers (`TurnStarted`, and the stats stored with the summary): the summary request
reuses at least 95% of the history's tokens, and the turn after a compaction at least 90% of its
prompt, from the live context and from the disk in a fresh engine.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import sqlite3
import threading
from pathlib import Path

import pytest

from velo_chat.app.compaction import (
    CompactionFailed,
    compact,
    complete_turns,
    fill,
    needs_room,
)
from velo_chat.app.conversation import (
    StartedTurn,
    carried_files,
    engine_messages,
    pinned_files,
    record,
    start_turn,
    turn_messages,
)
from velo_chat.engine import (
    ChatMessage,
    TokenDelta,
    TurnDone,
    TurnFailed,
    TurnStarted,
    render_block,
    render_user_content,
)
from velo_chat.engine.config import Profile
from velo_chat.engine.diagnostics import diagnostics, follow_up_prefix
from velo_chat.engine.engine import Engine
from velo_chat.engine.prompt import template_env
from velo_chat.store import (
    FORMAT_VERSION,
    Attachment,
    InvalidArgument,
    NewMessage,
    Session,
    SessionStore,
)
from velo_chat.store.migrations import MIGRATIONS, schema_version

from devkit.gguf_template import with_chat_template
from tests.support.engine_helpers import test_profile
from tests.support.llama_templates import read_template, templates_dir

LONG = (
    "We are porting the scheduler to the new queue. The worker pool drains the queue in order, "
    "retries a failed job twice and then parks it. "
)
SOURCE = "def area(r):\n    return 3.14159 * r * r\n\n\ndef ring(r1, r2):\n    return area(r2) - area(r1)\n"


def file(path: str, content: str = SOURCE, *, pinned: bool = False) -> Attachment:
    data = content.encode()
    return Attachment(path, hashlib.sha256(data).hexdigest(), len(data), content, pinned)


def export(store: SessionStore, session_id: str) -> dict:
    doc = store.export_json(session_id)
    del doc["exported_at"]
    return doc


def everything(store: SessionStore) -> dict[str, dict]:
    """Every session's export: what a failed compaction must leave exactly as it was."""
    return {s.id: export(store, s.id) for s in store.list_sessions()}


# -- the store ---------------------------------------------------------------------------------------


def conversation(store: SessionStore, turns: int = 3, *, pinned_at: int | None = 0) -> Session:
    session = store.create_session("test", system_prompt="Be brief.", working_dir="/work")
    for i in range(turns):
        files = (file("geometry.py", pinned=True),) if i == pinned_at else ()
        store.add_message(session.id, "user", f"question {i}", attachments=files)
        store.add_message(session.id, "assistant", f"answer {i}", reasoning=f"thought {i}")
    return store.get_session(session.id)


def test_a_version_3_database_gains_continuations_views_and_pins(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path, isolation_level=None) as raw:
        for step in MIGRATIONS[:3]:
            step(raw)
        raw.execute("PRAGMA user_version = 3")
        raw.execute(
            "INSERT INTO sessions (id, title, created_at, updated_at, profile) "
            "VALUES ('a' , 'old', 1.0, 1.0, 'default')"
        )
        raw.execute(
            "INSERT INTO messages (session_id, position, role, content, status, created_at) "
            "VALUES ('a', 0, 'user', 'hi', 'complete', 1.0)"
        )
        raw.execute(
            "INSERT INTO attachments (message_id, ordinal, path, sha256, size, content) "
            f"VALUES (1, 0, 'x.py', '{'0' * 64}', 1, 'x')"
        )
    raw.close()
    with SessionStore(path) as store:
        session = store.get_session("a")
        assert (session.continues, session.view_start) == (False, 0)
        [message] = store.messages("a")
        assert message.attachments == (Attachment("x.py", "0" * 64, 1, "x", False),)
    with sqlite3.connect(path) as raw:
        assert schema_version(raw) == len(MIGRATIONS) == 5
    raw.close()


def test_a_continuation_is_written_whole_and_linked_to_its_parent(store: SessionStore) -> None:
    parent = conversation(store)
    before = everything(store)
    last = store.messages(parent.id)[-1]
    pinned = pinned_files(store.messages(parent.id))
    child = store.create_continuation(
        parent.id,
        [
            NewMessage("user", "Summarize.", attachments=pinned),
            NewMessage("assistant", "We did things.", stats={"cached_tokens": 5}, prompt_tokens=9),
            NewMessage("user", "question 2"),
            NewMessage("assistant", "answer 2", reasoning="thought 2"),
        ],
    )
    assert child.continues and child.parent_session_id == parent.id
    assert child.forked_from_message_id == last.id
    assert child.title == "question 0 (continued)"
    assert (child.profile, child.system_prompt, child.working_dir) == ("test", "Be brief.", "/work")
    messages = store.messages(child.id)
    assert [(m.position, m.role, m.content) for m in messages] == [
        (0, "user", "Summarize."),
        (1, "assistant", "We did things."),
        (2, "user", "question 2"),
        (3, "assistant", "answer 2"),
    ]
    assert messages[0].attachments == (file("geometry.py", pinned=True),)
    assert messages[1].stats == {"cached_tokens": 5} and messages[1].prompt_tokens == 9
    assert messages[3].reasoning == "thought 2"
    assert {k: v for k, v in everything(store).items() if k != child.id} == before  # the parent as it was
    with pytest.raises(InvalidArgument, match=r"messages\[1\].role"):
        store.create_continuation(parent.id, [NewMessage("user", "a"), NewMessage("bot", "b")])  # type: ignore[arg-type]
    assert len(store.list_sessions()) == 2  # nothing of the bad one was written


def test_the_view_starts_only_at_a_user_message_and_forks_keep_it(store: SessionStore) -> None:
    session = conversation(store)
    with pytest.raises(InvalidArgument, match="user message"):
        store.set_view_start(session.id, 3)  # a reply
    with pytest.raises(InvalidArgument, match="user message"):
        store.set_view_start(session.id, 40)
    with pytest.raises(InvalidArgument):
        store.set_view_start(session.id, -1)
    moved = store.set_view_start(session.id, 4)
    assert moved.view_start == 4 and moved.updated_at == session.updated_at
    assert store.fork_before(session.id, 5).view_start == 4  # the view is in the fork's copy
    assert store.fork_before(session.id, 2).view_start == 0


def test_pinned_files_before_the_view_are_still_shown_to_the_model(store: SessionStore) -> None:
    session = store.create_session("test")
    notes = file("notes.md", "- keep the queue ordered\n", pinned=True)
    store.add_message(session.id, "user", "first", attachments=(file("geometry.py", pinned=True), notes))
    store.add_message(session.id, "assistant", "ok")
    store.add_message(session.id, "user", "second", attachments=(file("geometry.py", "x = 1\n"),))
    store.add_message(session.id, "assistant", "ok")
    store.add_message(session.id, "user", "third")
    store.add_message(session.id, "assistant", "ok")
    messages = store.messages(session.id)
    # the latest version of each pinned path (a later unpinned attach is still its latest version)
    assert pinned_files(messages) == (notes, file("geometry.py", "x = 1\n", pinned=True))
    # view at message 4: both paths are out of view, so both are carried into "third"
    view = engine_messages("", messages, view_start=4)
    carried = (notes, file("geometry.py", "x = 1\n", pinned=True))
    assert carried_files(messages, 4) == carried
    assert [m.content for m in view] == [render_user_content(carried, "third"), "ok"]
    # view at message 2: geometry.py is attached again in view, only notes.md is carried
    view = engine_messages("", messages, view_start=2)
    assert view[0].content == render_user_content((notes, file("geometry.py", "x = 1\n")), "second")
    assert engine_messages("", messages) == engine_messages("", messages, view_start=0)


def test_exports_carry_pins_views_and_continuations_and_older_ones_import(store: SessionStore) -> None:
    parent = conversation(store)
    child = store.create_continuation(
        parent.id,
        [NewMessage("user", "Summarize.", attachments=pinned_files(store.messages(parent.id)))],
    )
    child = store.set_view_start(child.id, 0)
    store.add_message(child.id, "assistant", "Summary.")
    store.add_message(child.id, "user", "next")
    store.set_view_start(child.id, 2)
    store.add_draft(child.id, "queued", (file("q.py", pinned=True),))
    doc = store.export_json(child.id)
    assert doc["version"] == FORMAT_VERSION == 5
    assert (doc["session"]["continues"], doc["session"]["view_start"]) == (True, 2)
    assert doc["messages"][0]["attachments"][0]["pinned"] is True
    copy = store.import_json(doc)
    assert (copy.continues, copy.view_start) == (True, 2)
    assert store.messages(copy.id)[0].attachments == (file("geometry.py", pinned=True),)
    assert store.drafts(copy.id)[0].attachments == (file("q.py", pinned=True),)
    markdown = store.export_markdown(child.id)
    assert "- Continues: `" in markdown and "The model's view begins here" in markdown
    assert f"({len(SOURCE.encode())} bytes, pinned)" in markdown
    # a version 3 file: nothing pinned, the whole history in view
    old = dict(doc, version=3)
    old["session"] = {k: v for k, v in doc["session"].items() if k not in ("continues", "view_start")}
    old["messages"] = [
        dict(m, attachments=[{k: v for k, v in a.items() if k != "pinned"} for a in m["attachments"]])
        for m in doc["messages"]
    ]
    imported = store.import_json(old)
    assert (imported.continues, imported.view_start) == (False, 0)
    assert store.messages(imported.id)[0].attachments == (file("geometry.py"),)
    with pytest.raises(Exception, match="view_start"):
        store.import_json(dict(doc, session=dict(doc["session"], view_start=1)))  # a reply


# -- real models ---------------------------------------------------------------------------------------

QWEN_TEMPLATE = "Qwen3.5-4B"


@pytest.fixture(autouse=True)
def fixed_date(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_env, "now", lambda: datetime.datetime(2026, 12, 5, 12, 0))


@pytest.fixture(params=["smollm2", "qwen4exp"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2, or the tiny hybrid qwen4exp with Qwen3.5's thinking template."""
    if request.param == "smollm2":
        return request.getfixturevalue("smollm2_path")
    templates = templates_dir()
    if templates is None:
        pytest.skip("llama.cpp's chat templates are unavailable (see test_template_corpus.py)")
    qwen = request.getfixturevalue("qwen_path")
    folder = tmp_path_factory.mktemp("qwen35")
    return with_chat_template(qwen, read_template(templates, QWEN_TEMPLATE), folder / "qwen35.gguf")


def small_profile(model: Path, **context: object) -> Profile:
    """A 1,024-token context that acts at 60% full; short replies."""
    settings = {"n_ctx": 1024, "compact_at": 0.6, **context}
    return test_profile(model, context=settings, sampling={"max_tokens": 24})


def run(started: StartedTurn) -> tuple[TurnStarted, TurnDone]:
    first = done = None
    for event in record(started.events, started.recorded):
        if isinstance(event, TurnStarted):
            first = event
        elif isinstance(event, TurnFailed):
            raise AssertionError(event.reason)
        elif isinstance(event, TurnDone):
            done = event
    assert first is not None and done is not None
    return first, done


def turn(store, engine, profile, session, text, **kwargs) -> tuple[StartedTurn, TurnStarted, TurnDone]:
    started = start_turn(store, engine, session=session, profile=profile, text=text, **kwargs)
    return (started, *run(started))


def fill_up(store: SessionStore, engine: Engine, profile: Profile, question: str) -> Session:
    """Long turns (the first with a pinned file) until sending `question` would fill the
    context to `compact_at`: the session the next turn finds full."""
    session = None
    for i in range(30):
        if session is not None:
            planned = turn_messages(store, session, profile, question)
            if needs_room(fill(engine, planned, profile), profile):
                return session
        files = (file("geometry.py", pinned=True),) if i == 0 else ()
        started, _, _ = turn(store, engine, profile, session, f"Step {i}. " + LONG * 3, attachments=files)
        session = started.session
    raise AssertionError("the context never filled")


def history_tokens(engine: Engine, store: SessionStore, session: Session) -> int:
    """The tokens of the conversation the model sees, up to where a next message would begin."""
    diag = diagnostics(engine)
    view = engine_messages(session.system_prompt, store.messages(session.id), view_start=session.view_start)
    last = view[-1]
    return len(
        follow_up_prefix(
            diag.tokens_for,
            view[:-1],
            last.content,
            reasoning=last.reasoning_content,
            variables=diag.template_variables(),
        )
    )


def reuse(started: TurnStarted) -> float:
    return started.cached_tokens / started.prompt_tokens


def test_an_overflowing_conversation_continues_through_compaction(model: Path, tmp_path: Path) -> None:
    profile = small_profile(model)
    lines: list[str] = []
    with SessionStore(tmp_path / "s.db") as store:
        with Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine:
            engine.load()
            session = fill_up(store, engine, profile, "What next?")
            before = export(store, session.id)
            history = history_tokens(engine, store, session)
            started, began, done = turn(
                store, engine, profile, session, "What next?", on_compact=lines.append
            )
            assert len(lines) == 1 and lines[0].startswith("the context is ")
            assert lines[0].endswith(f"% full: compacting session {session.id[:8]} into a continuation ...")
            cont = started.session
            assert started.compacted_from is not None and started.compacted_from.id == session.id
            assert cont.continues and cont.parent_session_id == session.id and started.created
            assert export(store, session.id) == before  # the original holds every message, as it was
            messages = store.messages(cont.id)
            request, summary = messages[0], messages[1]
            assert request.content == profile.context.summary_prompt
            assert request.attachments == (file("geometry.py", pinned=True),)  # carried
            assert summary.role == "assistant" and summary.content.strip()
            # the summary request was a continuation of the cached history
            assert summary.stats["cached_tokens"] >= 0.95 * history
            if model.name == "qwen35.gguf":  # the switch turned thinking off for the summary
                assert summary.stats["reasoning_tokens"] == 0 and not summary.reasoning
            # the last turns, word for word (a turn whose reply has no answer is left to the summary)
            kept, original = messages[2:-2], store.messages(session.id)
            assert [(m.role, m.content, m.reasoning) for m in kept] == [
                (m.role, m.content, m.reasoning) for m in original[len(original) - len(kept) :]
            ]
            assert len(kept) % 2 == 0 and (kept or not complete_turns(original[-2:]))
            assert messages[-2].content == "What next?" and done.text == messages[-1].content
            # the turn right after the compaction resumed from the continuation's warm state
            assert reuse(began) >= 0.9, began
            continuation = engine_messages(cont.system_prompt, messages)
        # a new engine (an empty RAM tier, a new context) finds the checkpoints on disk
        with Engine(profile, checkpoint_root=tmp_path / "ckpt") as fresh:
            fresh.load()
            _, began, _ = turn(store, fresh, profile, store.get_session(cont.id), "And then?")
            assert began.source == "disk" and reuse(began) >= 0.9, began
            assert len(continuation) >= 4


def test_a_compaction_resumes_warm_in_a_new_engine(model: Path, tmp_path: Path) -> None:
    """`compact` alone (`sessions compact`, the TUI's /compact): the continuation's prefill is
    checkpointed at once, so its first turn, in another engine, resumes from the disk."""
    profile = small_profile(model)
    with SessionStore(tmp_path / "s.db") as store:
        with Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine:
            engine.load()
            session = fill_up(store, engine, profile, "What next?")
            events: list = []
            done = compact(store, engine, session, profile, focus="the retries", on_event=events.append)
            began = next(e for e in events if isinstance(e, TurnStarted))
            assert began.cached_tokens >= 0.95 * history_tokens(engine, store, session)
            assert done.stats.cached_tokens == began.cached_tokens and done.warmed_tokens
            assert store.messages(done.session.id)[0].content.endswith("\n\nFocus on: the retries")
        with Engine(profile, checkpoint_root=tmp_path / "ckpt") as fresh:
            fresh.load()
            _, began, _ = turn(store, fresh, profile, done.session, "What next?")
            assert began.source == "disk" and reuse(began) >= 0.9, began


def test_an_overflowing_conversation_continues_through_drop_oldest(model: Path, tmp_path: Path) -> None:
    profile = small_profile(model)
    lines: list[str] = []
    with SessionStore(tmp_path / "s.db") as store:
        with Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine:
            engine.load()
            session = fill_up(store, engine, profile, "What next?")
            before = store.messages(session.id)
            started, began, _ = turn(
                store,
                engine,
                profile,
                session,
                "What next?",
                on_compact=lines.append,
                when_full="drop_oldest",
            )
            assert len(lines) == 1 and "dropping the oldest turns of session" in lines[0]
            dropped = started.session
            assert dropped.id == session.id and started.compacted_from is None
            assert dropped.view_start > 0
            after = store.messages(session.id)
            assert after[: len(before)] == before  # every message is still stored
            assert after[dropped.view_start].role == "user"
            # the model's view: the system prompt, the pinned file carried, then the turns in view
            view = engine_messages(dropped.system_prompt, after, view_start=dropped.view_start)
            first_user = next(m for m in view if m.role == "user")
            assert first_user.content.startswith(render_block(file("geometry.py")))
            planned = turn_messages(store, dropped, profile, "x")
            assert fill(engine, planned, profile).fraction < profile.context.compact_at
            assert reuse(began) >= 0.9, began  # the new view was prefilled and checkpointed first
        with Engine(profile, checkpoint_root=tmp_path / "ckpt") as fresh:
            fresh.load()
            _, began, _ = turn(store, fresh, profile, store.get_session(session.id), "And then?")
            assert began.source == "disk" and reuse(began) >= 0.9, began


def test_a_cancelled_or_failed_compaction_changes_nothing(smollm2_path: Path, tmp_path: Path) -> None:
    profile = small_profile(smollm2_path)
    with (
        SessionStore(tmp_path / "s.db") as store,
        Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine,
    ):
        engine.load()
        session = fill_up(store, engine, profile, "What next?")
        before = everything(store)
        cancel = threading.Event()

        def cancel_after_first_token(event: object) -> None:
            if isinstance(event, TokenDelta):
                cancel.set()

        with pytest.raises(CompactionFailed, match="cancelled"):
            compact(store, engine, session, profile, cancel=cancel, on_event=cancel_after_first_token)
        assert everything(store) == before
        # a continuation that could not hold the summary and the next message
        huge = ChatMessage("user", LONG * 30)
        assert engine.preview([huge]).prompt_tokens < 1024  # the message alone would fit
        with pytest.raises(CompactionFailed, match="more than the 1,024-token context holds"):
            compact(store, engine, session, profile, pending=huge)
        assert everything(store) == before
        # a summary and pinned files that would fill the continuation to compact_at at once
        wordy = dataclasses.replace(
            profile, context=dataclasses.replace(profile.context, compact_at=0.3, summary_prompt=LONG * 8)
        )
        with pytest.raises(CompactionFailed, match="context.compact_at"):
            compact(store, engine, session, wordy)
        assert everything(store) == before
        # a cancel while the turn waits for it: start_turn stores nothing either
        stop = threading.Event()
        with pytest.raises(CompactionFailed):
            start_turn(
                store,
                engine,
                session=session,
                profile=profile,
                text="What next?",
                cancel=stop,
                on_compact=lambda _line: stop.set(),
            )
        assert everything(store) == before


def test_refuse_says_which_setting_to_change(smollm2_path: Path, tmp_path: Path) -> None:
    profile = small_profile(smollm2_path, when_full="refuse")
    with (
        SessionStore(tmp_path / "s.db") as store,
        Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine,
    ):
        engine.load()
        session = fill_up(store, engine, profile, "What next?")
        # below the context: refuse lets it run, as before compaction existed
        _, began, _ = turn(store, engine, profile, session, "What next?")
        assert began.prompt_tokens < 1024
        before = everything(store)
        with pytest.raises(Exception, match=r'context\.when_full is "refuse"'):
            start_turn(store, engine, session=session, profile=profile, text=LONG * 12)
        assert everything(store) == before


def test_files_only_a_compaction_makes_room_for_are_not_refused(smollm2_path: Path, tmp_path: Path) -> None:
    profile = small_profile(smollm2_path)
    big = file("steps.py", "".join(f"step_{i} = run({i}, retries=2)\n" for i in range(40)))
    with (
        SessionStore(tmp_path / "s.db") as store,
        Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine,
    ):
        engine.load()
        session = fill_up(store, engine, profile, "What next?")
        planned = turn_messages(store, session, profile, "Read this.", attachments=(big,))
        room = (
            1024 - engine.preview(planned.messages[:-1] + [ChatMessage("user", "Read this.")]).prompt_tokens
        )
        assert engine.count_tokens(render_block(big)) > room  # more than the full context has left
        started, _, _ = turn(store, engine, profile, session, "Read this.", attachments=(big,))
        assert started.compacted_from is not None and started.compacted_from.id == session.id
        assert store.messages(started.session.id)[-2].attachments == (big,)
