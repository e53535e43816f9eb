"""The RAM tier of prefix checkpoints (an LRU of whole states under a byte budget), and the two
rules both tiers choose a candidate by: how much of a turn's tokens a checkpoint stands for
(`usable_prefix`) and which of several wins (`preference`).

The RAM tier keeps each state whole: cutting a state of hundreds of MB into chunks would cost
the engine's thread time before a reply, so only the disk writer, in the background, stores
states as shared chunks (`tiers.py`, `chunks.py`).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..fit.memory_guard import MemoryGuard


def usable_prefix(ckpt_tokens: np.ndarray, tokens: np.ndarray, *, exact: bool) -> int:
    """How many leading tokens of `tokens` a checkpoint can stand for (0 = none).

    At least one token of `tokens` must be left to decode (its logits start the reply)."""
    n = len(ckpt_tokens)
    limit = len(tokens) - 1
    if exact:
        if n == 0 or n > limit or not np.array_equal(ckpt_tokens, tokens[:n]):
            return 0
        return n
    m = min(n, limit)
    if m <= 0:
        return 0
    diff = np.flatnonzero(ckpt_tokens[:m] != tokens[:m])
    return int(diff[0]) if diff.size else m


def preference(n_usable: int, state_bytes: int, n_saved: int, name: str) -> tuple[int, int, int, str]:
    """Sort key of a candidate checkpoint, best first.

    The most usable tokens win. On an attention model several checkpoints often tie (a state
    saved after the prompt and one saved after the reply both cover the prompt minus its last
    token): then the smaller state wins, because a restore copies (and, from disk, reads and
    checksums) the whole state; then the one with fewer saved tokens (less to truncate); then the
    name, so that the choice never depends on the order of a dict, a directory listing or the
    LRU list."""
    return (-n_usable, state_bytes, n_saved, name)


@dataclass
class RamEntry:
    tokens: np.ndarray
    state: np.ndarray
    key: str


class RamTier:
    def __init__(self, budget_bytes: int, guard: MemoryGuard | None = None) -> None:
        """`guard`: asked before the tier grows (default: this machine's, which exists only
        where the GPU shares the RAM: engine/fit/memory_guard.py)."""
        self.budget = budget_bytes
        self.entries: collections.OrderedDict[str, RamEntry] = collections.OrderedDict()
        self.used = 0
        if guard is None:
            from ..fit.memory_guard import machine_guard  # (engine/fit imports the engine)

            guard = machine_guard()
        self.guard = guard

    def put(self, key: str, tokens: np.ndarray, state: np.ndarray) -> bool:
        size = len(state)
        if size > self.budget:
            return False
        if key in self.entries:
            self.entries.move_to_end(key)
            return True
        while self.used + size > self.budget and self.entries:
            _, old = self.entries.popitem(last=False)
            self.used -= len(old.state)
        held = [(k, len(e.state)) for k, e in self.entries.items()]
        if self.guard is not None and not self.guard.admit(size, held, self.drop):
            return False  # the memory the machine must keep free: skipped, with a warning
        self.entries[key] = RamEntry(tokens, state, key)
        self.used += size
        return True

    def best(self, tokens: np.ndarray, *, exact: bool) -> tuple[int, RamEntry | None]:
        """The entry covering the longest usable prefix of `tokens`, ties by `preference`."""
        best_key, best = None, None
        for entry in self.entries.values():
            n = usable_prefix(entry.tokens, tokens, exact=exact)
            if n == 0:
                continue
            key = preference(n, len(entry.state), len(entry.tokens), entry.key)
            if best_key is None or key < best_key:
                best_key, best = key, entry
        return (-best_key[0], best) if best_key is not None else (0, None)

    def touch(self, key: str) -> None:
        if key in self.entries:
            self.entries.move_to_end(key)

    def drop(self, key: str) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.used -= len(entry.state)
