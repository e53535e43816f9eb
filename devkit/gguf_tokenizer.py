"""Copy a GGUF's tokenizer (all `tokenizer.*` keys, chat template included), optionally trimmed.

Why trim: the token embedding and the untied output head are each n_vocab x n_embd, so with
SmolLM2's 49,152 ids they would be most of the tiny model. Trimming to ~8K ids keeps the
model at a few MB while the text still tokenizes and detokenizes normally.

How the trim stays a valid byte-level BPE tokenizer:
- kept ids: the first `n_keep` ids, plus every non-normal token (control / user-defined, e.g.
  <|endoftext|>, <|im_start|>, <|im_end|>), plus every single-character token of the GPT-2
  byte alphabet (llama.cpp's BPE falls back to those for unknown pieces and throws if one is
  missing); ids are renumbered in their original order;
- a merge "a b" is kept only if `a`, `b` and `ab` are all kept, so every merge llama.cpp applies
  produces a token that exists;
- every `tokenizer.ggml.*_token_id` key is remapped to the new numbering (a special id that was
  not kept would be a bug, so it raises).
SmolLM2's BPE ids are in merge order, so in practice the first 8,192 ids already contain all
17 specials and the byte alphabet, and 7,940 merges survive.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFValueType, GGUFWriter

_NORMAL = 1  # llama_token_type LLAMA_TOKEN_TYPE_NORMAL


@dataclass(frozen=True)
class TokenizerCopy:
    """What the model builder needs to know about the tokenizer it wrote."""

    n_vocab: int
    eos_token_id: int
    bos_token_id: int | None


def _byte_alphabet() -> set[str]:
    """The 256 characters GPT-2's `bytes_to_unicode` maps the bytes to."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars, n = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + n))
            n += 1
    return set(chars)


def copy_tokenizer(src: Path, writer: GGUFWriter, n_vocab: int | None) -> TokenizerCopy:
    """Write src's tokenizer keys into writer; n_vocab None keeps the full vocabulary."""
    st = src.stat()
    kvs, info = _trimmed_tokenizer(str(src.resolve()), st.st_size, st.st_mtime_ns, n_vocab)
    for key, value, vtype, sub in kvs:
        writer.add_key_value(key, list(value) if sub is not None else value, vtype, sub_type=sub)
    return info


_Kv = tuple[str, Any, GGUFValueType, "GGUFValueType | None"]


@functools.lru_cache(maxsize=4)
def _trimmed_tokenizer(
    src: str, size: int, mtime_ns: int, n_vocab: int | None
) -> tuple[tuple[_Kv, ...], TokenizerCopy]:
    """Parse once per process: GGUFReader takes seconds on SmolLM2's 98K vocab strings.

    size and mtime_ns are part of the cache key only, so a replaced file is read again.
    """
    reader = GGUFReader(src)
    tokens: list[str] = reader.fields["tokenizer.ggml.tokens"].contents()
    types: list[int] = reader.fields["tokenizer.ggml.token_type"].contents()
    full = len(tokens)
    n_keep = full if n_vocab is None else min(n_vocab, full)

    if n_keep < full:
        alphabet = _byte_alphabet()
        keep = [
            i
            for i, (t, ty) in enumerate(zip(tokens, types, strict=True))
            if i < n_keep or ty != _NORMAL or t in alphabet
        ]
    else:
        keep = list(range(full))
    new_id = {old: new for new, old in enumerate(keep)}
    kept_text = {tokens[i] for i in keep}

    ids: dict[str, int] = {}
    kvs: list[_Kv] = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = field.contents()
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            value = [value[i] for i in keep]
        elif key == "tokenizer.ggml.merges":
            value = [m for m in value if _merge_kept(m, kept_text)]
        elif key.endswith("_token_id") and vtype in (GGUFValueType.UINT32, GGUFValueType.INT32):
            if value not in new_id:
                raise ValueError(f"{key}={value} was trimmed away; keep it in the vocabulary")
            value = new_id[value]
            ids[key] = value
        kvs.append((key, tuple(value) if sub is not None else value, vtype, sub))

    eos = ids.get("tokenizer.ggml.eos_token_id")
    if eos is None:
        raise ValueError(f"{src} has no tokenizer.ggml.eos_token_id; the PLE hash needs one")
    return tuple(kvs), TokenizerCopy(len(keep), eos, ids.get("tokenizer.ggml.bos_token_id"))


def _merge_kept(merge: str, kept: set[str]) -> bool:
    a, sep, b = merge.partition(" ")
    return bool(sep) and a in kept and b in kept and (a + b) in kept
