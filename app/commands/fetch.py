"""`velo-chat fetch-model`: download and verify the embedded default model."""

from __future__ import annotations

import argparse
import sys

from velo_chat.engine.setup import default_model_present, fetch_default_model


def run(args: argparse.Namespace) -> int:
    already = not args.force and default_model_present()
    path = fetch_default_model(force=args.force)
    if not args.quiet or not already:
        state = "present" if already else "fetched and verified"
        print(f"default model {state}: {path}", file=sys.stderr)
    return 0
