"""Tokens for a segmented chat prompt: scaffolding with control tokens, message text without.

Message text is tokenized with `parse_special=False`, so llama.cpp never turns it into control
(or unknown) tokens. llama.cpp still matches *user-defined* tokens in plain text, as HuggingFace
tokenizers do with non-special added tokens: those are text by the vocabulary's own account
(Gemma's whitespace runs, Qwen's `<think>`). The exception is a user-defined token that starts or
ends a sequence (BOS, EOS, EOT, end of generation): message text containing its text is split
before its first character so that it never forms that token.

Joins. llama.cpp tokenizes a string by cutting it at control tokens and tokenizing each run of
text between them on its own. A message's text usually shares such a run with the scaffolding on
either side (ChatML: "user\\n" + text; Mistral: text + " [/INST]" in older templates). To give
ordinary conversations exactly the tokens of the whole rendered string, that run — the
scaffold's text after its last protected token, the message text, the next scaffold's text
before its first protected token — is tokenized in one plain call. One rule keeps the prompt
prefix-stable: the tokens before a message's text never depend on that text. If the run's tokens
do not begin with the tokens the scaffold's tail gets on its own (a merge across the join, e.g.
"\\n" + "\\nText" -> "\\n\\n"), the run is cut at the join and the message text is tokenized on
its own. So the tokens of a conversation up to the start of any message's text are the same
whatever that text is, which is what `follow_up_prefix` and the prefix checkpoints rely on.
"""

from __future__ import annotations

import functools
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .segments import Segment

Tokenize = Callable[[str, bool], list[int]]  # (text, parse_special) -> tokens
_CACHE_MAX_CHARS = 2048
_RUN_CACHE_MIN_CHARS = 512
_RUN_CACHE_TOKENS = 1 << 21  # 8 MiB of int32


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


@dataclass(frozen=True)
class SpecialTokens:
    """The tokens message text must never produce, from the vocabulary."""

    texts: dict[int, str]  # id -> text: control, unknown, and sequence-delimiting user-defined
    breakable: tuple[str, ...]  # texts of those that plain tokenization would still match
    eats_left: frozenset[int]  # LSTRIP: llama.cpp drops the whitespace before these
    eats_right: frozenset[int]  # RSTRIP: ... and after these

    @property
    def protected_texts(self) -> list[str]:
        return sorted(set(self.texts.values()) - {""})


def scan_vocab(ll, vocab, n_vocab: int) -> SpecialTokens:
    """Read the token attributes once per model (a few hundred ms for a 250k vocabulary)."""
    delimiters = {
        int(f(vocab))
        for f in (
            ll.llama_vocab_bos,
            ll.llama_vocab_eos,
            ll.llama_vocab_eot,
            ll.llama_vocab_sep,
            ll.llama_vocab_pad,
        )
    }
    texts: dict[int, str] = {}
    breakable: list[int] = []
    eats_left, eats_right = set(), set()
    for tid in range(n_vocab):
        attr = int(ll.llama_vocab_get_attr(vocab, tid))
        if attr & (ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_UNKNOWN):
            pass
        elif attr & ll.LLAMA_TOKEN_ATTR_USER_DEFINED and (
            tid in delimiters or ll.llama_vocab_is_eog(vocab, tid)
        ):
            breakable.append(tid)
        else:
            continue
        text = (ll.llama_vocab_get_text(vocab, tid) or b"").decode("utf-8", errors="replace")
        texts[tid] = text
        if attr & ll.LLAMA_TOKEN_ATTR_LSTRIP:
            eats_left.add(tid)
        if attr & ll.LLAMA_TOKEN_ATTR_RSTRIP:
            eats_right.add(tid)
    return SpecialTokens(
        texts, tuple(texts[t] for t in breakable if texts[t]), frozenset(eats_left), frozenset(eats_right)
    )


@dataclass(frozen=True)
class _Scaffold:
    """A scaffold segment's tokens and the text at its edges that may join a message's run:
    `head` before its first protected token, `tail` after its last (None: no protected token,
    so it joins nothing)."""

    tokens: tuple[int, ...]
    head: str | None = None
    head_n: int = 0
    tail: str | None = None
    tail_n: int = 0
    eats_left: bool = False  # the first protected token strips whitespace before it
    eats_right: bool = False  # the last one strips whitespace after it


class PromptTokenizer:
    def __init__(self, tokenize: Tokenize, special: SpecialTokens) -> None:
        self._tokenize = tokenize
        self.special = special
        texts = sorted(special.breakable, key=len, reverse=True)
        self._breakable = re.compile("|".join(map(re.escape, texts))) if texts else None
        self._cached_scaffold = functools.lru_cache(maxsize=512)(self._scaffold_uncached)
        self._runs: OrderedDict[str, np.ndarray] = OrderedDict()
        self._runs_tokens = 0

    def plain(self, text: str) -> list[int]:
        """Message text: never a control/unknown token nor a sequence-delimiting token.

        Long texts are remembered (least recently used first out, `_RUN_CACHE_TOKENS` tokens in
        all): besides the prompt (`rendered.py` renders it once per turn), a turn tokenizes the
        continuations `checkpoints/save_points.py` renders and the follow-up boundary, and the
        history's text is the same in each."""
        if len(text) < _RUN_CACHE_MIN_CHARS:
            return self._plain(text)
        hit = self._runs.get(text)
        if hit is not None:
            self._runs.move_to_end(text)
            return hit.tolist()
        tokens = self._plain(text)
        if len(tokens) <= _RUN_CACHE_TOKENS:
            self._runs[text] = np.asarray(tokens, dtype=np.int32)
            self._runs_tokens += len(tokens)
            while self._runs_tokens > _RUN_CACHE_TOKENS:
                _, dropped = self._runs.popitem(last=False)
                self._runs_tokens -= len(dropped)
        return tokens

    def _plain(self, text: str) -> list[int]:
        if self._breakable is None:
            return self._tokenize(text, False)
        out: list[int] = []
        pos = 0
        for m in self._breakable.finditer(text):
            found = m.group()
            out += self._tokenize(text[pos : m.start()], False)
            out += self._tokenize(found[0], False) + self._plain(found[1:])
            pos = m.end()
        return out + self._tokenize(text[pos:], False)

    def tokens(self, segments: Sequence[Segment]) -> list[int]:
        """The prompt's tokens (without the BOS the model may want in front)."""
        out: list[int] = []
        skip = 0  # tokens of the next scaffold's head already emitted with a message's run
        for k, seg in enumerate(segments):
            if not seg.plain:
                out += self._scaffold(seg.text).tokens[skip:]
                skip = 0
                continue
            before = self._neighbour(segments, k - 1, edge="tail")
            after = self._neighbour(segments, k + 1, edge="head")
            tail = (before.tail or "") if before else ""
            tail_n = before.tail_n if before else 0
            rest = seg.text + ((after.head or "") if after else "")
            if after and after.eats_left:
                rest = rest.rstrip()
            run = tail + rest
            if before and before.eats_right:
                run = run.lstrip()
            joined = self.plain(run)
            if tail_n and joined[:tail_n] != out[-tail_n:]:
                # a merge across the join: keep the tail's tokens, the message starts afresh
                joined = self.plain(rest)
            else:
                joined = joined[tail_n:]
            out += joined
            skip = after.head_n if after else 0
        return out

    def _neighbour(self, segments: Sequence[Segment], k: int, edge: str) -> _Scaffold | None:
        """The scaffold at `k` if its `edge` ("head"/"tail") can join a message's run."""
        if 0 <= k < len(segments) and not segments[k].plain:
            scaffold = self._scaffold(segments[k].text)
            if getattr(scaffold, edge) is not None:
                return scaffold
        return None

    def _scaffold(self, text: str) -> _Scaffold:
        """Scaffolds repeat every turn ("<|im_end|>\n<|im_start|>user\n"): cache the short ones
        (the fallback's scaffolds hold message text and are seldom seen twice)."""
        if len(text) <= _CACHE_MAX_CHARS:
            return self._cached_scaffold(text)
        return self._scaffold_uncached(text)

    def _scaffold_uncached(self, text: str) -> _Scaffold:
        tokens = self._tokenize(text, True)
        texts = self.special.texts
        marks = [k for k, t in enumerate(tokens) if t in texts]
        if not marks:
            return _Scaffold(tuple(tokens))
        first, last = tokens[marks[0]], tokens[marks[-1]]
        a = text.find(texts[first])
        b = text.rfind(texts[last])
        if a < 0 or b < a or not texts[first] or not texts[last]:
            return _Scaffold(tuple(tokens))
        head, tail = text[:a], text[b + len(texts[last]) :]
        eats_left, eats_right = first in self.special.eats_left, last in self.special.eats_right
        head_n, tail_n = marks[0], len(tokens) - marks[-1] - 1
        # the edges must be exactly the runs llama.cpp tokenized; if not, they join nothing
        if (
            self.plain(head.rstrip() if eats_left else head) != tokens[:head_n]
            or self.plain(tail.lstrip() if eats_right else tail) != tokens[len(tokens) - tail_n :]
        ):
            return _Scaffold(tuple(tokens))
        return _Scaffold(tuple(tokens), head, head_n, tail, tail_n, eats_left, eats_right)
