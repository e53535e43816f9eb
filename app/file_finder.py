"""The files a user may attach with `@` in the composer, and the fuzzy match that ranks them.

Listing: inside a git work tree the files are what git would show the user, tracked files plus
untracked ones that no ignore rule hides (`git ls-files --cached --others --exclude-standard`,
less the tracked files deleted from disk), so build outputs and virtual environments stay out
without rules of our own. Elsewhere (no git, not a work tree, git failed) a walk of the folder
that skips dot-directories, `__pycache__` and `node_modules` and does not follow symlinked
directories. Either way the list stops at `max_files`, so a home folder cannot eat the memory.

Matching: the query's characters must appear in order (a subsequence), case-insensitively. A
query without `/` is tried against the file name first: every file whose name holds the query
ranks above every file that needs its directories for it. Within a tier the score adds, for each
matched character, a bonus when it starts a word (the first character, one after `/ _ - .` or a
space, an upper-case ASCII letter after a lower-case one) and a bonus when it directly follows the
previous matched character (a run keeps the bonus of its first character, so `mod` in
`model.py` scores like three word starts), and takes one point off per character skipped
between the first and the last match. The alignment scored is the better of the tightest window
(the earliest end, then the latest start) and greedy alignments that start at word starts.
Equal scores rank the shorter path first, then by the path string, so results never depend on
listing order. A query holding `/` is matched against the whole path, in one tier.
"""

from __future__ import annotations

import heapq
import logging
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

GIT_TIMEOUT_S = 10.0
SKIPPED_DIRS = frozenset({"__pycache__", "node_modules"})
# a word starts at the first character, after a separator, or at a lower-to-upper case change
WORD_START = re.compile(r"^.|(?<=[/_\-. ]).|(?<=[a-z])[A-Z]", re.DOTALL)

BOUNDARY_BONUS = 10  # the character starts a word
CONSECUTIVE_BONUS = 6  # at least this for a character right after the previous match
GAP_PENALTY = 1  # per character skipped inside the matched span


class FileFinder:
    """The files a user may attach under `root`, listed once (lazily, on first use) and matched
    fuzzily."""

    def __init__(self, root: Path, *, max_files: int = 200_000) -> None:
        self.root = root
        self.max_files = max_files
        self._listing_lock = threading.Lock()  # one listing at a time (a worker thread lists)
        self._lock = threading.Lock()  # guards the two below; never held while listing
        self._index: _Index | None = None
        self._generation = 0  # bumped by refresh(): a listing begun before it is not kept

    @property
    def listed(self) -> bool:
        """The files are listed: `files()` and `match()` return without touching the disk."""
        return self._index is not None

    def files(self) -> list[str]:
        """Relative posix paths, sorted."""
        return list(self._ensure_index().paths)

    def match(self, query: str, limit: int = 20) -> list[str]:
        """The best `limit` paths for `query`, best first (see the module docstring)."""
        return self._ensure_index().match(query, limit)

    def refresh(self) -> None:
        """List again on next use (files were added or removed). Returns at once, even while a
        worker is listing: the UI thread calls it."""
        with self._lock:
            self._index = None
            self._generation += 1

    def _ensure_index(self) -> _Index:
        with self._listing_lock:
            with self._lock:
                if self._index is not None:
                    return self._index
                generation = self._generation
            index = _Index(list_files(self.root, self.max_files))
            with self._lock:
                if generation == self._generation:
                    self._index = index
            return index


# -- listing ----------------------------------------------------------------------------------


def list_files(root: Path, max_files: int) -> list[str]:
    """The sorted relative paths under `root`: git's view where there is one, else a walk."""
    paths = _git_files(root)
    if paths is None:
        paths = _walk_files(root, max_files)
    paths = sorted(set(paths))
    if len(paths) > max_files:
        log.info("listed only the first %d files under %s: there are more", max_files, root)
        paths = paths[:max_files]
    return paths


def _git_files(root: Path) -> list[str] | None:
    """Tracked and not-ignored untracked files, relative to `root`; None where git cannot say
    (not installed, not a work tree, failed or too slow): the caller walks instead."""
    listed = _run_git(root, "--cached", "--others", "--exclude-standard")
    if listed is None:
        return None
    deleted = _run_git(root, "--deleted") or []
    gone = set(deleted)
    return [p for p in listed if p not in gone]


def _run_git(root: Path, *options: str) -> list[str] | None:
    """`git ls-files -z OPTIONS` run in `root` (so paths are relative to it), or None."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        done = subprocess.run(
            [git, "-C", str(root), "ls-files", "-z", *options],
            cwd=root,
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("git ls-files in %s failed (%s): walking the folder instead", root, exc)
        return None
    if done.returncode != 0:
        return None  # not a work tree, most often: the walk is the normal answer then
    return [os.fsdecode(p) for p in done.stdout.split(b"\0") if p]


def _walk_files(root: Path, max_files: int) -> list[str]:
    """Files under `root` in sorted walk order, skipping dot-directories and build clutter and
    not following symlinked directories; at most `max_files` (+1, so the caller can tell the
    list was cut)."""
    found: list[str] = []
    for path in _walk(root, ""):
        found.append(path)
        if len(found) > max_files:
            break
    return found


def _walk(folder: Path, prefix: str) -> Iterator[str]:
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        log.info("cannot list %s: %s", folder, exc)
        return
    for entry in entries:
        rel = f"{prefix}{entry.name}"
        try:
            if entry.is_dir(follow_symlinks=False):
                if not _skipped_dir(entry.name):
                    yield from _walk(Path(entry.path), f"{rel}/")
            elif entry.is_file():
                yield rel
        except OSError:
            continue  # vanished or unreadable while listing


def _skipped_dir(name: str) -> bool:
    return name.startswith(".") or name in SKIPPED_DIRS


# -- matching ---------------------------------------------------------------------------------


class _Index:
    """The listed paths with their lower-case forms and names computed once, and the last
    query's candidates (a longer query narrows them instead of scanning everything again).

    Candidates are kept shortest path first (then by path), the order that breaks equal scores:
    ranking can then stop as soon as `limit` of them reach the highest score a query can have,
    since no later one can pass them. A one-letter query over thousands of files stops early."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.lower = [p.lower() for p in paths]
        self.name_starts = [p.rfind("/") + 1 for p in paths]
        self.lower_names = [low[low.rfind("/") + 1 :] for low in self.lower]
        self.shortest_first = sorted(range(len(paths)), key=lambda i: (len(paths[i]), paths[i]))
        self._last: tuple[str, list[int]] = ("", self.shortest_first)
        # word starts of names and of whole paths, found the first time a query scores them
        self._name_word_starts: dict[int, tuple[int, ...]] = {}
        self._path_word_starts: dict[int, tuple[int, ...]] = {}

    def match(self, query: str, limit: int) -> list[str]:
        if limit <= 0:
            return []
        needle = query.lower()
        if not needle:
            return self.paths[:limit]
        candidates = self._candidates(needle)
        if "/" in needle:
            ranked = self._rank(needle, candidates, whole_path=True, limit=limit)
            return [self.paths[i] for i in ranked]
        in_name, in_path = self._split_by_name(needle, candidates)
        ranked = self._rank(needle, in_name, whole_path=False, limit=limit)
        if len(ranked) < limit:  # the second tier: files that need their directories
            ranked += self._rank(needle, in_path, whole_path=True, limit=limit - len(ranked))
        return [self.paths[i] for i in ranked]

    def _candidates(self, needle: str) -> list[int]:
        """Indices of the paths holding `needle` as a subsequence, shortest path first."""
        last_query, last = self._last
        pool = last if needle.startswith(last_query) else self.shortest_first
        is_in = _subsequence_pattern(needle).match
        lower = self.lower
        found = [i for i in pool if is_in(lower[i])]
        self._last = (needle, found)
        return found

    def _split_by_name(self, needle: str, candidates: list[int]) -> tuple[list[int], list[int]]:
        is_in = _subsequence_pattern(needle).match
        names = self.lower_names
        in_name = [i for i in candidates if is_in(names[i])]
        if len(in_name) == len(candidates):
            return in_name, []
        named = set(in_name)
        return in_name, [i for i in candidates if i not in named]

    def _rank(self, needle: str, indices: list[int], *, whole_path: bool, limit: int) -> list[int]:
        """The best `limit` of `indices` (shortest path first) by (score, shorter path, path)."""
        top_score = max(BOUNDARY_BONUS, CONSECUTIVE_BONUS) * len(needle)  # nothing scores more
        at_top = 0
        keyed = []
        known_starts = self._path_word_starts if whole_path else self._name_word_starts
        for i in indices:
            path = self.paths[i]
            low = self.lower[i] if whole_path else self.lower_names[i]
            starts = known_starts.get(i)
            if starts is None:
                text = path if whole_path else path[self.name_starts[i] :]
                if len(text) != len(low):  # a character whose lower case is longer
                    text = low  # (rare): its case changes are not word starts
                starts = known_starts[i] = word_starts(text)
            score = best_score(needle, low, starts)
            keyed.append((-score, len(path), path, i))
            if score >= top_score:
                at_top += 1
                if at_top >= limit:
                    break
        return [entry[3] for entry in heapq.nsmallest(limit, keyed)]


def _subsequence_pattern(needle: str) -> re.Pattern[str]:
    """A pattern whose `match` tells whether `needle` is a subsequence: `[^x]*+x` per character,
    possessive, so a miss costs one pass over the string and no backtracking."""
    return re.compile("".join(f"[^{ch}]*+{ch}" for ch in map(re.escape, needle)))


def word_starts(text: str) -> tuple[int, ...]:
    """Where words start in `text`: the first character, one after `/ _ - .` or a space, an
    upper-case letter after a lower-case one."""
    return tuple(m.start() for m in WORD_START.finditer(text))


def best_score(needle: str, low: str, starts: tuple[int, ...]) -> int:
    """The score of the best alignment of lower-case `needle` in `low` (a lower-case text whose
    word starts are `starts`); `needle` must be a subsequence of `low`."""
    best = score_alignment(tight_alignment(needle, low), starts)
    first = needle[0]
    for start in starts:
        if low[start] == first:
            positions = greedy_alignment(needle, low, starts, start)
            if positions is not None:
                best = max(best, score_alignment(positions, starts))
    return best


def tight_alignment(needle: str, low: str) -> list[int]:
    """The earliest end of a match, then the latest start that still reaches it: the shortest
    window (fzf's first algorithm)."""
    pos = -1
    for ch in needle:
        pos = low.find(ch, pos + 1)
    positions = [0] * len(needle)
    end = pos + 1
    for j in range(len(needle) - 1, -1, -1):
        end = low.rfind(needle[j], 0, end)
        positions[j] = end
    return positions


def greedy_alignment(needle: str, low: str, starts: tuple[int, ...], start: int) -> list[int] | None:
    """From `start`, each next character taken right after the previous one where it is there,
    else at the next word start, else at its next occurrence; None if the rest does not fit."""
    positions = [start]
    pos = start
    for ch in needle[1:]:
        if pos + 1 < len(low) and low[pos + 1] == ch:
            pos += 1
        else:
            nxt = _next_word_start(ch, low, starts, pos)
            if nxt < 0:
                nxt = low.find(ch, pos + 1)
            if nxt < 0:
                return None
            pos = nxt
        positions.append(pos)
    return positions


def _next_word_start(ch: str, low: str, starts: tuple[int, ...], after: int) -> int:
    for start in starts:
        if start > after and low[start] == ch:
            return start
    return -1


def score_alignment(positions: list[int], starts: tuple[int, ...]) -> int:
    score = 0
    run_bonus = 0
    previous = -2
    for pos in positions:
        bonus = BOUNDARY_BONUS if pos in starts else 0
        if pos == previous + 1:
            run_bonus = max(run_bonus, bonus, CONSECUTIVE_BONUS)
        else:
            if previous >= 0:
                score -= GAP_PENALTY * (pos - previous - 1)
            run_bonus = bonus
        score += run_bonus
        previous = pos
    return score
