"""What the memory estimate needs to know about a model, from the GGUF headers of all its shards.

Nothing here reads tensor data: the metadata and the tensor tables give every size. Per-layer
facts come from the tensor names (`blk.N.…`): a layer with `ssm_*` tensors keeps a recurrent
state, a layer with `attn_k` (or a fused `attn_qkv`) and no `ssm_*` tensors keeps a KV cache, so
a hybrid model's attention layers are counted whatever its `full_attention_interval` says (and
the interval is the check: `attention_pattern_note`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
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
    n_expert: int = 0  # routed experts of a MoE layer (expert_count), 0 without
    head_dim_k: int = 0  # values per attention head (attention.key_length, else n_embd / n_head)
    head_dim_v: int = 0
    ssm_conv: int = 0  # the recurrent layers' conv kernel (ssm.conv_kernel)
    ssm_channels: int = 0  # values per token the conv reads (inner + 2 x groups x state)
    ssm_conv_bytes: int = 0  # the recurrent layers' conv weights (blk.N.ssm_conv1d), all layers
    # the largest weight a matrix multiplication reads (not a row lookup: token embeddings and
    # the PLE table are gathered by rows): bytes, and its input and output widths (ne0, ne1)
    largest_matmul: tuple[int, int, int] = (0, 0, 0)
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
    a = f"{first.architecture}."
    n_layer = _int(meta, a + "block_count")
    n_embd = _int(meta, a + "embedding_length")
    t = _Tensors.of(headers, n_layer)
    heads = _Heads.of(meta, a)
    layers = _Layers.of(t, heads, n_layer, n_embd)
    r = _Recurrent.of(meta, a, n_embd, t.ple_bytes)
    embd = t.names.get("token_embd.weight")
    n_vocab = embd.shape[1] if embd is not None and len(embd.shape) > 1 else _int(meta, a + "vocab_size")
    indexer_heads = _int(meta, a + "attention.indexer.head_count")
    return ModelFacts(
        path=first.path,
        architecture=first.architecture,
        shards=tuple(Shard(h.path, h.path.stat().st_size) for h in headers),
        n_layer=n_layer,
        n_embd=n_embd,
        n_vocab=int(n_vocab),
        n_head=heads.n_head or max(1, n_embd // max(heads.key_length, 1)),
        n_ctx_train=_int(meta, a + "context_length"),
        layer_bytes=tuple(t.layer_bytes),
        input_bytes=t.input_bytes,
        output_bytes=t.output_bytes,
        tied_output="output.weight" not in t.names,
        token_embd_bytes=t.token_embd,
        ple_bytes=t.ple_bytes,
        ple_offset=t.ple_offset,
        ple_shard=t.ple_shard,
        kv_layers=tuple(layers.kv_layers),
        kv_k_width=tuple(layers.k_width),
        kv_v_width=tuple(layers.v_width),
        recurrent_layers=tuple(layers.recurrent),
        n_embd_r=r.n_embd_r,
        n_embd_s=r.n_embd_s,
        ple_conv_state=r.ple_conv_state,
        indexer_key_length=_int(meta, a + "attention.indexer.key_length"),
        indexer_heads=indexer_heads,
        attention_pattern_note=_pattern_note(meta, a, n_layer, layers.recurrent),
        n_pos_per_token=4 if a + "rope.dimension_sections" in meta else 1,
        indexer_ratio=_indexer_ratio(meta, a, layers.kv_layers) if indexer_heads else 0,
        ple_heads=(r.ple_ngram - 1) * _int(meta, a + "ple.heads_per_ngram", 1) if r.ple_conv_state else 0,
        ple_head_dim=_int(meta, a + "embedding_length_per_layer_input") if t.ple_bytes else 0,
        hc=r.hc,
        n_expert=_int(meta, a + "expert_count"),
        ssm_conv=r.conv,
        ssm_channels=r.channels,
        ssm_conv_bytes=t.conv_bytes,
        largest_matmul=t.largest_matmul,
        spans=tuple(t.spans),
        head_dim_k=heads.key_length or n_embd // max(heads.n_head, 1),
        head_dim_v=heads.value_length or heads.key_length or n_embd // max(heads.n_head, 1),
    )


@dataclass
class _Tensors:
    """What the shards' tensor tables say: every tensor by name, and the bytes of each part
    of the model (the layers, the input, the PLE table, the output)."""

    names: dict[str, gguf_file.TensorInfo] = field(default_factory=dict)
    layer_bytes: list[int] = field(default_factory=list)
    layer_tensors: dict[int, set[str]] = field(default_factory=dict)  # names after `blk.N.`
    input_bytes: int = 0
    output_bytes: int = 0
    token_embd: int = 0
    ple_bytes: int = 0
    ple_offset: int = 0
    ple_shard: Path | None = None
    conv_bytes: int = 0
    largest_matmul: tuple[int, int, int] = (0, 0, 0)
    spans: list[Span] = field(default_factory=list)

    @classmethod
    def of(cls, headers: list[gguf_file.GGUFHeader], n_layer: int) -> _Tensors:
        out = cls(layer_bytes=[0] * n_layer)
        for shard, h in enumerate(headers):
            align = (
                _int(h.metadata, "general.alignment", gguf_file.DEFAULT_ALIGNMENT)
                or gguf_file.DEFAULT_ALIGNMENT
            )
            for t in h.tensors:
                out.names[t.name] = t
                group = out._add(t, _padded(t, align), h, n_layer)
                start = h.data_offset + t.offset
                out.spans.append(Span(shard, group, start, start + (gguf_file.tensor_nbytes(t) or 0)))
        out._tied_output()
        return out

    def _tied_output(self) -> None:
        """A model with no `output.weight` (tied embeddings, as SmolLM2's) computes its logits
        from `token_embd`: that product reads the input table, which then counts among the
        matrix products (`largest_matmul`) like any output head."""
        embd = self.names.get("token_embd.weight")
        if "output.weight" in self.names or embd is None or len(embd.shape) < 2:
            return
        size = gguf_file.tensor_nbytes(embd) or 0
        if size > self.largest_matmul[0]:
            self.largest_matmul = (size, int(embd.shape[0]), int(embd.shape[1]))

    def _add(self, t: gguf_file.TensorInfo, size: int, h: gguf_file.GGUFHeader, n_layer: int) -> str:
        """Count one tensor of `size` bytes where it belongs; its `Span.group`."""
        if len(t.shape) >= 2 and not t.name.startswith(INPUT_TENSORS) and size > self.largest_matmul[0]:
            self.largest_matmul = (size, int(t.shape[0]), int(t.shape[1]))
        m = _BLOCK.match(t.name)
        if m and int(m.group(1)) < n_layer:
            il = int(m.group(1))
            self.layer_bytes[il] += size
            self.layer_tensors.setdefault(il, set()).add(t.name[m.end() :])
            if t.name.endswith(".ssm_conv1d.weight"):
                self.conv_bytes += size
                return f"{il}:ssm_conv"
            return str(il)
        if t.name == PLE_TENSOR:
            self.ple_bytes, self.ple_offset, self.ple_shard = size, h.data_offset + t.offset, h.path
            return "ple"
        if t.name.startswith(INPUT_TENSORS):
            self.input_bytes += size
            if t.name == "token_embd.weight":
                self.token_embd = size
                return "token_embd"
            return "input"
        self.output_bytes += size
        return "output"


@dataclass(frozen=True)
class _Heads:
    """The attention heads' shapes from the metadata (0: not given)."""

    key_length: int
    value_length: int
    n_head: int
    n_head_kv: int

    @classmethod
    def of(cls, meta: dict[str, Any], a: str) -> _Heads:
        key_length = _int(meta, a + "attention.key_length")
        n_head = _int(meta, a + "attention.head_count")
        return cls(
            key_length,
            _int(meta, a + "attention.value_length", key_length),
            n_head,
            _int(meta, a + "attention.head_count_kv", n_head),
        )


@dataclass
class _Layers:
    """Which layers keep a recurrent state and which a KV cache (with its K and V widths)."""

    recurrent: list[int] = field(default_factory=list)
    kv_layers: list[int] = field(default_factory=list)
    k_width: list[int] = field(default_factory=list)
    v_width: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, t: _Tensors, heads: _Heads, n_layer: int, n_embd: int) -> _Layers:
        out = cls()
        for il in range(n_layer):
            parts = t.layer_tensors.get(il, set())
            if any(p.startswith("ssm_") for p in parts):
                out.recurrent.append(il)
                continue
            k = t.names.get(f"blk.{il}.attn_k.weight")
            v = t.names.get(f"blk.{il}.attn_v.weight")
            if k is not None and len(k.shape) > 1:
                out._kv(il, k.shape[1], v.shape[1] if v is not None and len(v.shape) > 1 else k.shape[1])
            elif "attn_qkv.weight" in parts:  # fused: the widths from the metadata
                head_k = heads.key_length or (n_embd // max(heads.n_head, 1))
                head_v = heads.value_length or head_k
                out._kv(il, heads.n_head_kv * head_k, heads.n_head_kv * head_v)
        return out

    def _kv(self, il: int, k_width: int, v_width: int) -> None:
        self.kv_layers.append(il)
        self.k_width.append(k_width)
        self.v_width.append(v_width)


@dataclass(frozen=True)
class _Recurrent:
    """The recurrent layers' state and conv shapes, and the PLE layer's (qwen4exp)."""

    conv: int  # ssm.conv_kernel
    channels: int  # values per token the conv reads
    n_embd_r: int
    n_embd_s: int
    hc: int
    ple_ngram: int
    ple_conv_state: int

    @classmethod
    def of(cls, meta: dict[str, Any], a: str, n_embd: int, ple_bytes: int) -> _Recurrent:
        conv = _int(meta, a + "ssm.conv_kernel")
        inner = _int(meta, a + "ssm.inner_size")
        state = _int(meta, a + "ssm.state_size")
        groups = _int(meta, a + "ssm.group_count")
        ple_conv = _int(meta, a + "ple.conv_kernel")
        ple_ngram = _int(meta, a + "ple.ngram_size")
        hc = _int(meta, a + "hyper_connection.count", 1)
        return cls(
            conv=conv,
            channels=inner + 2 * groups * state if conv else 0,
            n_embd_r=(conv - 1) * (inner + 2 * groups * state) if conv else 0,
            n_embd_s=state * inner,
            hc=hc,
            ple_ngram=ple_ngram,
            ple_conv_state=(ple_conv - 1) * ple_ngram * hc * n_embd if (ple_conv and ple_bytes) else 0,
        )


def _indexer_ratio(meta: dict[str, Any], a: str, kv_layers: list[int]) -> int:
    """Cells per indexer block: the smallest compress ratio of an attention layer (one ratio
    for every layer, or one per layer), 0 without."""
    ratios = meta.get(a + "attention.compress_ratios")
    ratios = ratios if isinstance(ratios, list) else [_int(meta, a + "attention.compress_ratios")]
    used = [int(r) for il, r in enumerate(ratios) if r and (len(ratios) == 1 or il in kv_layers)]
    return min(used) if used else 0


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
