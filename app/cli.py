"""`velo-chat`: the command line. With no command it opens the TUI.

Exit codes (README.md): 0 ok, 2 a user error (one line on stderr, no traceback), 1 a bug,
130 interrupted by Ctrl-C. Commands live in `app/commands/`; this module parses and dispatches.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import sys
from collections.abc import Sequence

from velo_chat.engine import DoesNotFit
from velo_chat.engine.config import log_path, setup_file_logging
from velo_chat.engine.setup import REQUANTIZE_TYPES

from .errors import USER_ERRORS

log = logging.getLogger(__name__)


def version() -> str:
    try:
        return importlib.metadata.version("velo-chat")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from source
        return "unknown"


def _bounded(kind: type, lo: float, hi: float | None = None):
    """An argparse type: a number of `kind` in [lo, hi], with a one-line error otherwise."""

    def parse(value: str):
        try:
            x = kind(value)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None
        if x < lo or (hi is not None and x > hi):
            bound = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {x}")
        return x

    return parse


_positive = _bounded(int, 1)
_nonnegative = _bounded(int, 0)
_FORCE_HELP = "load the model even if the fit check says it does not fit in memory"
_temperature = _bounded(float, 0.0, 5.0)
_seed = _bounded(int, 0, 2**32 - 1)

Subcommands = argparse._SubParsersAction  # what `add_subparsers` returns


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="velo-chat",
        description="Chat with a big local model from the terminal. No command opens the TUI.",
    )
    p.add_argument("--version", action="version", version=f"velo-chat {version()}")
    p.add_argument("--profile", help="profile to use (default: the active one)")
    p.add_argument(
        "--print-config", action="store_true", help="print the resolved profile and directories, then exit"
    )
    p.add_argument("--force", action="store_true", help=_FORCE_HELP)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_ask, _profiles, _sessions, _bench, _doctor, _fetch_model, _requantize):
        add(sub)
    return p


def _ask(sub: Subcommands) -> None:
    """`velo-chat ask`: one turn in a stored session."""
    ask = sub.add_parser("ask", help="one turn, streamed to stdout")
    ask.add_argument(
        "prompt",
        nargs="?",
        help="the message; '-' reads it from stdin (none with --session ID --tools: the session's "
        "tool loop goes on where it stopped at a call)",
    )
    which = ask.add_mutually_exclusive_group()
    which.add_argument("--session", metavar="ID", help="continue this session (id or prefix)")
    which.add_argument("--new", action="store_true", help="start a new session (the default)")
    ask.add_argument("--profile", dest="ask_profile", metavar="NAME", help="profile to use")
    ask.add_argument("--model", metavar="PATH", help="GGUF to load instead of the profile's")
    ask.add_argument("--max-tokens", type=_positive, metavar="N")
    ask.add_argument("--temperature", type=_temperature, metavar="T")
    ask.add_argument("--seed", type=_seed, metavar="S")
    ask.add_argument(
        "--thinking-budget",
        type=_nonnegative,
        metavar="N",
        help="most reasoning tokens for this turn, then the answer (0: no limit; "
        "overrides reasoning.budget_tokens)",
    )
    ask.add_argument(
        "-f",
        "--file",
        dest="files",
        action="append",
        default=[],
        metavar="PATH",
        help="attach a text file (repeatable; globs such as 'src/*.py' allowed): the model sees it "
        "before the prompt, fenced and labelled with its path",
    )
    ask.add_argument(
        "--pin",
        dest="pins",
        action="append",
        default=[],
        metavar="PATH",
        help="attach a file like --file, pinned: when the context is full it stays in the model's "
        "view (a compaction carries it into the continuation; docs/compaction.md)",
    )
    redo = ask.add_mutually_exclusive_group()
    redo.add_argument(
        "--regenerate",
        nargs="?",
        const=-1,
        type=_nonnegative,
        metavar="N",
        help="with --session: answer reply N again (the last one without N), in a fork; the session "
        "stays as it was ('sessions show ID' numbers the messages)",
    )
    redo.add_argument(
        "--edit",
        type=_nonnegative,
        metavar="N",
        help="with --session: send PROMPT in place of your message N, in a fork holding the messages "
        "before it; the session stays as it was",
    )
    redo.add_argument(
        "--edit-last", action="store_true", help="with --session: --edit with your last message"
    )
    ask.add_argument(
        "--tools",
        action="store_true",
        help="let the model read, search, edit and run commands in the working folder ([tools] in "
        "the profile; edits and commands ask on the terminal, docs/tools.md)",
    )
    ask.add_argument(
        "--yes",
        action="store_true",
        help="with --tools: allow edits and commands without asking (never anything outside the "
        "working folder)",
    )
    ask.add_argument(
        "--max-steps", type=_positive, metavar="N", help="with --tools: most tool steps (tools.max_steps)"
    )
    ask.add_argument("--json", action="store_true", help="print one JSON object at the end")
    ask.add_argument("--force", action="store_true", default=argparse.SUPPRESS, help=_FORCE_HELP)


def _profiles(sub: Subcommands) -> None:
    """`velo-chat profiles list|show`."""
    profiles = sub.add_parser("profiles", help="list or show profiles")
    psub = profiles.add_subparsers(dest="profiles_command", metavar="ACTION", required=True)
    psub.add_parser("list", help="every profile, shipped and user")
    show = psub.add_parser("show", help="a profile's resolved settings as TOML")
    show.add_argument("name")


def _sessions(sub: Subcommands) -> None:
    """`velo-chat sessions ...`: the session store."""
    sessions = sub.add_parser("sessions", help="manage stored sessions")
    ssub = sessions.add_subparsers(dest="sessions_command", metavar="ACTION", required=True)
    sl = ssub.add_parser("list", help="most recent first")
    sl.add_argument("--json", action="store_true")
    ss = ssub.add_parser("show", help="print a session's messages")
    ss.add_argument("id")
    se = ssub.add_parser("export", help="export as Markdown or JSON")
    se.add_argument("id")
    se.add_argument("--format", choices=("markdown", "json"), default="markdown")
    se.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout")
    si = ssub.add_parser("import", help="import a JSON export as a new session")
    si.add_argument("file")
    sf = ssub.add_parser("fork", help="a new session sharing the history up to a message")
    sf.add_argument("id")
    sf.add_argument(
        "--at", type=int, metavar="MESSAGE_ID", help="last message to keep (default: the last one)"
    )
    sd = ssub.add_parser("delete", help="delete a session and its messages")
    sd.add_argument("id")
    sr = ssub.add_parser("rename", help="set a session's title")
    sr.add_argument("id")
    sr.add_argument("title")
    sq = ssub.add_parser("search", help="search message text")
    sq.add_argument("query")
    sc = ssub.add_parser(
        "compact",
        help="summarize a session into a continuation that opens with the summary and its last "
        "turns (the session stays whole); prints the continuation's id",
    )
    sc.add_argument("id")
    sc.add_argument("--focus", metavar="TEXT", help="what the summary should focus on")
    sc.add_argument("--force", action="store_true", default=argparse.SUPPRESS, help=_FORCE_HELP)
    su = ssub.add_parser(
        "undo",
        help="put back the files the session's tool calls changed: the last turn that changed any, "
        "or --turn N and every later one (no git needed; docs/coding-sessions.md)",
    )
    su.add_argument("id")
    su.add_argument(
        "--turn",
        type=_nonnegative,
        metavar="N",
        help="undo the edits of turn N and later: N is the position of your message that started "
        "it, as 'sessions show ID' numbers them",
    )
    su.add_argument(
        "--force",
        dest="force_undo",
        action="store_true",
        help="also put back files changed since the edit (their changes are lost)",
    )


def _bench(sub: Subcommands) -> None:
    """`velo-chat bench`: its sections, then the speculation and busy-machine options."""
    bench = sub.add_parser("bench", help="measure prefill, decode, TTFT and engine overhead")
    bench.add_argument("--model", metavar="PATH", help="GGUF to measure instead of the profile's")
    bench.add_argument("--profile", dest="bench_profile", metavar="NAME")
    bench.add_argument(
        "--prefill-sizes",
        default="512,2048,8192",
        metavar="N,N,...",
        help="prompt sizes in tokens (capped by n_ctx)",
    )
    bench.add_argument(
        "--decode-tokens",
        type=_positive,
        metavar="N",
        help="tokens each decode run takes (default 256); with --spec, copy-edit's reply is by "
        "default the whole file (as many tokens as its prompt) and N caps it when given",
    )
    bench.add_argument("--repeats", type=_positive, default=3, metavar="N")
    bench.add_argument(
        "--resume-tokens",
        type=_positive,
        default=7680,
        metavar="N",
        help="conversation size for the resume section (cold/warm/disk TTFT)",
    )
    bench.add_argument(
        "--ckpt-sizes",
        metavar="N,N,...",
        help="also run the checkpoint-sizes section: for each conversation size, the state's bytes, "
        "what saving adds to the TTFT, the disk write, and the restore from RAM, from chunked files "
        "and from a single file, against a cold prefill",
    )
    bench.add_argument(
        "--session-turns",
        type=_positive,
        default=3,
        metavar="N",
        help="turns of the resume section's session (at least 2): the last one's TTFT cold, warm and "
        "from disk, and what each follow-up's checkpoints added in RAM and on disk",
    )
    bench.add_argument("--no-resume", action="store_true", help="skip the resume section")
    bench.add_argument(
        "--attach",
        action="store_true",
        help="also run the attach section: a coding session with a source file attached (the first "
        "lines of the standard library's argparse.py, as many as the context holds), then a "
        "follow-up's TTFT cold and from the disk checkpoints in a fresh process",
    )
    bench.add_argument(
        "--compact",
        action="store_true",
        help="also run the compaction section: a conversation filled to context.compact_at, then "
        "its summary turn's TTFT warm against a cold prefill of the same prompt, and the first "
        "follow-up in the continuation",
    )
    bench.add_argument(
        "--tools",
        action="store_true",
        help="only measure a scripted tool loop (10 steps on a small repository, the tools really "
        "run) at 8K and 32K tokens: each step's prompt reuse and TTFT, warm against cold",
    )
    bench.add_argument(
        "--tools-template",
        metavar="NAME_OR_PATH",
        help="with --tools: render with this chat template (a Jinja file, a GGUF, or a profile's "
        "model) where the model's own has no tool support",
    )
    bench.add_argument(
        "--tools-fills", default="8192,32768", metavar="N,N,...", help="with --tools: the context fills"
    )
    bench.add_argument(
        "--tools-steps", type=_bounded(int, 1, 10), default=10, metavar="N", help="with --tools: steps"
    )
    bench.add_argument(
        "--ple",
        default="",
        metavar="stock,gpu",
        help="run the benchmark once per qwen4exp PLE path (ple_gather) and compare them",
    )
    _bench_speculation(bench)
    _bench_load(bench)
    bench.add_argument("--json", action="store_true", help="print the numbers as JSON")
    bench.add_argument("--force", action="store_true", default=argparse.SUPPRESS, help=_FORCE_HELP)


def _bench_speculation(bench: argparse.ArgumentParser) -> None:
    """`velo-chat bench --spec` and the copy-edit workload's source."""
    bench.add_argument(
        "--spec",
        action="store_true",
        help="only compare decoding with and without n-gram speculation (copy-edit and novel code)",
    )
    bench.add_argument(
        "--spec-file",
        metavar="FILE",
        help="with --spec: build the copy-edit workload from this source file (about 150 lines "
        "is typical) instead of colorsys.py; a name it defines is renamed",
    )
    bench.add_argument(
        "--spec-rename",
        metavar="OLD=NEW",
        help="with --spec-file: the rename the copy-edit prompt asks for (default: the name the "
        "file defines and uses most)",
    )


def _bench_load(bench: argparse.ArgumentParser) -> None:
    """`velo-chat bench --load` (busy processes beside the decode) and fixed thread counts."""
    bench.add_argument(
        "--load",
        type=_bounded(int, 0, 1024),
        default=0,
        metavar="N",
        help="also decode beside N busy processes (e.g. one per core) and compare with the idle decode; "
        "with --spec, the speculation section runs beside them",
    )
    bench.add_argument(
        "--load-same-session",
        action="store_true",
        help="start the busy processes in velo-chat's own session instead of "
        "one of their own (like a compile in another terminal)",
    )
    bench.add_argument(
        "--load-cgroup",
        action="store_true",
        help="start the busy processes in a cgroup beside velo-chat's, as a desktop runs a "
        "compile started in another terminal tab (needs cgroup v2 and write access there)",
    )
    bench.add_argument(
        "--threads",
        dest="thread_counts",
        default="",
        metavar="N,N,...",
        help="also decode with each fixed thread count (and beside the busy processes with --load)",
    )


def _doctor(sub: Subcommands) -> None:
    """`velo-chat doctor`."""
    doctor = sub.add_parser("doctor", help="check this machine, the llama.cpp build and the model's fit")
    doctor.add_argument("--profile", dest="doctor_profile", metavar="NAME", help="profile to check")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.add_argument(
        "--warm-ple", action="store_true", help="read the PLE table into the page cache first, with progress"
    )


def _fetch_model(sub: Subcommands) -> None:
    """`velo-chat fetch-model`."""
    fetch = sub.add_parser("fetch-model", help="download and verify the embedded default model")
    fetch.add_argument("--force", action="store_true", help="download again even if present")
    fetch.add_argument("--quiet", action="store_true")


def _requantize(sub: Subcommands) -> None:
    """`velo-chat requantize`."""
    requant = sub.add_parser(
        "requantize",
        help="write a copy of a GGUF with its weights requantized (Q8_0: faster batches on a CPU)",
    )
    requant.add_argument("model", metavar="MODEL", help='a GGUF file, or "default" for the embedded model')
    requant.add_argument(
        "--to", choices=sorted(REQUANTIZE_TYPES), default="q8_0", help="the weight type (default q8_0)"
    )
    requant.add_argument("--out", metavar="PATH", help="where to write it (default: beside MODEL, renamed)")
    requant.add_argument("--overwrite", action="store_true", help="replace PATH if it exists")


def _setup_logging() -> None:
    try:
        setup_file_logging(str(log_path()))
    except OSError as exc:  # logging must never stop the app
        print(f"velo-chat: warning: cannot write the log: {exc}", file=sys.stderr)


# each subcommand's module, imported only when it runs: the TUI and a quick command do not
# load the benchmark's machinery (`bench` imports every part of the engine)
COMMAND_MODULES = {
    "ask": "ask",
    "profiles": "profiles",
    "sessions": "sessions",
    "bench": "bench",
    "fetch-model": "fetch",
    "doctor": "doctor",
    "requantize": "requantize",
}


def dispatch(args: argparse.Namespace) -> int:
    from .commands.fit_gate import forced

    if args.print_config:
        from .commands import config

        return config.print_config(args.profile)
    if args.command is None:
        from .tui import run_tui

        return run_tui(args.profile)
    command = importlib.import_module(f"{__package__}.commands.{COMMAND_MODULES[args.command]}")
    with forced(args.force):
        return int(command.run(args))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging()
    try:
        return dispatch(args)
    except USER_ERRORS as exc:
        if isinstance(exc, DoesNotFit):  # the arithmetic first, then the one-line refusal
            print(exc.report.table(), file=sys.stderr)
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"velo-chat: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("velo-chat: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `velo-chat sessions show ... | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
