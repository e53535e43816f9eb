"""The llama_sampler chain for a turn, built from the profile's sampling settings.

Sampling runs in C on llama.cpp's own logits: no per-token copy of the logits array into numpy.
Temperature 0 is plain greedy (deterministic); otherwise the usual chain
penalties -> top_k -> top_p -> min_p -> temperature -> dist(seed).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .config.profile_schema import SamplingSettings


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
        if s.repeat_penalty != 1.0:
            for tok in list(recent_tokens)[-s.repeat_last_n :]:
                ll.llama_sampler_accept(chain, tok)

    def sample(self, ctx: object, i: int = -1) -> int:
        """Pick the next token from the logits of output `i` of the last batch (-1: the last)
        and record it in the chain's history."""
        return self._ll.llama_sampler_sample(self.chain, ctx, i)

    def close(self) -> None:
        if self.chain:
            self._ll.llama_sampler_free(self.chain)
            self.chain = None

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
