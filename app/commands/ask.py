"""`velo-chat ask`: one turn in a stored session, streamed to stdout (or one JSON object).

A thinking model's reasoning streams to stderr and its answer to stdout, so `ask ... > out.md`
keeps only the answer; `--json` has both (`text` and `reasoning`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable

from velo_chat.engine import EngineEvent, EngineWarning, TokenDelta, TurnDone, TurnFailed
from velo_chat.store.input_text import clean_text, decode_text

from ..conversation import record, start_turn, turn_messages
from ..errors import UserError
from .common import load_engine, open_store, override_sampling, replaced_warning, resolve_profile


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


def run(args: argparse.Namespace) -> int:
    rewind = args.regenerate or args.edit_last
    if rewind and not args.session:
        raise UserError("--regenerate and --edit-last need --session ID")
    if args.regenerate and args.prompt is not None:
        raise UserError("--regenerate takes no prompt (it asks the last question again)")
    prompt, warning = (None, None) if args.regenerate else _read_prompt(args.prompt)
    with open_store() as store:
        session = store.get_session(store.resolve_id(args.session)) if args.session else None
        profile_name = args.ask_profile or args.profile or (session.profile if session else None)
        profile = override_sampling(
            resolve_profile(profile_name),
            temperature=args.temperature,
            seed=args.seed,
            max_tokens=args.max_tokens,
        )
        # Before the model loads: a session with no question to rewind to is refused at once,
        # and --regenerate asks the stored question again.
        prompt = turn_messages(store, session, profile, prompt, rewind=rewind).text
        engine = load_engine(profile, args.model, quiet=args.json)
        try:
            started = start_turn(store, engine, session=session, profile=profile, text=prompt, rewind=rewind)
            session = started.session
            done, failed = _stream(record(started.events, started.recorded), args.json)
        finally:
            engine.close()
    if failed is not None:
        raise UserError(f"the turn failed: {failed.reason}")
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
                },
                ensure_ascii=False,
            )
        )
    else:
        sys.stdout.write("\n")
    if not started.recorded.saved:  # printed above, so not lost; but say it is not stored
        raise UserError(f"the reply was printed but not saved: {started.recorded.save_error}")
    if warning:
        print(warning, file=sys.stderr)
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
