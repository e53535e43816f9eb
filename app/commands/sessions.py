"""`velo-chat sessions list|show|export|import|fork|delete|rename|search|compact|undo`."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

from velo_chat.engine.config import create_private
from velo_chat.store import SessionStore
from velo_chat.store.input_text import decode_text

from ..errors import UserError
from ..tools.call_line import plain_line
from .common import load_engine, open_store, replaced_warning, resolve_profile, say_waiting


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _write(text: str, output: str | None) -> None:
    """Print, or write `-o FILE`: a new file is created 0600 (an export is a whole conversation);
    a file that already exists is overwritten in place and keeps its mode, since the user chose
    it (it may be a FIFO, /dev/stdout, or a file they share on purpose)."""
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    try:
        fd = create_private(Path(output), os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror}") from None
    print(f"wrote {output}", file=sys.stderr)


def _list(store: SessionStore, args: argparse.Namespace) -> None:
    sessions = store.list_sessions()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": s.id,
                        "title": s.title,
                        "profile": s.profile,
                        "created_at": s.created_at,
                        "updated_at": s.updated_at,
                    }
                    for s in sessions
                ],
                ensure_ascii=False,
                indent=2,
            )
        )
        return
    for s in sessions:
        print(f"{s.id[:8]}  {_when(s.updated_at)}  {s.profile:<14} {s.title or '(untitled)'}")


def _show(store: SessionStore, args: argparse.Namespace) -> None:
    session_id = store.resolve_id(args.id)
    s = store.get_session(session_id)
    print(f"# {s.title or '(untitled)'}  [{s.id}]  profile {s.profile}")
    if s.continues and s.parent_session_id:
        print(f"(continues session {s.parent_session_id[:8]} from a summary of it)")
    for m in store.messages(session_id):
        if s.view_start and m.position == s.view_start:
            print(
                "\n-- the model's view begins here: the messages above left its context when it was full --"
            )
        flag = "" if m.status == "complete" else f" ({m.status})"
        # the position is what `ask --edit N` / `--regenerate N` take; the id what `fork --at` takes
        print(f"\n## [{m.position}] {m.role} (message id {m.id}){flag}")
        for a in m.attachments:
            pin = ", pinned" if a.pinned else ""
            print(f"📎 {a.path} ({a.size:,} bytes, sha256 {a.sha256[:12]}{pin})")
        print(m.content)
        results = {r.call_index: r for r in m.tool_results}
        for i, call in enumerate(m.tool_calls):  # a step of a tool loop: what each call did
            print(f"🔧 {plain_line(call, results.get(i))}")


def _compact(store: SessionStore, args: argparse.Namespace) -> None:
    """`sessions compact ID [--focus TEXT]`: the continuation's id on stdout, the summary turn's
    numbers in one line on stderr. Holds the session's writer lock while the summary runs, as a
    turn does; Ctrl-C stops it with nothing stored."""
    from ..compaction import compact  # the engine's turn machinery, only for this action

    session = store.get_session(store.resolve_id(args.id))
    profile = resolve_profile(args.profile or session.profile)
    engine = load_engine(profile, None, quiet=False)
    try:
        with store.writer(session.id, on_wait=say_waiting(session.id)):
            done = compact(store, engine, session, profile, focus=args.focus)
    finally:
        engine.close()
    stats = done.stats
    turns = f"{done.kept_turns} turn" + ("" if done.kept_turns == 1 else "s")
    print(done.session.id)
    print(
        f"velo-chat: session {done.session.id[:8]} continues {session.id[:8]}: a summary of "
        f"{stats.decode_tokens:,} tokens, then {turns} kept word for word; the summary turn reused "
        f"{stats.cached_tokens:,} of its {stats.prompt_tokens:,} prompt tokens and prefilled "
        f"{stats.prefill_tokens:,}",
        file=sys.stderr,
    )


def _undo(store: SessionStore, args: argparse.Namespace) -> int:
    """`sessions undo ID [--turn N] [--force]`: a line on stdout per file put back or removed; a
    file changed since the edit is one line on stderr, then the diff, and exit 2. Holds the
    session's writer lock, as a turn does: a turn running meanwhile changes the same files."""
    from ..tools.undo import undo  # only for this action

    session_id = store.resolve_id(args.id)
    with store.writer(session_id, on_wait=say_waiting(session_id)):
        done = undo(store, session_id, turn=args.turn, force=args.force_undo)
    if done.nothing:
        which = "" if args.turn is None else f" from turn {args.turn} on"
        print(f"velo-chat: nothing to undo in session {session_id[:8]}{which}", file=sys.stderr)
        return 0
    for path in done.restored:
        print(f"restored {path}")
    for path in done.removed:
        print(f"removed {path}")
    for conflict in done.conflicts:
        print(
            f"velo-chat: {conflict.path} changed since the edit; not restored (--force restores it)",
            file=sys.stderr,
        )
        sys.stderr.write(conflict.diff)
    return 2 if done.conflicts else 0


def run(args: argparse.Namespace) -> int:
    with open_store() as store:
        action = args.sessions_command
        if action == "undo":
            return _undo(store, args)
        if action == "list":
            _list(store, args)
        elif action == "show":
            _show(store, args)
        elif action == "export":
            session_id = store.resolve_id(args.id)
            if args.format == "json":
                text = json.dumps(store.export_json(session_id), ensure_ascii=False, indent=2)
            else:
                text = store.export_markdown(session_id)
            _write(text, args.output)
        elif action == "import":
            try:
                data = Path(args.file).read_bytes()
            except OSError as exc:
                raise UserError(f"cannot read {args.file}: {exc.strerror}") from None
            # The input rules of `ask`: NUL bytes refuse (exit 2, nothing stored); bytes that
            # are not UTF-8 become U+FFFD with a warning; "\ud800" escapes become U+FFFD in
            # the store.
            clean = decode_text(data, args.file)
            s = store.import_json(clean.text)
            warning = replaced_warning(args.file, clean)
            if warning:
                print(warning, file=sys.stderr)
            print(s.id)
        elif action == "fork":
            session_id = store.resolve_id(args.id)
            at = args.at
            if at is None:
                messages = store.messages(session_id)
                if not messages:
                    raise UserError("the session has no messages to fork from")
                at = messages[-1].id
            print(store.fork(session_id, at).id)
        elif action == "delete":
            session_id = store.resolve_id(args.id)
            store.delete(session_id)
            print(f"deleted {session_id}", file=sys.stderr)
        elif action == "rename":
            s = store.rename(store.resolve_id(args.id), args.title)
            print(f"{s.id[:8]}  {s.title}")
        elif action == "compact":
            _compact(store, args)
        elif action == "search":
            for hit in store.search(args.query):
                title = hit.session.title or "(untitled)"
                print(f"{hit.session.id[:8]}  #{hit.message.id} {hit.message.role:<9} {title}: {hit.snippet}")
    return 0
