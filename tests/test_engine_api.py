"""The engine's public surface (`EngineAPI`): the real engine and the layout tests' fake both
implement it with the same signatures, and the app reaches nothing else.

The fake feeds the TUI tests; if it drifted from the real engine (a renamed keyword, a missing
method), those tests would pass against an engine that no longer exists. The app imports only
the engine's public modules, and the benchmark only those and `velo_chat.engine.diagnostics`:
the import guard below reads every import of those files."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from velo_chat.engine import EngineAPI, TurnHandle, events
from velo_chat.engine.api import Turn
from velo_chat.engine.diagnostics import NoDiagnostics, diagnostics
from velo_chat.engine.engine import Engine
from velo_chat.engine.remote.engine import RemoteEngine

from devkit.fake_engine import FakeEngine, FakeScript

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


def test_the_in_process_engine_has_no_public_member_beyond_the_protocol():
    """What the benchmark and the tests measure with is on `Diagnostics`, not on `Engine`."""
    public = {name for name in dir(Engine) if not name.startswith("_")}
    assert public == set(_members(EngineAPI))


def test_an_engine_without_measurement_hooks_says_so():
    with pytest.raises(NoDiagnostics, match="FakeEngine has no measurement hooks"):
        diagnostics(FakeEngine(None, FakeScript()))


# -- the import guard ----------------------------------------------------------------------------

ROOTS = frozenset(
    {
        "velo_chat.engine",
        "velo_chat.engine.config",
        "velo_chat.engine.fit",
        "velo_chat.engine.setup",
        "velo_chat.engine.bench",
    }
)
"""The engine modules the app may import: its public surface and its service packages."""
MEASURING = ROOTS | {"velo_chat.engine.diagnostics"}
"""What the benchmark (`engine/bench`, `benchmarks/`) may import besides: the measurement hooks."""


def _module_path(root: Path, module: str) -> Path | None:
    """The file or package folder of a `velo_chat.*` module under `root`, or None."""
    parts = module.split(".")
    if parts[0] != "velo_chat" or len(parts) < 2:
        return None
    base = root.joinpath(*parts[1:])
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return base if (base / "__init__.py").is_file() else None


def _imported_modules(path: Path, package: str, root: Path) -> list[tuple[int, str]]:
    """Each module a file imports, with its line: `import a.b`; `from a.b import c` as `a.b`,
    or as `a.b.c` where `c` is a module of `a.b` (importing a submodule through its package
    is importing it); relative imports resolved against `package`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                module = ".".join(
                    parts[: len(parts) - node.level + 1] + ([node.module] if node.module else [])
                )
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                found.append((node.lineno, sub if _module_path(root, sub) is not None else module))
    return found


def engine_import_violations(path: Path, package: str, allowed: frozenset[str], root: Path) -> list[str]:
    """`file:line module` for each import of an engine module outside `allowed` (a package may
    import its own modules)."""
    bad = []
    for line, module in _imported_modules(path, package, root):
        if not (module == "velo_chat.engine" or module.startswith("velo_chat.engine.")):
            continue
        if module in allowed or module == package or module.startswith(package + "."):
            continue
        bad.append(f"{path.relative_to(root).as_posix()}:{line} {module}")
    return bad


def _package_of(path: Path, root: Path) -> str:
    """The package a module file belongs to (`app/commands/doctor.py`: velo_chat.app.commands)."""
    return ".".join(["velo_chat", *path.relative_to(root).parts[:-1]])


def _guarded_files(root: Path) -> list[tuple[Path, str, frozenset[str]]]:
    app = sorted((root / "app").rglob("*.py"))
    bench = sorted((root / "engine" / "bench").rglob("*.py"))
    scripts = sorted((root / "benchmarks").rglob("*.py"))
    return [
        *((f, _package_of(f, root), ROOTS) for f in app),
        *((f, _package_of(f, root), MEASURING) for f in bench),
        *((f, "benchmarks", MEASURING) for f in scripts),
    ]


def test_the_app_and_the_benchmark_import_only_the_engine_s_public_modules():
    """The app (TUI, CLI, commands) imports the engine only through `velo_chat.engine` and its
    service packages (`config`, `fit`, `setup`, `bench`); `engine/bench` and `benchmarks/` also
    through `velo_chat.engine.diagnostics`. Never an internal module such as `engine.engine`,
    `llama.model` or `config.locations`, directly or through its package."""
    files = _guarded_files(ROOT)
    assert len(files) > 50
    offenders = [v for f, pkg, allowed in files for v in engine_import_violations(f, pkg, allowed, ROOT)]
    assert offenders == []


def test_the_import_guard_finds_a_planted_violation(tmp_path):
    """The guard above can fail: a copy of the layout with files that reach inside."""
    for name in (
        "engine/__init__.py",
        "engine/engine.py",
        "engine/diagnostics.py",
        "engine/config/__init__.py",
        "engine/config/locations.py",
        "engine/llama/__init__.py",
        "engine/llama/model.py",
        "engine/bench/__init__.py",
        "engine/bench/result.py",
        "app/__init__.py",
        "app/errors.py",
        "app/commands/__init__.py",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "app/commands/bad.py").write_text(
        "from velo_chat.engine import ChatMessage, EngineAPI\n"
        "from velo_chat.engine.config import Profile, locations\n"
        "from velo_chat.engine.engine import Engine\n"
        "from velo_chat.engine.diagnostics import diagnostics\n"
        "import velo_chat.engine.llama.model\n"
        "from ..errors import UserError\n"
    )
    (tmp_path / "engine/bench/run.py").write_text(
        "from .. import EngineAPI\n"
        "from ..diagnostics import diagnostics\n"
        "from . import result\n"
        "from ..llama.model import LlamaModel\n"
    )
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks/probe.py").write_text(
        "from velo_chat.engine.diagnostics import LlamaModel\nfrom velo_chat.engine import engine\n"
    )
    found = [
        v
        for f, pkg, allowed in _guarded_files(tmp_path)
        for v in engine_import_violations(f, pkg, allowed, tmp_path)
    ]
    assert found == [
        "app/commands/bad.py:2 velo_chat.engine.config.locations",
        "app/commands/bad.py:3 velo_chat.engine.engine",
        "app/commands/bad.py:4 velo_chat.engine.diagnostics",
        "app/commands/bad.py:5 velo_chat.engine.llama.model",
        "engine/bench/run.py:4 velo_chat.engine.llama.model",
        "benchmarks/probe.py:2 velo_chat.engine.engine",
    ]


def test_the_public_modules_export_what_they_name_and_every_event():
    import velo_chat.engine.bench
    import velo_chat.engine.config
    import velo_chat.engine.diagnostics
    import velo_chat.engine.fit
    import velo_chat.engine.setup

    for module in (
        velo_chat.engine,
        velo_chat.engine.config,
        velo_chat.engine.fit,
        velo_chat.engine.setup,
        velo_chat.engine.bench,
        velo_chat.engine.diagnostics,
    ):
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert missing == [], module.__name__
    assert set(events.__all__) <= set(velo_chat.engine.__all__)


def test_importing_the_engine_s_public_modules_loads_no_llama_cpp():
    """The app imports these at start; llama.cpp is loaded only when an engine is made."""
    code = (
        "import sys\n"
        "import velo_chat.engine, velo_chat.engine.config, velo_chat.engine.fit, velo_chat.engine.setup\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'llama_cpp'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_apply_takes_checkpoint_and_sampling_settings_at_once_and_keeps_the_context(smollm2_path, tmp_path):
    """A saved profile takes effect without a reload: checkpoints switched off save nothing
    on the next turn, switched on again they save; the context settings stay as loaded."""
    import dataclasses

    from velo_chat.engine import ChatMessage

    from tests.support.engine_helpers import test_profile

    base = test_profile(smollm2_path)
    messages = [ChatMessage("user", "Name three colours.")]
    with Engine(base, checkpoint_root=tmp_path / "ck") as engine:
        engine.load()
        diag = diagnostics(engine)
        assert diag.complete(messages, max_tokens=4).stats.checkpoint.saved
        off = dataclasses.replace(
            base,
            checkpoints=dataclasses.replace(base.checkpoints, enabled=False),
            context=dataclasses.replace(base.context, n_ctx=4096),
            sampling=dataclasses.replace(base.sampling, max_tokens=3),
        )
        engine.apply(off)
        diag.reset()
        deltas: list = []
        done = diag.complete(messages, deltas=deltas)
        assert done.stats.checkpoint.saved == () and done.stats.decode_tokens <= 3
        # `deltas` receives every token of the turn, in order
        assert len(deltas) == done.stats.decode_tokens and "".join(d.text for d in deltas) == done.text
        assert engine.profile.context == base.context and engine.info.n_ctx == 2048
        engine.apply(base)
        diag.reset()
        assert diag.complete(
            messages + [ChatMessage("assistant", "Red."), ChatMessage("user", "More?")], max_tokens=4
        ).stats.checkpoint.saved
