"""The weight types a model's batches multiply, read from its headers, and whether an x86_64 CPU
rounds a batch of them otherwise than one-token steps (`velo-chat doctor`'s advice on exact
speculation; the engine decides the same at load, docs/speculation.md)."""

from __future__ import annotations

from pathlib import Path

from ..llama.gguf_file import read_header, shard_headers
from ..speculation.stepper import X86_64, batch_weight_types, weight_rounding

__all__ = ["X86_64", "model_weight_types", "weight_rounding"]


def model_weight_types(path: Path) -> frozenset[int]:
    """The ggml types of the weights a batch multiplies, over every shard of the GGUF at `path`
    (`GGUFError` for a file that is not one)."""
    return batch_weight_types(shard_headers(read_header(path)))
