"""Helpers the CLI commands share: which profile, opening the store, loading an engine."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
import sys
from pathlib import Path
from typing import Any

from velo_chat.engine import EngineAPI, make_engine
from velo_chat.engine.config import Profile, active_profile_name, database_path, load_profile
from velo_chat.engine.setup import BUILTIN
from velo_chat.store import SessionStore
from velo_chat.store.input_text import CleanText

from ..load_rate import LoadRate, model_bytes
from .fit_gate import check_fit


def resolve_profile(name: str | None) -> Profile:
    return load_profile(name or active_profile_name())


def open_store() -> SessionStore:
    return SessionStore(database_path())


def replaced_warning(what: str, clean: CleanText) -> str | None:
    """The warning line for input whose non-UTF-8 bytes became U+FFFD, or None.

    Commands print it once they have succeeded: the user should know their input was changed
    (but need not redo it), and a command that then fails still says exactly one line."""
    if not clean.replaced:
        return None
    noun = "byte" if clean.replaced == 1 else "bytes"
    return f"velo-chat: warning: {what}: replaced {clean.replaced} invalid UTF-8 {noun} with U+FFFD"


def override_sampling(
    profile: Profile,
    *,
    temperature: float | None = None,
    seed: int | None = None,
    max_tokens: int | None = None,
) -> Profile:
    changes: dict[str, Any] = {
        k: v
        for k, v in (("temperature", temperature), ("seed", seed), ("max_tokens", max_tokens))
        if v is not None
    }
    if not changes:
        return profile
    return dataclasses.replace(profile, sampling=dataclasses.replace(profile.sampling, **changes))


def override_thinking_budget(profile: Profile, budget_tokens: int | None) -> Profile:
    """The profile with `reasoning.budget_tokens` set for one command (None: as it is)."""
    if budget_tokens is None:
        return profile
    reasoning = dataclasses.replace(profile.reasoning, budget_tokens=budget_tokens)
    return dataclasses.replace(profile, reasoning=reasoning)


def load_engine(profile: Profile, model: str | None, *, quiet: bool) -> EngineAPI:
    """Load the profile's engine (local or remote), showing progress on stderr when it is a
    terminal. The caller closes it (`close()`)."""
    engine = make_engine(profile, model_path=model)
    label = profile.backend.base_url if profile.backend.kind == "remote" else engine_label(profile, model)
    show = not quiet and sys.stderr.isatty()
    last = [-1]
    raw = model or profile.model.path
    local = profile.backend.kind != "remote" and raw not in BUILTIN
    rate = LoadRate(model_bytes(Path(raw)) if local else None)

    def on_event(event: object) -> None:
        progress = getattr(event, "progress", None)
        if show and progress is not None and int(progress * 20) != last[0]:
            last[0] = int(progress * 20)
            speed = rate.text(progress)
            sys.stderr.write(f"\r\033[Kloading {label} {progress:4.0%}" + (f"  {speed}" if speed else ""))
            sys.stderr.flush()

    try:
        check_fit(engine)  # the memory it needs, before any is taken (--force: load anyway)
        engine.load(on_event)
    except BaseException:
        engine.close()
        raise
    finally:
        if show:
            sys.stderr.write("\r\033[K")
    return engine


def engine_label(profile: Profile, model: str | None) -> str:
    raw = model or profile.model.path
    if raw in BUILTIN:
        return "the default model" if raw == "default" else "the default model (Q8_0)"
    return raw.rstrip("/").rsplit("/", 1)[-1]


def say_waiting(session_id: str) -> Callable[[str], None]:
    """What a command prints when another process is taking a turn in the session it writes to
    (`SessionStore.writer`'s `on_wait`): one line on stderr, then it waits."""

    def say(holder: str) -> None:
        print(
            f"velo-chat: session {session_id[:8]} is taking a turn in {holder}; waiting for it to end "
            "(Ctrl-C gives up)",
            file=sys.stderr,
            flush=True,
        )

    return say
