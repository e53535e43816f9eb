"""What `bench --tools` runs (`tools.py`): a small Python package with a failing test, the calls a
person fixing it makes, and the reference code that fills the conversation before the loop.

The package is written to a temporary folder for each run (`make_fixture`); the tools really run
there, so the results the loop appends are what a session would append: a listing, search hits,
files read, the tests failing (`mean` divides by one less than the count), an edit, the tests
passing. The tests run with `python3 -m unittest`, so they need nothing installed.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Final

from .. import ChatMessage, ToolCall, render_user_content
from .attach import AttachedFile

SYSTEM_PROMPT = "You fix bugs in the repository with the tools."
QUESTION = (
    "The files above are reference code. The tests of the calc package in the working folder "
    "fail: find the bug and fix it."
)
PAD_MODULES: Final = ("argparse", "inspect", "typing", "dataclasses", "pathlib")
"""Standard library modules attached, in order, to fill the conversation: real code no one wrote
for this benchmark, the same on every machine that runs the same Python."""

_STATS = '''"""Summary statistics of a list of numbers."""


def mean(values):
    """The arithmetic mean of a non-empty list."""
    return sum(values) / (len(values) - 1)


def median(values):
    """The middle value of a non-empty list (the mean of the two middle ones)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def spread(values):
    """The largest value minus the smallest."""
    return max(values) - min(values)
'''

_TESTS = """import unittest

from calc import mean, median, spread


class StatsTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

    def test_median(self):
        self.assertEqual(median([3, 1, 2]), 2)
        self.assertEqual(median([4, 1, 3, 2]), 2.5)

    def test_spread(self):
        self.assertEqual(spread([5, 1, 9]), 8)
"""

FIXTURE: Final[dict[str, str]] = {
    "README.md": "# calc\n\nSummary statistics: `mean`, `median`, `spread`.\n"
    "Run the tests with `python3 -m unittest`.\n",
    "calc/__init__.py": '"""A small statistics package."""\n\nfrom .stats import mean, median, spread\n\n'
    '__all__ = ["mean", "median", "spread"]\n',
    "calc/stats.py": _STATS,
    "tests/__init__.py": "",
    "tests/test_stats.py": _TESTS,
}

TEST_COMMAND = "python3 -m unittest"
BUG = "return sum(values) / (len(values) - 1)"
FIX = "return sum(values) / len(values)"

SCRIPT: Final = (
    ToolCall("list_files", {}),
    ToolCall("search", {"pattern": "def mean"}),
    ToolCall("read_file", {"path": "calc/stats.py"}),
    ToolCall("read_file", {"path": "tests/test_stats.py"}),
    ToolCall("run_command", {"command": TEST_COMMAND}),
    ToolCall("edit_file", {"path": "calc/stats.py", "old": BUG, "new": FIX}),
    ToolCall("run_command", {"command": TEST_COMMAND}),
    ToolCall("read_file", {"path": "calc/stats.py", "start_line": 4, "end_line": 6}),
    ToolCall("search", {"pattern": "mean", "glob": "*.md"}),
    ToolCall("read_file", {"path": "README.md"}),
)
"""One call per step, in the order a person fixing the bug makes them; arguments in the order
the tools declare them (the order the template writes them in)."""


def make_fixture(root: Path) -> Path:
    """Write `FIXTURE` under `root` (created) and return `root`."""
    for rel, text in FIXTURE.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def _source_lines(name: str) -> list[str]:
    return inspect.getsource(importlib.import_module(name)).splitlines(keepends=True)


def pad_files(lines: int) -> list[AttachedFile]:
    """The first `lines` lines of `PAD_MODULES`' sources, one file after the other."""
    out = []
    for name in PAD_MODULES:
        if lines <= 0:
            break
        kept = _source_lines(name)[:lines]
        out.append(AttachedFile(f"reference/{name}.py", "".join(kept)))
        lines -= len(kept)
    return out


def pad_lines() -> int:
    """The most lines `pad_files` can attach."""
    return sum(len(_source_lines(name)) for name in PAD_MODULES)


def opening(lines: int) -> list[ChatMessage]:
    """The conversation before the loop: the system prompt, and the question with `lines` lines
    of reference code attached."""
    content = render_user_content(pad_files(lines), QUESTION)
    return [ChatMessage("system", SYSTEM_PROMPT), ChatMessage("user", content)]
