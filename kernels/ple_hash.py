"""numpy reference of the qwen4exp PLE n-gram hash (the spec the GPU hash kernel must match).

It mirrors `llm_graph_input_qwen4exp_ple::set_input` in the vendored llama.cpp
(`src/models/qwen4exp.cpp`), rule for rule:

- token i sees its `n_gram - 1` predecessors, nearest first; `prev` holds them oldest-first, as
  `llama_kv_cache::get_prev_tokens` returns them, with a negative entry for "no such token";
- a missing predecessor reads as EOS, and an EOS cuts everything at or before it (once cut, every
  older slot reads as EOS); the token's own EOS does not cut its context;
- for n = 2..n_gram: mixed = (ctx[0]*m[0]) ^ ... ^ (ctx[n-1]*m[n-1]) in wrapping uint64;
  for each of the `heads_per_ngram` heads h of that order:
  row = mixed % head_vocab_sizes[h] + head_offsets[h]; heads are n-gram-order major.

The output is int32 rows [n_tokens, n_heads], exactly the `rows` input llama.cpp hands to
`ggml_get_rows`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class PleHashSpec:
    """The hash parameters of one model (the `<arch>.ple.*` GGUF keys)."""

    ngram_size: int
    heads_per_ngram: int
    eos_token_id: int
    layer_multipliers: tuple[int, ...]
    head_offsets: tuple[int, ...]
    head_vocab_sizes: tuple[int, ...]
    image_token_id: int = 0

    def __post_init__(self) -> None:
        if not 2 <= self.ngram_size <= 8:
            raise ValueError(f"ple.ngram_size {self.ngram_size} is outside 2..8")
        if len(self.layer_multipliers) != self.ngram_size:
            raise ValueError("ple.layer_multipliers must have ngram_size entries")
        n = self.n_heads
        if not 0 < n <= 64:
            raise ValueError(f"PLE head count {n} is outside 1..64")
        if len(self.head_offsets) != n or len(self.head_vocab_sizes) != n:
            raise ValueError(f"ple.head_offsets and ple.head_vocab_sizes must have {n} entries")
        if any(not 0 <= m <= _U64 for m in self.layer_multipliers):
            raise ValueError("ple.layer_multipliers must be uint64")
        for o, v in zip(self.head_offsets, self.head_vocab_sizes, strict=True):
            if v <= 0 or o < 0 or o + v > 2**31 - 1:
                raise ValueError("a PLE head range does not fit the int32 row index")

    @property
    def n_heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def n_prev(self) -> int:
        return self.ngram_size - 1

    @property
    def min_table_rows(self) -> int:
        """Rows the table needs so that every hashed index is in range."""
        return max(o + v for o, v in zip(self.head_offsets, self.head_vocab_sizes, strict=True))

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any], arch: str | None = None) -> PleHashSpec:
        """The spec from the `<arch>.ple.*` keys of a GGUF's metadata (a header read with its
        arrays kept)."""
        p = f"{arch or md.get('general.architecture', 'qwen4exp')}.ple."
        keys = (
            "ngram_size",
            "heads_per_ngram",
            "eos_token_id",
            "layer_multipliers",
            "head_offsets",
            "head_vocab_sizes",
        )
        missing = [p + k for k in keys if md.get(p + k) is None]
        if missing:
            raise KeyError(f"missing PLE keys {missing}")
        return cls(
            ngram_size=int(md[p + "ngram_size"]),
            heads_per_ngram=int(md[p + "heads_per_ngram"]),
            eos_token_id=int(md[p + "eos_token_id"]),
            image_token_id=int(md.get(p + "image_token_id") or 0),
            layer_multipliers=tuple(int(x) for x in md[p + "layer_multipliers"]),
            head_offsets=tuple(int(x) for x in md[p + "head_offsets"]),
            head_vocab_sizes=tuple(int(x) for x in md[p + "head_vocab_sizes"]),
        )


def prev_tokens(tokens: np.ndarray, n_prev: int, history: np.ndarray | None = None) -> np.ndarray:
    """Predecessor matrix int32 [n_tokens, n_prev], oldest-first, -1 where there is none.

    `history` is the sequence before this batch (the tokens already in the KV cache), so a chunked
    prefill gets the same predecessors as a single-shot one.
    """
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    hist = np.zeros(0, np.int64) if history is None else np.asarray(history, np.int64).reshape(-1)
    seq = np.concatenate([np.full(n_prev, -1, np.int64), hist, tokens])
    start = n_prev + hist.size  # index of tokens[0] in seq
    idx = start + np.arange(tokens.size)[:, None] - n_prev + np.arange(n_prev)[None, :]
    return seq[idx].astype(np.int32)


def ple_windows(spec: PleHashSpec, tokens: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """The hashed window ctx[i, s] (s=0 is the token itself, s=1 its predecessor...) as uint64."""
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    prev = np.asarray(prev, dtype=np.int64).reshape(tokens.size, spec.n_prev)
    if tokens.size and tokens.min() < 0:
        raise ValueError("token ids must be non-negative")
    eos = spec.eos_token_id
    ctx = np.empty((tokens.size, spec.ngram_size), np.int64)
    ctx[:, 0] = tokens
    cut = np.zeros(tokens.size, bool)
    for s in range(1, spec.ngram_size):
        t = prev[:, spec.n_prev - s]
        cut |= (t < 0) | (t == eos)
        ctx[:, s] = np.where(cut, eos, t)
    return ctx.astype(np.uint64)


def ple_rows_from_prev(spec: PleHashSpec, tokens: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """int32 rows [n_tokens, n_heads] from tokens and their predecessor matrix."""
    ctx = ple_windows(spec, tokens, prev)
    mult = np.asarray(spec.layer_multipliers, dtype=np.uint64)
    offs = np.asarray(spec.head_offsets, dtype=np.uint64)
    vocab = np.asarray(spec.head_vocab_sizes, dtype=np.uint64)
    out = np.empty((ctx.shape[0], spec.n_heads), np.int32)
    with np.errstate(over="ignore"):
        terms = ctx * mult[None, :]  # wraps modulo 2**64, as the C++ uint64 product
    mixed = terms[:, 0].copy()
    for n in range(2, spec.ngram_size + 1):
        mixed ^= terms[:, n - 1]
        h = slice((n - 2) * spec.heads_per_ngram, (n - 1) * spec.heads_per_ngram)
        out[:, h] = (mixed[:, None] % vocab[None, h] + offs[None, h]).astype(np.int32)
    return out


def ple_rows(spec: PleHashSpec, tokens: np.ndarray, history: np.ndarray | None = None) -> np.ndarray:
    """int32 rows [n_tokens, n_heads] for one sequence: `history` then `tokens`."""
    return ple_rows_from_prev(spec, tokens, prev_tokens(tokens, spec.n_prev, history))
