"""`@` path completion: how long the files take to list and to match, and what the user waits for.

    .venv/bin/python benchmarks/at_completion.py [--files 20000] [--repeats 5] [--json]

Builds a temporary tree of --files files (nested source, test, doc and package folders with
made-up but realistic names; a fixed seed, so every run builds the same tree), once as a plain
folder and once as a git repo (`git init`, `git add -A`: no commit, `ls-files --cached` reads the
index). For each of the two it times, as medians of --repeats:

- listing: a fresh `FileFinder`'s first `files()` (git ls-files, or the walk);
- first match: `match(query)` on a freshly listed finder, so no earlier query narrows it (the
  first keystroke after the `@` is the widest scan);
- typed: the query's prefixes matched one after another, as while typing it (each one narrows
  the last's candidates), the slowest of them;
- seen: in a Textual app (`App.run_test`) with a `Composer` whose root is the tree, from typing
  `@mod` to the list showing matches: the first time (the listing included, on its worker
  thread) and again once listed. Pilot waits for the app to go idle after each key, which costs
  time of its own: "keys only" is the same four keys typed with no root (no list), so what the
  completion adds is the difference.

Prints a table, or JSON with --json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from textual.app import App, ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from velo_chat.app.file_finder import FileFinder
from velo_chat.app.widgets.composer.composer import Composer

CHAT_STYLES = Path(__file__).resolve().parents[1] / "assets" / "styles" / "chat.tcss"
QUERIES = ("m", "mo", "model", "mdl", "src/app/ma", "zzz")
TYPED = "mod"  # what the user types after the `@` in the app

WORDS = (
    "app", "model", "main", "config", "parser", "render", "session", "store", "cache", "client",
    "server", "handler", "widget", "screen", "layout", "engine", "token", "stream", "utils",
    "format", "loader", "router", "schema", "query", "index", "search", "auth", "user", "admin",
    "billing", "report", "export", "import", "queue", "worker", "event", "message", "channel",
    "plugin", "theme", "style", "image", "video", "audio", "upload", "storage", "network", "http",
    "socket", "retry", "metrics", "logging", "settings", "profile", "history", "markdown", "editor",
)  # fmt: skip
TOP = ("src", "tests", "docs", "packages", "scripts", "assets", "lib", "tools")
EXTENSIONS = (".py", ".py", ".py", ".ts", ".tsx", ".md", ".json", ".yaml", ".css", ".txt")
FIXED = ("src/app/main.py", "src/app/model.py", "src/app/markdown_view.py", "README.md")


# -- the tree ---------------------------------------------------------------------------------


def folders(rng: random.Random, count: int) -> list[str]:
    """`count` nested folders, 1 to 5 deep, each under one of the usual top-level folders."""
    found = {"src/app"}
    while len(found) < count:
        depth = rng.randint(1, 5)
        found.add("/".join([rng.choice(TOP), *(rng.choice(WORDS) for _ in range(depth))]))
    return sorted(found)


def file_name(rng: random.Random) -> str:
    stem = rng.choice(WORDS)
    if rng.random() < 0.6:
        stem += rng.choice(("_", "-", "")) + rng.choice(WORDS)
    if rng.random() < 0.2:
        stem = f"test_{stem}"
    return stem + rng.choice(EXTENSIONS)


def make_tree(root: Path, n_files: int, seed: int) -> None:
    rng = random.Random(seed)
    dirs = folders(rng, max(1, n_files // 12))
    paths = set(FIXED)
    while len(paths) < n_files:
        paths.add(f"{rng.choice(dirs)}/{file_name(rng)}")
    for rel in sorted(paths):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {rel}\n")


def make_git_repo(root: Path) -> None:
    git = shutil.which("git")
    if git is None:
        raise SystemExit("git is not installed: the git half of this benchmark needs it")
    subprocess.run([git, "-C", str(root), "init", "-q"], check=True)
    subprocess.run([git, "-C", str(root), "add", "-A"], check=True)


# -- timings ----------------------------------------------------------------------------------


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def time_listing(root: Path, repeats: int) -> tuple[float, int]:
    times = []
    count = 0
    for _ in range(repeats):
        finder = FileFinder(root)
        t0 = time.perf_counter()
        count = len(finder.files())
        times.append(time.perf_counter() - t0)
    return ms(statistics.median(times)), count


def time_first_match(root: Path, query: str, repeats: int) -> tuple[float, str]:
    times = []
    best = ""
    for _ in range(repeats):
        finder = FileFinder(root)
        finder.files()
        t0 = time.perf_counter()
        found = finder.match(query)
        times.append(time.perf_counter() - t0)
        best = found[0] if found else ""
    return ms(statistics.median(times)), best


def time_typed(root: Path, query: str, repeats: int) -> float:
    slowest = []
    for _ in range(repeats):
        finder = FileFinder(root)
        finder.files()
        steps = []
        for end in range(1, len(query) + 1):
            t0 = time.perf_counter()
            finder.match(query[:end])
            steps.append(time.perf_counter() - t0)
        slowest.append(max(steps))
    return ms(statistics.median(slowest))


class ComposerApp(App[None]):
    """The composer under a transcript stand-in, styled as on the chat screen."""

    CSS_PATH = CHAT_STYLES

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def compose(self) -> ComposeResult:
        with Vertical(id="main"):
            yield Static("transcript", id="transcript")
            yield Composer(cursor_blink=False, id="composer")

    def on_mount(self) -> None:
        composer = self.query_one(Composer)
        composer.set_file_root(self.root)
        composer.focus()


def shows_matches(composer: Composer) -> bool:
    completion = composer.path_completion
    return completion is not None and completion.display and bool(completion.matches)


async def seen_once(composer: Composer, pilot: Any) -> float:
    """From the first key of `@mod` to the list showing matches (with no root: to the last key
    handled)."""
    t0 = time.perf_counter()
    await pilot.press("@", *TYPED)
    while composer.path_completion is not None and not shows_matches(composer):
        await asyncio.sleep(0.001)
    elapsed = time.perf_counter() - t0
    composer.clear()
    await pilot.pause()
    return elapsed


async def time_seen(root: Path) -> dict[str, float]:
    app = ComposerApp(root)
    async with app.run_test(size=(100, 30)) as pilot:
        composer = app.query_one(Composer)
        composer.set_file_root(None)
        keys_only = await seen_once(composer, pilot)
        composer.set_file_root(root)
        first = await seen_once(composer, pilot)
        again = await seen_once(composer, pilot)
    return {"seen_first_ms": ms(first), "seen_listed_ms": ms(again), "keys_only_ms": ms(keys_only)}


def measure(kind: str, root: Path, repeats: int) -> dict[str, Any]:
    listing_ms, count = time_listing(root, repeats)
    queries = {}
    for query in QUERIES:
        first_ms, best = time_first_match(root, query, repeats)
        typed_ms = time_typed(root, query, repeats)
        queries[f"@{query}"] = {"first_ms": first_ms, "typed_ms": typed_ms, "best": best}
    return {
        "tree": kind,
        "files": count,
        "listing_ms": listing_ms,
        "queries": queries,
        **asyncio.run(time_seen(root)),
    }


def print_table(results: list[dict[str, Any]]) -> None:
    for result in results:
        print(f"{result['tree']}: {result['files']} files, listing {result['listing_ms']} ms")
        print(f"  {'query':<14}{'first ms':>10}{'typed ms':>10}  best")
        for query, row in result["queries"].items():
            print(f"  {query:<14}{row['first_ms']:>10}{row['typed_ms']:>10}  {row['best']}")
        print(
            f"  `@{TYPED}` typed to matches shown: {result['seen_first_ms']} ms the first time "
            f"(listing included), {result['seen_listed_ms']} ms once listed; "
            f"the keys alone {result['keys_only_ms']} ms"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="at-completion-") as tmp:
        plain, repo = Path(tmp) / "plain", Path(tmp) / "repo"
        make_tree(plain, args.files, args.seed)
        make_tree(repo, args.files, args.seed)
        make_git_repo(repo)
        results = [measure("plain folder", plain, args.repeats), measure("git repo", repo, args.repeats)]
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print_table(results)


if __name__ == "__main__":
    main()
