"""`velo-chat ask`: one turn in a stored session, streamed to stdout (or one JSON object)."""

from __future__ import annotations

import argparse
import json
import sys

from velo_chat.engine.events import TokenDelta, TurnDone, TurnFailed

from ..conversation import last_user_message, record, start_turn
from ..errors import UserError
from .common import load_engine, open_store, override_sampling, resolve_profile


def _read_prompt(raw: str | None) -> str:
    if raw is None:
        raise UserError("a prompt is needed (or --regenerate with --session)")
    text = sys.stdin.read() if raw == "-" else raw
    if not text.strip():
        raise UserError("the prompt is empty")
    return text


def run(args: argparse.Namespace) -> int:
    rewind = args.regenerate or args.edit_last
    if rewind and not args.session:
        raise UserError("--regenerate and --edit-last need --session ID")
    if args.regenerate and args.prompt is not None:
        raise UserError("--regenerate takes no prompt (it asks the last question again)")
    prompt = None if args.regenerate else _read_prompt(args.prompt)
    with open_store() as store:
        session = store.get_session(store.resolve_id(args.session)) if args.session else None
        profile_name = args.ask_profile or args.profile or (session.profile if session else None)
        profile = override_sampling(resolve_profile(profile_name), temperature=args.temperature,
                                    seed=args.seed, max_tokens=args.max_tokens)
        if rewind:
            last = last_user_message(store.messages(session.id))
            if last is None:
                raise UserError("the session has no user message to regenerate or edit")
            prompt = prompt if prompt is not None else last.content
        with load_engine(profile, args.model, quiet=args.json) as engine:
            started = start_turn(store, engine, session=session, profile=profile, text=prompt,
                                 rewind=rewind)
            session = started.session
            done: TurnDone | None = None
            failed: TurnFailed | None = None
            for event in record(started.events, started.recorded):
                if isinstance(event, TokenDelta) and not args.json:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
                elif isinstance(event, TurnDone):
                    done = event
                elif isinstance(event, TurnFailed):
                    failed = event
    if failed is not None:
        raise UserError(f"the turn failed: {failed.reason}")
    assert done is not None
    if args.json:
        print(json.dumps({"text": done.text, "session_id": session.id,
                          "stats": done.stats.to_json()}, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
    return 0
