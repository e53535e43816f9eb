"""`velo-chat bench`: run the measuring instrument (`engine/bench/run.py`) and print its numbers."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from velo_chat.engine import CgroupError, EngineAPI, SpecSourceError, ToolCall
from velo_chat.engine.bench import (
    ATTACH_LINES,
    DEFAULT_DECODE_TOKENS,
    BenchResult,
    CopyEditSource,
    check_load_cgroup,
    copy_edit_source,
    format_table,
    run_bench,
    run_remote_bench,
)
from velo_chat.engine import bench as bench_tools
from velo_chat.engine.config import Profile
from velo_chat.store.input_text import decode_text

from ..errors import UserError
from ..tools.specs import SPECS, TOOL_NAMES
from ..tools.toolbox import ToolBox
from .common import load_engine, resolve_profile


def _sizes(raw: str, option: str = "--prefill-sizes", *, empty_ok: bool = False) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in raw.split(",") if s.strip())
    except ValueError:
        raise UserError(f"{option} must be numbers separated by commas, got {raw!r}") from None
    if (not sizes and not empty_ok) or any(s < 1 for s in sizes):
        raise UserError(f"{option} must be positive numbers, got {raw!r}")
    return sizes


PLE_MODES = ("stock", "gpu")


def _ple_modes(raw: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in raw.split(",") if m.strip())
    bad = [m for m in modes if m not in PLE_MODES]
    if bad or len(set(modes)) != len(modes):
        raise UserError(f"--ple takes distinct PLE paths from {', '.join(PLE_MODES)}, got {raw!r}")
    return modes


def _check_load_cgroup(args: argparse.Namespace) -> None:
    """Refuse `--load-cgroup` in one line before the model loads where it cannot work."""
    if args.load_same_session or not args.load:
        raise UserError("--load-cgroup needs --load N and goes without --load-same-session")
    try:
        check_load_cgroup()
    except CgroupError as exc:
        raise UserError(f"--load-cgroup: {exc}") from None


def _speculating(profile: Profile) -> Profile:
    """The profile as `bench --spec` loads it: speculation enabled, batch rounding accepted.
    The section measures what enabling speculation gives on this setup, so the context is made
    as a profile that enables it makes it (a hybrid model's recurrent-state snapshots, the
    GPU's warm-up), and on a GPU or on several decode threads the "on" column speculates
    instead of drafting nothing; its first line says which guarantee that was, and each row
    whether the text came out identical (docs/speculation.md, "Measuring it")."""
    spec = dataclasses.replace(profile.speculation, enabled=True, allow_batch_rounding=True)
    return dataclasses.replace(profile, speculation=spec)


SPEC_FILE_MAX_BYTES = 1 << 20  # a copy-edit is a source file given back, not a corpus


def _spec_source(args: argparse.Namespace) -> CopyEditSource | None:
    """`--spec-file`/`--spec-rename` checked and read before the model loads: one line for
    anything wrong (a missing, binary or huge file, a rename that cannot be made)."""
    if args.spec_rename is not None and args.spec_file is None:
        raise UserError("--spec-rename goes with --spec-file")
    if args.spec_file is None:
        return None
    if not args.spec:
        raise UserError("--spec-file goes with --spec")
    path = os.path.expanduser(args.spec_file)
    try:
        size = os.path.getsize(path)
        if size > SPEC_FILE_MAX_BYTES:
            raise UserError(
                f"--spec-file {args.spec_file} is {size:,} bytes; a copy-edit workload is one "
                f"source file (at most {SPEC_FILE_MAX_BYTES:,} bytes, about 150 lines is typical)"
            )
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UserError(f"--spec-file {args.spec_file}: {exc.strerror or exc}") from None
    if b"\0" in data:  # decode_text's own line speaks of storing, which bench does not do
        raise UserError(f"--spec-file {args.spec_file} is binary (it contains NUL bytes), not source text")
    text = decode_text(data, f"--spec-file {args.spec_file}").text
    try:
        return copy_edit_source(os.path.basename(path), text, args.spec_rename)
    except SpecSourceError as exc:
        raise UserError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    sizes = _sizes(args.prefill_sizes)
    spec_source = _spec_source(args)
    thread_counts = _sizes(args.thread_counts, "--threads", empty_ok=True)
    profile = resolve_profile(args.bench_profile or args.profile)
    ple_modes = _ple_modes(args.ple) if args.ple else ()
    if ple_modes and (args.spec or profile.backend.kind == "remote"):
        raise UserError(
            "--ple compares the in-process engine's PLE paths: not with --spec or a remote profile"
        )
    if args.load_cgroup:
        _check_load_cgroup(args)
    if args.compact and (args.spec or profile.backend.kind == "remote"):
        raise UserError(
            "--compact measures the in-process engine's reuse of the history by a summary turn: "
            "not with --spec or a remote profile"
        )
    if args.session_turns < 2:
        raise UserError(
            f"--session-turns must be at least 2 (a first turn and a follow-up), got {args.session_turns}"
        )
    ckpt_sizes = _sizes(args.ckpt_sizes, "--ckpt-sizes") if args.ckpt_sizes else ()
    if ckpt_sizes and (args.spec or profile.backend.kind == "remote"):
        raise UserError(
            "--ckpt-sizes measures the in-process engine's checkpoints: not with --spec or a remote profile"
        )
    if ckpt_sizes and not profile.checkpoints.enabled:
        raise UserError(
            "--ckpt-sizes measures checkpoints, which this profile turns off (checkpoints.enabled)"
        )
    args.ckpt_size_list = ckpt_sizes
    if args.attach and (args.spec or profile.backend.kind == "remote"):
        raise UserError(
            "--attach measures the in-process engine's resume from disk in a fresh process: "
            "not with --spec or a remote profile"
        )
    if args.tools or args.tools_template:
        return _run_tools(args, profile, ple_modes)
    if args.spec and profile.backend.kind == "remote":
        raise UserError(
            "--spec measures the in-process engine's n-gram speculation: a remote profile's "
            "server drafts by its own settings (docs/remote.md)"
        )
    if args.spec:
        profile = _speculating(profile)
    if ple_modes:
        return _run_ple(args, profile, ple_modes, sizes, thread_counts)
    quiet = args.json or not sys.stderr.isatty()

    def note(text: str) -> None:
        if not quiet:
            sys.stderr.write(f"\r\033[Kbench: {text}")
            sys.stderr.flush()

    engine = load_engine(profile, args.model, quiet=args.json)
    try:
        if profile.backend.kind != "remote":  # the in-process engine (make_engine's choice)
            result = _local(
                engine,
                args,
                profile.name,
                sizes,
                thread_counts,
                on_progress=note,
                spec=args.spec,
                spec_source=spec_source,
                spec_copy_tokens=args.decode_tokens,
            )
        else:  # a remote server: the sections it can answer
            result = run_remote_bench(
                engine,
                profile_name=profile.name,
                prefill_sizes=sizes,
                decode_tokens=args.decode_tokens or DEFAULT_DECODE_TOKENS,
                repeats=args.repeats,
                on_progress=note,
            )
    finally:
        engine.close()
    if not quiet:
        sys.stderr.write("\r\033[K")
    print(json.dumps(result.to_json(), indent=2) if args.json else format_table(result))
    return 0


def _local(
    engine: EngineAPI,
    args: argparse.Namespace,
    name: str,
    sizes: tuple[int, ...],
    thread_counts: tuple[int, ...],
    **extra: Any,
) -> BenchResult:
    """The in-process engine's benchmark with the command line's settings."""
    try:
        return run_bench(
            engine,
            profile_name=name,
            prefill_sizes=sizes,
            decode_tokens=args.decode_tokens or DEFAULT_DECODE_TOKENS,
            repeats=args.repeats,
            resume_tokens=0 if args.no_resume else args.resume_tokens,
            session_turns=args.session_turns,
            ckpt_sizes=args.ckpt_size_list,
            load=args.load,
            load_same_session=args.load_same_session,
            load_cgroup=args.load_cgroup,
            thread_counts=thread_counts,
            attach_lines=ATTACH_LINES if args.attach else 0,
            compact=args.compact,
            **extra,
        )
    except CgroupError as exc:  # the busy processes could not join their cgroup
        raise UserError(f"--load-cgroup: {exc}") from None


def _run_ple(
    args: argparse.Namespace,
    profile: Profile,
    modes: tuple[str, ...],
    sizes: tuple[int, ...],
    thread_counts: tuple[int, ...],
) -> int:
    """The whole benchmark once per PLE path (the model reloaded with `ple_gather` set), then
    the two side by side: what a user with a qwen4exp model sends back (docs/ple.md)."""
    results = []
    for mode in modes:
        p = dataclasses.replace(profile, model=dataclasses.replace(profile.model, ple_gather=mode))
        engine = load_engine(p, args.model, quiet=True)
        try:  # an in-process engine: a remote profile was refused above
            results.append(
                _local(engine, args, f"{profile.name} (ple_gather = {mode})", sizes, thread_counts)
            )
        finally:
            engine.close()
    rows = [r.to_json() for r in results]
    compare = ple_comparison(modes, rows)
    if args.json:
        print(json.dumps({"ple": dict(zip(modes, rows, strict=True)), "comparison": compare}, indent=2))
    else:
        for mode, result in zip(modes, results, strict=True):
            print(f"== ple_gather = {mode}")
            print(format_table(result))
        print("== PLE paths side by side")
        print("\n".join(compare["lines"]))
    return 0


def ple_comparison(modes: tuple[str, ...], rows: list[dict]) -> dict:
    """Decode and prefill rates per PLE path, which path really ran (a refused GPU path runs
    stock and says why), and each rate against the first path's."""
    out: dict = {"lines": []}
    base = rows[0]
    for mode, row in zip(modes, rows, strict=True):
        ple = row.get("sections", {}).get("ple", {})
        decode = row["decode"]["tok_s"]
        prefill = row["prefill"][-1]["tok_s"] if row.get("prefill") else None
        ratio = decode / base["decode"]["tok_s"] if base["decode"]["tok_s"] else None
        out[mode] = {
            "ran": ple.get("mode"),
            "graph_splits": ple.get("graph_splits"),
            "decode_tok_s": decode,
            "prefill_tok_s": prefill,
            "decode_ratio": ratio,
        }
        out["lines"].append(
            f"{mode:6} ran {ple.get('mode')}: decode {decode} tok/s"
            + (f" ({ratio:.2f}x {modes[0]})" if ratio is not None and mode != modes[0] else "")
            + (f", prefill {prefill} tok/s" if prefill is not None else "")
            + f"; decode graph splits {ple.get('graph_splits')}"
            + f", graphs reused {row['decode'].get('graphs_reused')}"
            + f"; {ple.get('reason')}"
        )
    return out


def _run_tools(args: argparse.Namespace, profile: Profile, ple_modes: tuple[str, ...]) -> int:
    """`bench --tools`: the tool loop section alone (`engine/bench/tools.py`), the tools run by
    the app's ToolBox in the section's temporary folder, every call allowed."""
    if not args.tools:
        raise UserError("--tools-template goes with --tools")
    if args.spec or ple_modes or args.attach or args.compact or args.load:
        raise UserError("--tools runs alone: not with --spec, --ple, --attach, --compact or --load")
    if profile.backend.kind == "remote":
        raise UserError(
            "--tools measures the in-process engine's reuse across a tool loop's steps: "
            "not with a remote profile"
        )
    fills = _sizes(args.tools_fills, "--tools-fills")
    template = bench_tools.template_source(args.tools_template) if args.tools_template else None
    profile = bench_tools.tools_profile(profile, args.model, fills)
    quiet = args.json or not sys.stderr.isatty()

    def note(text: str) -> None:
        if not quiet:
            sys.stderr.write(f"\r\033[Kbench: {text}")
            sys.stderr.flush()

    engine = load_engine(profile, args.model, quiet=args.json)
    try:
        section = bench_tools.run_tools_bench(
            engine,
            [SPECS[name] for name in TOOL_NAMES],
            _tool_runner(profile),
            fills=fills,
            steps=args.tools_steps,
            chat_template=template,
            template_name=Path(args.tools_template).name if args.tools_template else "",
            note=note,
        )
        result = bench_tools.tools_result(engine, profile.name, section)
    finally:
        engine.close()
    if not quiet:
        sys.stderr.write("\r\033[K")
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print("\n".join([*format_table(result).splitlines()[:3], *bench_tools.tools_lines(section)]))
    return 0


def _tool_runner(profile: Profile) -> bench_tools.RunTool:
    """Runs a call as the tool loop does once it is allowed (`ToolLoop._execute`): checked, then
    run; a call that does not check out is the model's error."""
    settings = dataclasses.replace(profile.tools, offered="all")

    def run_tool(root: Path, call: ToolCall) -> str:
        box = ToolBox(root, settings)
        prepared = box.prepare(call)
        if prepared.error:
            return f"error: {prepared.error}"
        return box.run(prepared, threading.Event()).content

    return run_tool
