"""The draft source of n-gram speculation: where each recent n-gram of the session's tokens
last occurred, and what followed it there (`engine/speculation/stepper.py` verifies the drafts).

Chosen over a suffix automaton for its constant, small per-token cost in Python
(docs/speculation.md has the measurements)."""

from __future__ import annotations

from collections.abc import Sequence

MAX_MATCH_CHECK = 32
"""How far back a match found by its hash is compared to measure its real length."""

NGRAM_SIZES = (4, 6, 8)
"""The n-gram sizes indexed besides `min_match` (fewer sizes: less work per token; a longer
match is found through its last 8, 6 or 4 tokens and then measured)."""


class NgramIndex:
    """Where each n-gram of a token sequence last occurred, for n in `min_n` and the sizes of
    `NGRAM_SIZES` above it.

    `add(token)` is a few dict updates; `draft(k)` looks the sequence's suffix up, longest n
    first, and measures the match back up to `MAX_MATCH_CHECK` tokens. Keys are Python hashes
    of the n-gram tuples; a hash collision is caught by comparing the tokens before a match is
    used, and entries that point past the end (after `truncate`) are ignored."""

    def __init__(self, min_n: int) -> None:
        self.sizes = tuple(sorted({min_n, *(n for n in NGRAM_SIZES if n > min_n)}))
        self._longest_first = self.sizes[::-1]
        self.tokens: list[int] = []
        self._next: dict[int, int] = {}  # hash(n-gram) -> index of the token that followed it

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.add(t)

    def add(self, token: int) -> None:
        toks = self.tokens
        end = len(toks)  # n-grams ending here are followed by `token`
        for n in self.sizes:
            if n > end:
                break
            self._next[hash((n, *toks[end - n : end]))] = end
        toks.append(token)

    def truncate(self, n: int) -> None:
        """Forget the tokens after the first `n`."""
        del self.tokens[n:]

    def draft(self, k: int) -> tuple[list[int], int]:
        """Up to `k` tokens predicted to follow the sequence, from the longest n-gram that ends
        it and occurred before; and the length of that match. ([], 0) when there is none."""
        toks = self.tokens
        end = len(toks)
        # Every size is recorded together (`add`), so where the shortest n-gram ending the
        # sequence never occurred no longer one did either: one lookup instead of one per size
        # for the usual step of novel text, which has no match at all.
        n = self.sizes[0]
        if n < end and hash((n, *toks[end - n : end])) not in self._next:
            return [], 0
        return self.lookup(k)

    def lookup(self, k: int) -> tuple[list[int], int]:
        """`draft` without its shortcut: every indexed size looked up, longest first."""
        toks = self.tokens
        end = len(toks)
        for n in self._longest_first:
            if n >= end:
                continue
            suffix = toks[end - n : end]
            j = self._next.get(hash((n, *suffix)))
            if j is None or j >= end or toks[j - n : j] != suffix:
                continue
            length = n  # measure the whole match
            while (
                length < MAX_MATCH_CHECK
                and j - length - 1 >= 0
                and toks[j - length - 1] == toks[end - length - 1]
            ):
                length += 1
            return toks[j : j + k], length
        return [], 0
