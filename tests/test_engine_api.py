"""The engine's public surface (`EngineAPI`): the real engine and the layout tests' fake both
implement it with the same signatures, and the app reaches nothing else.

The fake feeds the TUI tests; if it drifted from the real engine (a renamed keyword, a missing
method), those tests would pass against an engine that no longer exists."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from velo_chat.engine.api import EngineAPI, TurnHandle
from velo_chat.engine.engine import Engine, Turn
from velo_chat.engine.remote.engine import RemoteEngine

from tests.support.fake_engine import FakeEngine

ROOT = Path(__file__).resolve().parent.parent


def _members(proto: type) -> list[str]:
    return sorted(
        name
        for name, value in vars(proto).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    )


def _params(fn) -> list[tuple[str, object, object]]:
    sig = inspect.signature(fn)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize(
    "impl", [Engine, RemoteEngine, FakeEngine], ids=["Engine", "RemoteEngine", "FakeEngine"]
)
@pytest.mark.parametrize("name", _members(EngineAPI))
def test_each_engine_implements_the_protocol_member_with_its_signature(impl, name):
    want = getattr(EngineAPI, name)
    have = getattr(impl, name, None)
    assert have is not None, f"{impl.__name__} lacks {name}"
    if isinstance(want, property):
        assert isinstance(have, property), f"{impl.__name__}.{name} must be a property"
        return
    assert _params(have) == _params(want), f"{impl.__name__}.{name} differs from EngineAPI.{name}"


@pytest.mark.parametrize("name", ["cancel", "close", "__iter__", "__next__"])
def test_the_turn_handle_is_what_the_protocol_says(name):
    assert _params(getattr(Turn, name)) == _params(getattr(TurnHandle, name))


def _engine_attributes_used_by(path: Path, names: set[str]) -> set[str]:
    """Attributes read off a variable called `engine` (or `host.engine`) in one file."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (isinstance(base, ast.Name) and base.id in names) or (
                isinstance(base, ast.Attribute) and base.attr in names
            ):
                used.add(node.attr)
    return used


def test_the_app_cli_and_benchmark_use_only_the_public_surface():
    """Outside engine/, an engine is only ever asked for what `EngineAPI` (plus, for the CLI's
    loader and the benchmark, `Engine`'s documented public helpers) offers: never its model,
    context, live sequence or checkpoints."""
    public = set(_members(EngineAPI)) | {name for name in dir(Engine) if not name.startswith("_")}
    files = [
        *(ROOT / "app").rglob("*.py"),
        *(ROOT / "engine" / "bench").rglob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
    ]
    offenders = {}
    for f in files:
        bad = _engine_attributes_used_by(f, {"engine"}) - public
        if bad:
            offenders[str(f.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}
    assert {"model", "ctx", "checkpoints", "live_tokens"}.isdisjoint(public)


def test_apply_takes_checkpoint_and_sampling_settings_at_once_and_keeps_the_context(smollm2_path, tmp_path):
    """A saved profile takes effect without a reload: checkpoints switched off save nothing
    on the next turn, switched on again they save; the context settings stay as loaded."""
    import dataclasses

    from velo_chat.engine.prompt.chat_template import ChatMessage

    from tests.support.engine_helpers import test_profile

    base = test_profile(smollm2_path)
    messages = [ChatMessage("user", "Name three colours.")]
    with Engine(base, checkpoint_root=tmp_path / "ck") as engine:
        engine.load()
        assert engine.complete(messages, max_tokens=4).stats.checkpoint["saved"]
        off = dataclasses.replace(
            base,
            checkpoints=dataclasses.replace(base.checkpoints, enabled=False),
            context=dataclasses.replace(base.context, n_ctx=4096),
            sampling=dataclasses.replace(base.sampling, max_tokens=3),
        )
        engine.apply(off)
        engine.reset()
        deltas: list = []
        done = engine.complete(messages, deltas=deltas)
        assert done.stats.checkpoint["saved"] == [] and done.stats.decode_tokens <= 3
        # `deltas` receives every token of the turn, in order
        assert len(deltas) == done.stats.decode_tokens and "".join(d.text for d in deltas) == done.text
        assert engine.profile.context == base.context and engine.info.n_ctx == 2048
        engine.apply(base)
        engine.reset()
        assert engine.complete(
            messages + [ChatMessage("assistant", "Red."), ChatMessage("user", "More?")], max_tokens=4
        ).stats.checkpoint["saved"]
