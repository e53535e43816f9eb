"""Requantize a GGUF's weights with llama.cpp's own quantizer, for the CPU's batch kernels.

Why: on x86_64 ggml's CPU backend computes a batch of tokens (a prompt's prefill, speculation's
verify batch) with multi-token kernels (llamafile's tinyBLAS, the repacked GEMMs) only for some
weight types: Q8_0, Q4_0, Q5_0, IQ4_NL, the float types, and through repacking Q4_0/Q4_K/IQ4_NL.
Other types, Q4_1 among them (the embedded SmolLM2), are multiplied one token at a time, so a
long batch costs nearly as much as its tokens one by one, and a verify batch can save little.
Requantized to Q8_0 the same model's batches cost a fraction of that and prefill runs faster,
while a one-token step is somewhat slower (docs/results/speculation.md has the runs).

Q8_0 keeps 8 bits a weight, so a model stored at 4-6 bits loses nothing measurable and grows
by about half; nothing below 8 bits is offered, because requantizing an already quantized model
to another low-bit type adds a second rounding (SmolLM2 Q4_1 to Q4_0 stopped answering).

The copy is written beside its target under a temp name and renamed into place, so a reader
never sees half a model; a failure leaves nothing behind.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

from ..llama import gguf_file, log as llama_log
from ..atomic_file import atomic_produce
from ..errors import RequantizeError

log = logging.getLogger(__name__)

TYPES = {"q8_0": "Q8_0"}
"""What a model may be requantized to, and the tag a derived file name carries."""

_QUANT_TAG = re.compile(r"[.-]((I?Q\d[\w]*)|F16|BF16|F32)$", re.IGNORECASE)

_TENSOR_DONE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]")
"""llama.cpp's quantizer logs one line per tensor, "[  12/ 272] blk.0.attn_k.weight - ...",
finished once the tensor is written: what `requantize` reports progress from."""


def derived_name(source: Path, to: str) -> str:
    """`Model.Q4_1.gguf` -> `Model.Q8_0.gguf`: the source's quantization tag replaced (or one
    added) so the copy says what it holds."""
    stem = _QUANT_TAG.sub("", source.name.removesuffix(".gguf"))
    return f"{stem}.{TYPES[to]}.gguf"


def requantize(
    source: Path,
    target: Path,
    to: str,
    *,
    threads: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write `source`'s weights requantized to `to` (a key of `TYPES`) at `target`.

    Raises `RequantizeError` (one line) for an unknown type, a source that is not a whole
    single-file GGUF, a target that is the source, or llama.cpp refusing; `target` is then left
    as it was. `threads`: llama.cpp's quantizer threads (0: its default, the cores).
    `progress(done, total)` is called after each tensor is written (a large model takes
    minutes), on the calling thread."""
    if to not in TYPES:
        raise RequantizeError(f"cannot requantize to {to!r}: choose one of {', '.join(TYPES)}")
    source, target = Path(source), Path(target)
    try:
        header = gguf_file.read_header(source)
    except gguf_file.GGUFError as exc:
        raise RequantizeError(str(exc)) from None
    if int(header.metadata.get("split.count", 0) or 0) > 1:
        raise RequantizeError(
            f"{source.name} is one shard of a split model; requantizing those is not supported"
        )
    if target.exists() and target.resolve() == source.resolve():
        raise RequantizeError(f"the copy would overwrite its source, {source}")
    if not target.parent.is_dir():
        raise RequantizeError(f"no such folder for the copy: {target.parent}")

    from llama_cpp import llama_cpp as ll

    llama_log.install()
    params = ll.llama_model_quantize_default_params()
    params.ftype = getattr(ll, f"LLAMA_FTYPE_MOSTLY_{TYPES[to]}")
    params.allow_requantize = True  # the source is quantized already: that is the point
    params.nthread = threads

    def tensor_done(line: str) -> None:
        m = _TENSOR_DONE.match(line)
        if m and progress is not None:
            progress(int(m.group(1)), int(m.group(2)))

    def produce(tmp: Path) -> None:
        with llama_log.watch(tensor_done):
            rc = ll.llama_model_quantize(str(source).encode(), str(tmp).encode(), params)
        if rc != 0:
            why = llama_log.last_error() or f"llama_model_quantize returned {rc}"
            raise RequantizeError(f"could not requantize {source.name}: {why}")

    log.info("requantizing %s to %s: %s", source, TYPES[to], target)
    return atomic_produce(target, produce)
