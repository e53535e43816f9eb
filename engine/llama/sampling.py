"""The llama_sampler chain for a turn, built from the profile's sampling settings.

Sampling runs in C on llama.cpp's own logits: no per-token copy of the logits array into numpy.
Temperature 0 is plain greedy (deterministic); otherwise the usual chain
penalties -> top_k -> top_p -> min_p -> temperature -> dist(seed).
"""

from __future__ import annotations

import ctypes
import random
from collections.abc import Callable, Sequence

import numpy as np

from ..config.profile_schema import SamplingSettings
from .context import DecodeError


def _addr_fn(ll: object) -> Callable[[object, int], int | None]:
    """llama_get_logits_ith returning the row's address as an int (a function pointer of its
    own, so llama-cpp-python's POINTER(c_float) result type stays as it is for everyone else)."""
    fn = ll._lib["llama_get_logits_ith"]  # type: ignore[attr-defined]
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    fn.restype = ctypes.c_void_p
    return fn  # type: ignore[no-any-return]


class Sampler:
    def __init__(self, settings: SamplingSettings, n_vocab: int, recent_tokens: Sequence[int] = ()) -> None:
        from llama_cpp import llama_cpp as ll

        self._ll = ll
        self.settings = settings
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = lambda s: ll.llama_sampler_chain_add(chain, s)  # noqa: E731
        s = settings
        if s.repeat_penalty != 1.0 and s.repeat_last_n > 0:
            add(ll.llama_sampler_init_penalties(n_vocab, s.repeat_last_n, s.repeat_penalty, 0.0, 0.0))
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
        penalties = s.repeat_penalty != 1.0 and s.repeat_last_n > 0
        self._row = ctypes.POINTER(ctypes.c_float * n_vocab) if self.seed is None and not penalties else None
        # the logits row's address -> a numpy view of it: llama.cpp keeps its logits buffer
        # between steps (it reallocates only for a batch with more outputs), so a step finds
        # the view it had instead of building one (a few microseconds of a token's budget)
        self._views: dict[int, np.ndarray] = {}
        self._logits_addr = _addr_fn(ll)
        if s.repeat_penalty != 1.0:
            for tok in list(recent_tokens)[-s.repeat_last_n :]:
                ll.llama_sampler_accept(chain, tok)

    def sample(self, ctx: object, i: int = -1) -> int:
        """Pick the next token from the logits of output `i` of the last batch (-1: the last)
        and record it in the chain's history.

        Where the chain is greedy alone (temperature 0, no repeat penalty) this is the argmax
        of the logits read in place: llama.cpp's sampler first copies the whole row into a
        candidate array, which costs a fast GPU step a visible share of its time on a large
        vocabulary (docs/results/speculation.md). The same token: both take the first of equal
        maxima, and a greedy chain keeps no history."""
        if self._row is None:
            return self._ll.llama_sampler_sample(self.chain, ctx, i)
        addr = self._logits_addr(ctx, i)
        if not addr:
            raise DecodeError(f"no logits for output {i} of the last batch")
        view = self._views.get(addr)
        if view is None:
            if len(self._views) > 64:  # buffers came and went (batches of many outputs)
                self._views.clear()
            row = ctypes.cast(addr, self._row).contents
            view = self._views[addr] = np.frombuffer(memoryview(row), dtype=np.float32)
        return int(view.argmax())

    def pick(self, ctx: object, i: int) -> int:
        """`sample(ctx, i)` for a speculation verify batch's positions (up to 17 a step)."""
        return self.sample(ctx, i)

    def close(self) -> None:
        if self.chain:
            self._ll.llama_sampler_free(self.chain)
            self.chain = None

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
