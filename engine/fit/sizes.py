"""Byte counts for the fit table: the KV cache types' sizes, and sizes people can read."""

from __future__ import annotations

GIB = 1 << 30
MIB = 1 << 20

# bytes per value (ggml block size / block bytes) of the KV cache types
KV_TYPE_BYTES = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18)}


def row_bytes(type_name: str, n: int) -> int:
    block, nbytes = KV_TYPE_BYTES[type_name]
    return n // block * nbytes


def fmt(n: float) -> str:
    """Bytes for people: MiB below a GiB, GiB above."""
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.2f} MiB"


def size(n: float) -> str:
    """A formula's part: bytes below a KiB (fractions kept: bytes per pair), else KiB or MiB."""
    return f"{n:g} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < MIB else fmt(n)
