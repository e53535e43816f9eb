"""What the memory estimate needs to know about a model, from the GGUF headers of all its shards.

Nothing here reads tensor data: the metadata and the tensor tables give every size. Per-layer
facts come from the tensor names (`blk.N.…`): a layer with `ssm_*` tensors keeps a recurrent
state, a layer with `attn_k` (or a fused `attn_qkv`) and no `ssm_*` tensors keeps a KV cache, so
a hybrid model's attention layers are counted whatever its `full_attention_interval` says (and
the interval is the check: `attention_pattern_note`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..llama import gguf_file

PLE_TENSOR = "per_layer_token_embd.weight"
INPUT_TENSORS = ("token_embd.", "token_types.", "position_embd.", "per_layer_token_embd.")
_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class Shard:
    path: Path
    size: int


@dataclass(frozen=True)
class Span:
    """Where a tensor's data lies in its shard: llama.cpp maps the range that covers its CPU
    tensors, so with a GPU the mapped buffer it logs can be larger than those tensors."""

    shard: int
    group: str  # "token_embd", "input", "ple", "output", the layer ("3"), or "3:ssm_conv" (its conv weights)
    start: int  # file offset
    end: int


@dataclass(frozen=True)
class ModelFacts:
    """Sizes and shapes for the estimate. Byte counts are the tensors' sizes, each rounded up to
    the GGUF alignment as llama.cpp's CPU buffers hold them."""

    path: Path
    architecture: str
    shards: tuple[Shard, ...]
    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: int
    n_ctx_train: int
    layer_bytes: tuple[int, ...]  # weights of blk.i
    input_bytes: int  # token embeddings (always on the CPU), the PLE table excluded
    output_bytes: int  # output head and norms (the "output layer")
    tied_output: bool  # no output.weight: the head is token_embd again
    token_embd_bytes: int
    ple_bytes: int  # per_layer_token_embd (qwen4exp's PLE table), 0 if none
    ple_offset: int  # absolute file offset of the PLE table in its shard
    ple_shard: Path | None
    kv_layers: tuple[int, ...]  # layers with an attention KV cache
    kv_k_width: tuple[int, ...]  # per KV layer: values per token for K (n_head_kv * head dim)
    kv_v_width: tuple[int, ...]
    recurrent_layers: tuple[int, ...]
    n_embd_r: int  # conv state values per recurrent layer and sequence
    n_embd_s: int  # ssm state values per recurrent layer and sequence
    ple_conv_state: int  # extra state values on the PLE layer (qwen4exp), 0 if none
    indexer_key_length: int  # qwen4exp sparse-attention indexer: key values per token, 0 if none
    indexer_heads: int
    attention_pattern_note: str  # how the attention layers were found (and any disagreement)
    # the compute graph's shapes (the compute buffers' estimate)
    n_pos_per_token: int = 1  # positions per token: 4 with M-RoPE (rope.dimension_sections)
    indexer_ratio: int = 0  # cells per indexer block (attention.compress_ratios), 0 without
    ple_heads: int = 0  # PLE rows gathered per token ((ngram_size - 1) x heads_per_ngram)
    ple_head_dim: int = 0  # values per PLE row (embedding_length_per_layer_input)
    hc: int = 1  # hyper-connection streams: the residual is hc x n_embd wide
    head_dim_k: int = 0  # values per attention head (attention.key_length, else n_embd / n_head)
    head_dim_v: int = 0
    ssm_conv: int = 0  # the recurrent layers' conv kernel (ssm.conv_kernel)
    ssm_channels: int = 0  # values per token the conv reads (inner + 2 x groups x state)
    ssm_conv_bytes: int = 0  # the recurrent layers' conv weights (blk.N.ssm_conv1d), all layers
    spans: tuple[Span, ...] = ()  # every tensor's data range, for the mapped buffer

    @property
    def file_bytes(self) -> int:
        return sum(s.size for s in self.shards)

    @property
    def hybrid(self) -> bool:
        return bool(self.recurrent_layers)


def _int(meta: dict[str, Any], key: str, default: int = 0) -> int:
    value = meta.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _padded(t: gguf_file.TensorInfo, align: int) -> int:
    n = gguf_file.tensor_nbytes(t) or 0
    return (n + align - 1) // align * align


def read_facts(path: Path) -> ModelFacts:
    """Read every shard's header (raises `GGUFError` for a missing or bad shard)."""
    first = gguf_file.read_header(Path(path), small_arrays=4096)  # per-layer arrays kept
    headers = gguf_file.shard_headers(first)
    meta = first.metadata
    arch = first.architecture
    a = f"{arch}."
    n_layer = _int(meta, a + "block_count")
    n_embd = _int(meta, a + "embedding_length")

    layer_bytes = [0] * n_layer
    input_bytes = output_bytes = token_embd = ple_bytes = ple_offset = 0
    ple_shard: Path | None = None
    names: dict[str, gguf_file.TensorInfo] = {}
    layer_tensors: dict[int, set[str]] = {}
    spans: list[Span] = []
    conv_bytes = 0
    for shard, h in enumerate(headers):
        align = (
            _int(h.metadata, "general.alignment", gguf_file.DEFAULT_ALIGNMENT) or gguf_file.DEFAULT_ALIGNMENT
        )
        for t in h.tensors:
            names[t.name] = t
            size = _padded(t, align)
            m = _BLOCK.match(t.name)
            if m and int(m.group(1)) < n_layer:
                il = int(m.group(1))
                layer_bytes[il] += size
                layer_tensors.setdefault(il, set()).add(t.name[m.end() :])
                group = str(il)
                if t.name.endswith(".ssm_conv1d.weight"):
                    conv_bytes += size
                    group = f"{il}:ssm_conv"
            elif t.name == PLE_TENSOR:
                ple_bytes, ple_offset, ple_shard = size, h.data_offset + t.offset, h.path
                group = "ple"
            elif t.name.startswith(INPUT_TENSORS):
                input_bytes += size
                group = "input"
                if t.name == "token_embd.weight":
                    token_embd = size
                    group = "token_embd"
            else:
                output_bytes += size
                group = "output"
            start = h.data_offset + t.offset
            spans.append(Span(shard, group, start, start + (gguf_file.tensor_nbytes(t) or 0)))

    embd = names.get("token_embd.weight")
    n_vocab = embd.shape[1] if embd is not None and len(embd.shape) > 1 else _int(meta, a + "vocab_size")
    key_length = _int(meta, a + "attention.key_length")
    value_length = _int(meta, a + "attention.value_length", key_length)
    n_head = _int(meta, a + "attention.head_count")
    n_head_kv = _int(meta, a + "attention.head_count_kv", n_head)

    recurrent, kv_layers, k_width, v_width = [], [], [], []
    for il in range(n_layer):
        parts = layer_tensors.get(il, set())
        if any(p.startswith("ssm_") for p in parts):
            recurrent.append(il)
            continue
        k = names.get(f"blk.{il}.attn_k.weight")
        v = names.get(f"blk.{il}.attn_v.weight")
        if k is not None and len(k.shape) > 1:
            kv_layers.append(il)
            k_width.append(k.shape[1])
            v_width.append(v.shape[1] if v is not None and len(v.shape) > 1 else k.shape[1])
        elif "attn_qkv.weight" in parts:  # fused: the widths from the metadata
            head_k = key_length or (n_embd // max(n_head, 1))
            head_v = value_length or head_k
            kv_layers.append(il)
            k_width.append(n_head_kv * head_k)
            v_width.append(n_head_kv * head_v)

    conv = _int(meta, a + "ssm.conv_kernel")
    inner = _int(meta, a + "ssm.inner_size")
    state = _int(meta, a + "ssm.state_size")
    groups = _int(meta, a + "ssm.group_count")
    n_embd_r = (conv - 1) * (inner + 2 * groups * state) if conv else 0
    n_embd_s = state * inner
    ple_conv = _int(meta, a + "ple.conv_kernel")
    ple_ngram = _int(meta, a + "ple.ngram_size")
    hc = _int(meta, a + "hyper_connection.count", 1)
    ple_conv_state = (ple_conv - 1) * ple_ngram * hc * n_embd if (ple_conv and ple_bytes) else 0

    note = _pattern_note(meta, a, n_layer, recurrent)
    ratios = meta.get(a + "attention.compress_ratios")
    ratios = ratios if isinstance(ratios, list) else [_int(meta, a + "attention.compress_ratios")]
    used = [int(r) for il, r in enumerate(ratios) if r and (len(ratios) == 1 or il in kv_layers)]
    return ModelFacts(
        path=first.path,
        architecture=arch,
        shards=tuple(Shard(h.path, h.path.stat().st_size) for h in headers),
        n_layer=n_layer,
        n_embd=n_embd,
        n_vocab=int(n_vocab),
        n_head=n_head or max(1, n_embd // max(key_length, 1)),
        n_ctx_train=_int(meta, a + "context_length"),
        layer_bytes=tuple(layer_bytes),
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        tied_output="output.weight" not in names,
        token_embd_bytes=token_embd,
        ple_bytes=ple_bytes,
        ple_offset=ple_offset,
        ple_shard=ple_shard,
        kv_layers=tuple(kv_layers),
        kv_k_width=tuple(k_width),
        kv_v_width=tuple(v_width),
        recurrent_layers=tuple(recurrent),
        n_embd_r=n_embd_r,
        n_embd_s=n_embd_s,
        ple_conv_state=ple_conv_state,
        indexer_key_length=_int(meta, a + "attention.indexer.key_length"),
        indexer_heads=_int(meta, a + "attention.indexer.head_count"),
        attention_pattern_note=note,
        n_pos_per_token=4 if a + "rope.dimension_sections" in meta else 1,
        indexer_ratio=min(used) if used and _int(meta, a + "attention.indexer.head_count") else 0,
        ple_heads=(ple_ngram - 1) * _int(meta, a + "ple.heads_per_ngram", 1) if ple_conv_state else 0,
        ple_head_dim=_int(meta, a + "embedding_length_per_layer_input") if ple_bytes else 0,
        hc=hc,
        ssm_conv=conv,
        ssm_channels=inner + 2 * groups * state if conv else 0,
        ssm_conv_bytes=conv_bytes,
        spans=tuple(spans),
        head_dim_k=key_length or n_embd // max(n_head, 1),
        head_dim_v=value_length or key_length or n_embd // max(n_head, 1),
    )


def _pattern_note(meta: dict[str, Any], a: str, n_layer: int, recurrent: list[int]) -> str:
    """Say how the recurrent layers were found, and whether `full_attention_interval` agrees."""
    if not recurrent:
        return "every layer has attention"
    interval = _int(meta, a + "full_attention_interval")
    if not interval:
        return f"{len(recurrent)} recurrent layers (their ssm tensors)"
    expected = [il for il in range(n_layer) if (il + 1) % interval != 0]
    agree = "agrees" if expected == recurrent else "DISAGREES"
    return f"{len(recurrent)} recurrent layers (ssm tensors; full_attention_interval {interval} {agree})"
