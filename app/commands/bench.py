"""`velo-chat bench`: run the measuring instrument (`engine/bench/run.py`) and print its numbers."""

from __future__ import annotations

import argparse
import json
import sys

from velo_chat.engine.bench.remote import run_remote_bench
from velo_chat.engine.bench.run import format_table, run_bench
from velo_chat.engine.engine import Engine

from ..errors import UserError
from .common import load_engine, resolve_profile


def _sizes(raw: str, option: str = "--prefill-sizes", *, empty_ok: bool = False) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in raw.split(",") if s.strip())
    except ValueError:
        raise UserError(f"{option} must be numbers separated by commas, got {raw!r}") from None
    if (not sizes and not empty_ok) or any(s < 1 for s in sizes):
        raise UserError(f"{option} must be positive numbers, got {raw!r}")
    return sizes


def run(args: argparse.Namespace) -> int:
    sizes = _sizes(args.prefill_sizes)
    thread_counts = _sizes(args.thread_counts, "--threads", empty_ok=True)
    profile = resolve_profile(args.bench_profile or args.profile)
    quiet = args.json or not sys.stderr.isatty()

    def note(text: str) -> None:
        if not quiet:
            sys.stderr.write(f"\r\033[Kbench: {text}")
            sys.stderr.flush()

    engine = load_engine(profile, args.model, quiet=args.json)
    try:
        if isinstance(engine, Engine):
            result = run_bench(
                engine,
                profile_name=profile.name,
                prefill_sizes=sizes,
                decode_tokens=args.decode_tokens,
                repeats=args.repeats,
                resume_tokens=0 if args.no_resume else args.resume_tokens,
                load=args.load,
                load_same_session=args.load_same_session,
                thread_counts=thread_counts,
                on_progress=note,
                spec=args.spec,
            )
        else:  # a remote server: the sections it can answer
            result = run_remote_bench(
                engine,
                profile_name=profile.name,
                prefill_sizes=sizes,
                decode_tokens=args.decode_tokens,
                repeats=args.repeats,
                on_progress=note,
            )
    finally:
        engine.close()
    if not quiet:
        sys.stderr.write("\r\033[K")
    print(json.dumps(result.to_json(), indent=2) if args.json else format_table(result))
    return 0
