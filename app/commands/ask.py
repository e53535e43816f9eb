"""`velo-chat ask`: one turn in a stored session, streamed to stdout (or one JSON object).

A thinking model's reasoning streams to stderr and its answer to stdout, so `ask ... > out.md`
keeps only the answer; `--json` has both (`text` and `reasoning`). `--thinking-budget N` caps
the reasoning of this turn (`reasoning.budget_tokens`, docs/thinking.md). `--file` attaches files
(app/attachments.py), `--pin` attaches them pinned; `--edit N` / `--regenerate [N]` revise a
stored session in a fork (app/conversation.py, `Revision`). A turn into a full session compacts
it, drops its oldest turns or is refused, as `context.when_full` says (docs/compaction.md), and
says so in a line on stderr."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from velo_chat.engine import (
    EngineEvent,
    EngineWarning,
    TokenDelta,
    TurnDone,
    TurnFailed,
)
from velo_chat.engine.config import Profile
from velo_chat.store import Attachment, Message
from velo_chat.store.input_text import clean_text, decode_text

from ..attachments import AttachmentLimits, read_files
from ..tools.undo import edits_after
from .ask_tools import CliTools, resume_pending, stream_steps, working_folder
from ..conversation import record, start_turn
from ..revisions import Revision, last_revision, revision_at
from ..errors import UserError
from .common import (
    load_engine,
    open_store,
    override_sampling,
    override_thinking_budget,
    replaced_warning,
    resolve_profile,
    say_waiting,
)


def _read_prompt(raw: str | None) -> tuple[str, str | None]:
    """The prompt from argv or stdin (`-`), by the input rules of `store.input_text`.

    Binary input (NUL bytes) raises `BinaryInput` (one line, exit 2), before the store is
    opened, so nothing is stored. Bytes that are not UTF-8 become U+FFFD; the warning line
    saying so is returned, for `run` to print once the turn succeeded. Stdin is read as bytes
    and decoded as UTF-8 whatever the locale; argv arrives decoded with `surrogateescape`, so
    its undecodable bytes are lone surrogates, replaced the same way."""
    if raw is None:
        raise UserError("a prompt is needed (or --regenerate with --session)")
    what = "stdin" if raw == "-" else "the prompt"
    clean = decode_text(sys.stdin.buffer.read(), what) if raw == "-" else clean_text(raw, what)
    if not clean.text.strip():
        raise UserError("the prompt is empty")
    return clean.text, replaced_warning(what, clean)


def _stream(events: Iterable[EngineEvent], quiet: bool) -> tuple[TurnDone | None, TurnFailed | None]:
    """Print the reply as it streams (unless `quiet`): the reasoning to stderr, the answer to
    stdout. Returns the final event."""
    done = failed = None
    reasoned = False  # reasoning printed on a line not yet ended
    for event in events:
        if isinstance(event, TokenDelta) and not quiet:
            if event.reasoning:
                reasoned = True
                sys.stderr.write(event.reasoning)
                sys.stderr.flush()
            if event.text:
                if reasoned:
                    sys.stderr.write("\n")
                    reasoned = False
                sys.stdout.write(event.text)
                sys.stdout.flush()
        elif isinstance(event, EngineWarning):
            sys.stderr.write(("\n" if reasoned else "") + f"velo-chat: warning: {event.message}\n")
            reasoned = False
        elif isinstance(event, TurnDone):
            done = event
        elif isinstance(event, TurnFailed):
            failed = event
    if reasoned:  # the reply ended in its reasoning
        sys.stderr.write("\n")
    return done, failed


def _revision(args: argparse.Namespace, messages: Sequence[Message]) -> Revision | None:
    """Which message `--regenerate [N]`, `--edit N` or `--edit-last` revises (None: a plain turn)."""
    if args.regenerate is not None:
        if args.regenerate == -1:
            return last_revision(messages)
        return revision_at(messages, args.regenerate, regenerate=True)
    if args.edit is not None:
        return revision_at(messages, args.edit, regenerate=False)
    if args.edit_last:
        return last_revision(messages)
    return None


def _attach(
    patterns: Sequence[str], profile: Profile, *, pinned: bool = False
) -> tuple[list[Attachment], list[str]]:
    """The `--file` (or, `pinned`, `--pin`) attachments (read before the model loads: a bad path
    costs no load), and a warning line per file whose bytes were not all UTF-8."""
    files = read_files(patterns, Path.cwd(), AttachmentLimits.from_settings(profile.attachments))
    if pinned:
        files = [
            dataclasses.replace(f, attachment=dataclasses.replace(f.attachment, pinned=True)) for f in files
        ]
    warnings = [
        f"velo-chat: warning: {f.attachment.path}: replaced {f.replaced} invalid UTF-8 bytes with U+FFFD"
        for f in files
        if f.replaced
    ]
    return [f.attachment for f in files], warnings


def _tools(
    args: argparse.Namespace, profile: Profile, session_dir: str | None
) -> tuple[Profile, CliTools | None]:
    """The profile with `--max-steps`, and the tools of this turn (None: tools are off)."""
    if args.max_steps is not None:
        profile = dataclasses.replace(
            profile, tools=dataclasses.replace(profile.tools, max_steps=args.max_steps)
        )
    if not (args.tools or profile.tools.enabled):
        return profile, None
    profile = dataclasses.replace(profile, tools=dataclasses.replace(profile.tools, enabled=True))
    return profile, CliTools.make(profile, working_folder(session_dir), assume_yes=args.yes)


def _resume(args: argparse.Namespace) -> int:
    """`ask --session ID --tools` without a prompt: the session's tool loop goes on where it
    stopped (`ask_tools.resume_pending`)."""
    with open_store() as store:
        session = store.get_session(store.resolve_id(args.session))
        profile = resolve_profile(args.ask_profile or args.profile or session.profile)
        profile = override_sampling(
            profile, temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens
        )
        profile, tools = _tools(args, profile, session.working_dir)
        assert tools is not None  # --tools
        engine = load_engine(profile, args.model, quiet=args.json)
        try:
            outcome = resume_pending(
                store,
                engine,
                session,
                profile,
                tools,
                stream_steps(_stream, args.json),
                say_waiting(session.id),
            )
        finally:
            engine.close()
    if outcome.failed:
        raise UserError(f"the turn failed: {outcome.failed}")
    last = outcome.last
    if args.json:
        print(
            json.dumps(
                {
                    "text": last.text if last else "",
                    "reasoning": last.reasoning if last else "",
                    "session_id": session.id,
                    "stats": last.stats.to_json() if last else {},
                    "steps": [s.to_json() for s in outcome.steps],
                    **({"stopped": outcome.stopped} if outcome.stopped else {}),
                },
                ensure_ascii=False,
            )
        )
    else:
        sys.stdout.write("\n")
    if outcome.stopped:
        print(f"velo-chat: the tool loop ended: {outcome.stopped}", file=sys.stderr)
    return 0


def _offer_undo(session_id: str, position: int) -> None:
    """A revision of message `position`: the files the session's tools changed after it are
    still as those later turns left them; say how to put them back (`sessions undo`)."""
    with open_store() as store:
        records = edits_after(store, session_id, position)
    if records:
        paths = sorted({r.path for r in records})
        print(
            f"velo-chat: the tools changed {len(paths)} file(s) after that message in session "
            f"{session_id[:8]}; `velo-chat sessions undo {session_id[:8]} --turn {position}` puts them back",
            file=sys.stderr,
        )


def _say(line: str) -> None:
    """What a full context makes the turn do first (compact, drop), before it runs."""
    print(f"velo-chat: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    revising = args.regenerate is not None or args.edit is not None or args.edit_last
    if revising and not args.session:
        raise UserError("--regenerate, --edit and --edit-last need --session ID")
    if args.regenerate is not None and (args.prompt is not None or args.files or args.pins):
        raise UserError(
            "--regenerate takes no prompt, no --file and no --pin (it asks the stored question again)"
        )
    if args.prompt is None and args.tools and args.session and not revising:
        return _resume(args)
    prompt, warning = (None, None) if args.regenerate is not None else _read_prompt(args.prompt)
    with open_store() as store:
        session = store.get_session(store.resolve_id(args.session)) if args.session else None
        profile_name = args.ask_profile or args.profile or (session.profile if session else None)
        profile = override_sampling(
            resolve_profile(profile_name),
            temperature=args.temperature,
            seed=args.seed,
            max_tokens=args.max_tokens,
        )
        profile = override_thinking_budget(profile, args.thinking_budget)
        # Before the model loads: a revision of a message that is not there is refused at once,
        # and --regenerate asks the stored question again with its files.
        revision = _revision(args, store.messages(session.id)) if session and revising else None
        attachments, file_warnings = _attach(args.files, profile)
        pinned, pin_warnings = _attach(args.pins, profile, pinned=True)
        attachments, file_warnings = attachments + pinned, file_warnings + pin_warnings
        if revision is not None and args.regenerate is not None:
            prompt, attachments = revision.text, list(revision.attachments)
        if prompt is None:  # --regenerate always finds a stored question (revision above)
            raise UserError("a prompt is needed")
        revise_at = revision.position if revision else None
        profile, tools = _tools(args, profile, session.working_dir if session else None)
        engine = load_engine(profile, args.model, quiet=args.json)
        outcome = None
        try:
            started = start_turn(
                store,
                engine,
                session=session,
                profile=profile,
                text=prompt,
                attachments=attachments,
                revise_at=revise_at,
                working_dir=str(Path.cwd()),
                on_wait=say_waiting(session.id) if session else None,
                on_compact=_say,
                **(tools.turn_kwargs() if tools else {}),
            )
            session = started.session
            failed: TurnFailed | str | None
            if tools is None:
                done, failed = _stream(record(started.events, started.recorded), args.json)
            else:
                outcome = tools.run(store, engine, started, profile, stream_steps(_stream, args.json))
                done, failed = outcome.last, outcome.failed
        finally:
            engine.close()
    if failed is not None:
        raise UserError(f"the turn failed: {failed if isinstance(failed, str) else failed.reason}")
    if done is None:  # the engine's contract says this cannot happen; never a bare assert
        raise RuntimeError("the turn ended without a final event")
    if args.json:
        print(
            json.dumps(
                {
                    "text": done.text,
                    "reasoning": done.reasoning,
                    "session_id": session.id,
                    "stats": done.stats.to_json(),
                    **({"compacted_from": started.compacted_from.id} if started.compacted_from else {}),
                    **({"steps": [s.to_json() for s in outcome.steps]} if outcome is not None else {}),
                    **({"stopped": outcome.stopped} if outcome is not None and outcome.stopped else {}),
                },
                ensure_ascii=False,
            )
        )
    else:
        sys.stdout.write("\n")
    if outcome is not None and outcome.stopped:
        print(f"velo-chat: the tool loop ended: {outcome.stopped}", file=sys.stderr)
    if not started.recorded.saved:  # printed above, so not lost; but say it is not stored
        raise UserError(f"the reply was printed but not saved: {started.recorded.save_error}")
    for line in [warning, *file_warnings]:
        if line:
            print(line, file=sys.stderr)
    if started.compacted_from is not None:
        print(
            f"velo-chat: the reply is in session {session.id[:8]}, which continues "
            f"{started.compacted_from.id[:8]} from a summary (that session stays whole)",
            file=sys.stderr,
        )
    if started.forked_from is not None:
        print(
            f"velo-chat: the revision is in session {session.id[:8]}, a fork of "
            f"{started.forked_from.id[:8]} (which stays as it was)",
            file=sys.stderr,
        )
        if revise_at is not None:
            _offer_undo(started.forked_from.id, revise_at)
    if started.recorded.empty_reason:
        print(f"velo-chat: warning: the reply is empty: {started.recorded.empty_reason}", file=sys.stderr)
    if done.stats.finish_reason == "interrupted":  # a remote stream cut mid-reply: kept, marked so
        raise UserError(f"the reply was cut; what arrived is saved in session {session.id[:8]} (interrupted)")
    if done.stats.finish_reason == "context":
        print(
            f"velo-chat: warning: the reply stopped at the end of the context "
            f"({done.stats.prompt_tokens + done.stats.decode_tokens:,} tokens); start a new "
            "session or raise context.n_ctx in the profile",
            file=sys.stderr,
        )
    return 0
