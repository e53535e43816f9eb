"""The llama_sampler chain for a turn, built from the profile's sampling settings.

Sampling runs in C on llama.cpp's own logits: no per-token copy of the logits array into numpy.
Temperature 0 is plain greedy (deterministic); otherwise the usual chain
penalties -> top_k -> top_p -> min_p -> temperature -> dist(seed).

A tool-call grammar (`tools/grammar.py`) is checked after the draw, as llama.cpp's own common
sampler does: the chain draws, the grammar is asked about that one token, and only when it
rejects it is the grammar applied to the whole vocabulary and the draw made again among what it
allows. Applying a grammar to every candidate costs milliseconds a token on a large vocabulary
(each token's text is matched against the grammar's stacks); asking about one costs little, and
inside a call the model's own choice is almost always one the grammar allows.
"""

from __future__ import annotations

import ctypes
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..config.profile_schema import SamplingSettings
from ..tools.grammar import Grammar, check_patterns
from .context import DecodeError


def _grammar_sampler(ll: Any, grammar: Grammar, vocab: object) -> object:
    """llama.cpp's grammar sampler for `grammar` (lazy when it has triggers)."""
    if not vocab:
        raise ValueError("a grammar needs the model's vocabulary (vocab=)")
    check_patterns(grammar.triggers)
    text, root = grammar.gbnf.encode(), b"root"
    if grammar.lazy:
        patterns = (ctypes.c_char_p * len(grammar.triggers))(*(p.encode() for p in grammar.triggers))
        no_tokens = (ll.llama_token * 0)()
        sampler = ll.llama_sampler_init_grammar_lazy_patterns(
            vocab, text, root, patterns, len(grammar.triggers), no_tokens, 0
        )
    else:
        sampler = ll.llama_sampler_init_grammar(vocab, text, root)
    if not sampler:
        raise ValueError("llama.cpp rejected the tool-call grammar (its parser's error is in the log)")
    return sampler


def _addr_fn(ll: object) -> Callable[[object, int], int | None]:
    """llama_get_logits_ith returning the row's address as an int (a function pointer of its
    own, so llama-cpp-python's POINTER(c_float) result type stays as it is for everyone else)."""
    fn = ll._lib["llama_get_logits_ith"]  # type: ignore[attr-defined]
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    fn.restype = ctypes.c_void_p
    return fn  # type: ignore[no-any-return]


_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
"""`llama_token_data` as numpy lays it out (int32, float, float: 12 bytes, no padding)."""


class Sampler:
    """The chain for one turn. With a `grammar` (`tools/grammar.py`), every token it returns
    is one the grammar allows (checked after the draw, the module docstring says why); a lazy
    grammar lets everything through until a trigger matches.

    llama.cpp aborts the process (it does not raise) when the grammar is made to accept a
    token it rejects, an end-of-generation token before the grammar is complete included.
    A token this chain samples is always one the grammar allowed, so the rule for callers is:
    feed the chain only tokens it sampled (`sample`/`pick`), never tokens from elsewhere
    (a prompt, a draft that was not verified by `pick`). `recent_tokens` only reach the
    repeat penalty, never the grammar."""

    def __init__(
        self,
        settings: SamplingSettings,
        n_vocab: int,
        recent_tokens: Sequence[int] = (),
        grammar: Grammar | None = None,
        vocab: object = None,
    ) -> None:
        """`vocab`: the model's `llama_vocab` pointer, needed with a `grammar` (the grammar
        sampler reads token texts from it). Raises ValueError for a grammar llama.cpp does
        not accept (its parser's message goes to the log)."""
        from llama_cpp import llama_cpp as ll

        self._ll = ll
        self.settings = settings
        self.grammar = grammar
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = lambda s: ll.llama_sampler_chain_add(chain, s)  # noqa: E731
        s = settings
        self._grammar: object | None = None  # the grammar sampler (ours to free: not in the chain)
        if grammar is not None:
            try:
                self._grammar = _grammar_sampler(ll, grammar, vocab)
            except ValueError:
                ll.llama_sampler_free(chain)
                raise
        penalties = s.repeat_penalty != 1.0 and s.repeat_last_n > 0
        if penalties:
            penalty = ll.llama_sampler_init_penalties(n_vocab, s.repeat_last_n, s.repeat_penalty, 0.0, 0.0)
            for tok in list(recent_tokens)[-s.repeat_last_n :]:
                ll.llama_sampler_accept(penalty, tok)  # this sampler only: not the grammar
            add(penalty)
        if s.temperature <= 0.0:
            add(ll.llama_sampler_init_greedy())
            self.seed = None
        else:
            if s.top_k > 0:
                add(ll.llama_sampler_init_top_k(s.top_k))
            if s.top_p < 1.0:
                add(ll.llama_sampler_init_top_p(s.top_p, 1))
            if s.min_p > 0.0:
                add(ll.llama_sampler_init_min_p(s.min_p, 1))
            add(ll.llama_sampler_init_temp(s.temperature))
            self.seed = s.seed if s.seed >= 0 else random.SystemRandom().randrange(2**32 - 1)
            add(ll.llama_sampler_init_dist(self.seed))
        self.chain = chain
        # a chain that is greedy alone: `pick` reads the argmax straight from the logits
        self._greedy_alone = self.seed is None and not penalties
        self._row_type = ctypes.POINTER(ctypes.c_float * n_vocab)
        self._row = self._row_type if self._greedy_alone and grammar is None else None
        self._ids = np.arange(n_vocab, dtype=np.int32) if grammar is not None else None
        self.grammar_applies = 0  # draws the grammar rejected, made again over the vocabulary
        # the logits row's address -> a numpy view of it: llama.cpp keeps its logits buffer
        # between steps (it reallocates only for a batch with more outputs), so a step finds
        # the view it had instead of building one (a few microseconds of a token's budget)
        self._views: dict[int, np.ndarray] = {}
        self._logits_addr = _addr_fn(ll)

    def sample(self, ctx: object, i: int = -1) -> int:
        """Pick the next token from the logits of output `i` of the last batch (-1: the last)
        and record it in the chain's history.

        Where the chain is greedy alone (temperature 0, no repeat penalty) this is the argmax
        of the logits read in place: llama.cpp's sampler first copies the whole row into a
        candidate array, which costs a fast GPU step a visible share of its time on a large
        vocabulary (docs/results/speculation.md). The same token: both take the first of equal
        maxima, and a greedy chain keeps no history."""
        if self._grammar is not None:
            return self._sample_under_grammar(ctx, i)
        if self._row is None:
            return self._ll.llama_sampler_sample(self.chain, ctx, i)
        return int(self._logits(ctx, i).argmax())

    def _logits(self, ctx: object, i: int) -> np.ndarray:
        """Output `i`'s logits, read in place (a view of llama.cpp's buffer)."""
        addr = self._logits_addr(ctx, i)
        if not addr:
            raise DecodeError(f"no logits for output {i} of the last batch")
        view = self._views.get(addr)
        if view is None:
            if len(self._views) > 64:  # buffers came and went (batches of many outputs)
                self._views.clear()
            row = ctypes.cast(addr, self._row_type).contents
            view = self._views[addr] = np.frombuffer(memoryview(row), dtype=np.float32)
        return view

    def _sample_under_grammar(self, ctx: object, i: int) -> int:
        """Draw, ask the grammar about that token; if it rejects it, apply the grammar to every
        candidate and draw again. The chosen token goes into the chain's history and the
        grammar. The same steps on the same logits give the same token, so a turn resumed
        warm samples what a cold one does."""
        logits = self._logits(ctx, i)
        token = self._draw(logits, constrained=False)
        if not self.allows(token):
            self.grammar_applies += 1
            token = self._draw(logits, constrained=True)
        self._ll.llama_sampler_accept(self.chain, token)
        self._ll.llama_sampler_accept(self._grammar, token)
        return token

    def _draw(self, logits: np.ndarray, *, constrained: bool) -> int:
        """The chain's choice over `logits` (the grammar applied first when `constrained`),
        without recording it."""
        ll = self._ll
        if self._greedy_alone and not constrained:
            return int(logits.argmax())
        data = np.empty(len(logits), dtype=_TOKEN_DATA)
        data["id"], data["logit"], data["p"] = self._ids, logits, 0.0
        candidates = ll.llama_token_data_array(
            data.ctypes.data_as(ctypes.POINTER(ll.llama_token_data)), len(data), -1, False
        )
        if constrained:
            ll.llama_sampler_apply(self._grammar, ctypes.byref(candidates))
            if self._greedy_alone:
                return int(data["id"][int(data["logit"].argmax())])
        ll.llama_sampler_apply(self.chain, ctypes.byref(candidates))
        if candidates.selected < 0:
            raise DecodeError("the sampler chain chose no token")
        return int(data["id"][candidates.selected])

    def pick(self, ctx: object, i: int) -> int:
        """`sample(ctx, i)` for a speculation verify batch's positions (up to 17 a step)."""
        return self.sample(ctx, i)

    def allows(self, token: int) -> bool:
        """Whether the grammar lets `token` come next (always, without a grammar, or while a
        lazy grammar waits for its trigger)."""
        if self._grammar is None:
            return True
        ll = self._ll
        data = (ll.llama_token_data * 1)(ll.llama_token_data(token, 0.0, 0.0))
        candidates = ll.llama_token_data_array(data, 1, -1, False)
        ll.llama_sampler_apply(self._grammar, ctypes.byref(candidates))
        return data[0].logit != float("-inf")

    def accept(self, token: int) -> None:
        """Record `token` as the next one of the reply although the chain did not sample it
        (text the engine writes into the reply itself, such as the closing of a reasoning
        block): the grammar advances over it, a lazy one may trigger on it. A token the
        grammar does not allow raises ValueError here rather than reaching llama.cpp, which
        would abort the process."""
        if not self.allows(token):
            raise ValueError(f"token {token} does not fit the tool-call grammar at this point")
        self._ll.llama_sampler_accept(self.chain, token)
        if self._grammar is not None:
            self._ll.llama_sampler_accept(self._grammar, token)

    def close(self) -> None:
        if self.chain:
            self._ll.llama_sampler_free(self.chain)
            self.chain = None
        if self._grammar is not None:
            self._ll.llama_sampler_free(self._grammar)
            self._grammar = None

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
