"""`velo-chat requantize`: a copy of a GGUF with its weights requantized (Q8_0), for the CPU.

What it is for, and what it costs, is in `engine/setup/requantize.py` and docs/speculation.md:
on a CPU a Q8_0 model's batches (prefill, speculation's verify batches) run on ggml's
multi-token kernels, which Q4_1 and some other types do not have.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from velo_chat.engine import RequantizeError
from velo_chat.engine.setup import derived_name, require_default_model, requantize_model

from ..errors import UserError


def run(args: argparse.Namespace) -> int:
    source = require_default_model() if args.model == "default" else Path(args.model).expanduser()
    target = Path(args.out).expanduser() if args.out else source.with_name(derived_name(source, args.to))
    if target.exists() and not args.overwrite:
        raise UserError(f"{target} exists; pass --overwrite to replace it, or --out to write elsewhere")
    show = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if show:
            sys.stderr.write(f"\r\033[Krequantizing {source.name} to {args.to}: tensor {done:,}/{total:,}")
            sys.stderr.flush()

    try:
        requantize_model(source, target, args.to, progress=progress)
    except RequantizeError as exc:
        raise UserError(str(exc)) from None
    finally:
        if show:
            sys.stderr.write("\r\033[K")
    mib = target.stat().st_size / 2**20
    print(f'wrote {target} ({mib:,.0f} MiB); use it with [model] path = "{target}"', file=sys.stderr)
    return 0
