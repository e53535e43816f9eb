"""A tiny random-weight `qwen4exp` GGUF (the Qwen3.8-Flash-Next architecture), built at test time.

Import it as `devkit.tiny_qwen4exp` from the repo root (pyproject sets pytest's `pythonpath = ["."]`).
The repo holds no weights: tests call `tiny_qwen4exp_path(cache_dir, tokenizer_gguf, ...)`,
which builds the file once per distinct set of arguments (and generator source) and reuses it.

Shape: 4 layers, layers 0-2 gated delta net (GDN, recurrent) and layer 3 QSA attention
(`full_attention_interval` 4), MoE with 8 experts top-2 plus a gated shared expert in every
layer, 2 hyper-connection streams, the PLE n-gram hash table on layer 0, n_embd 64, SmolLM2's
tokenizer trimmed to 8,192 ids. About 4 MB; ~2,500 tok/s greedy on one CPU thread.

Choices that are not arbitrary:
- The PyPI `gguf` package does not know qwen4exp, so keys are written by name. The three PLE
  hash arrays (`ple.layer_multipliers`, `ple.head_offsets`, `ple.head_vocab_sizes`) must be
  UINT64 arrays: llama.cpp refuses u32 ones ("wrong array element type").
- The PLE layer must be a GDN layer (its conv history lives in the recurrent cache), and the
  PLE row dim x (ngram_size - 1) x heads_per_ngram must equal n_embd, because `ple_key` takes the
  gathered rows as an n_embd input. The defaults (ngram 3, 1 head per n-gram) give 2 heads of
  32 values: 32 is the Q8_0/IQ4_NL block size, so every `ple_type` works at n_embd 64. For a
  4-head table use n_embd=128, ple_heads_per_ngram=2.
- The QSA layer has separate attn_q / attn_k / attn_v (attn_q holds [q|gate] interleaved per
  head); the graph reads `wq` and has no fused-QKV path there.
- `attention.compress_ratios` is written ([0,0,0,4]); without it the QSA layer silently falls
  back to dense attention. `indexer_top_k` defaults to 16 so prompts past ~20 tokens really run
  the sparse selection (131072 would select everything, i.e. dense).
- The output head is untied and random with fan-in scaled init: a tied random head maps each
  hidden state back to its own input token, so greedy decoding only echoes the prompt.
- There is no `output_norm`: the final hyper-connection mixer is the norm. Norm gammas are 1.0
  (the converter stores them already folded as 1 + w), `ssm_a` is negative (-exp(A_log)) and has
  no `.weight` suffix; 1-D tensors and conv kernels are F32 as ggml requires.
- No MTP block (the converter drops it too).
- Weights, PLE table and hash constants use separate RNG streams of `seed`, so two files that
  differ only in `ple_type` / `ple_rows_encode_index` have identical other weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from .gguf_tokenizer import copy_tokenizer
from .ple_table import (
    PLE_TYPES,
    check_row_dim,
    decode_index_rows,
    make_ple_table,
)

__all__ = [
    "PLE_TYPES",
    "PleSpec",
    "TinyQwen4expSpec",
    "build_tiny_qwen4exp",
    "decode_index_rows",
    "read_tiny_qwen4exp_spec",
    "tiny_qwen4exp_path",
]

ARCH = "qwen4exp"
PLE_TENSOR = "per_layer_token_embd.weight"

# fixed geometry (everything except n_embd and the PLE/indexer knobs)
N_LAYER, FULL_ATTN_INTERVAL = 4, 4
N_HEAD, N_HEAD_KV, HEAD_DIM, N_ROT = 2, 1, 32, 16  # partial rotary, as in the real model
ROPE_SECTIONS = (3, 3, 2, 0)  # interleaved mrope pairs, summing to N_ROT / 2
HC, HC_LOW_RANK = 2, 8
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_FF_SHEXP = 8, 2, 32, 64
SSM_CONV, SSM_STATE, SSM_GROUPS, SSM_V_HEADS = 4, 16, 1, 2
IDX_HEADS, IDX_DIM, COMPRESS_RATIO = 2, 32, 4  # indexer key length must be >= N_ROT
PLE_LAYER, PLE_CONV = 0, 4


@dataclass(frozen=True)
class PleSpec:
    """Everything needed to reproduce llama.cpp's PLE hash + gather for this file."""

    layer: int
    ngram_size: int
    heads_per_ngram: int
    conv_kernel: int
    row_dim: int
    n_rows: int
    layer_multipliers: tuple[int, ...]
    head_offsets: tuple[int, ...]
    head_vocab_sizes: tuple[int, ...]
    eos_token_id: int
    table_type: str
    """one of PLE_TYPES"""

    @property
    def n_heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram


@dataclass(frozen=True)
class TinyQwen4expSpec:
    """The hyperparameters as written into (and read back from) the GGUF."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_ctx_train: int
    recurrent_layers: tuple[bool, ...]
    indexer_top_k: int
    compress_ratios: tuple[int, ...]
    ple: PleSpec


def _primes_below(n: int, count: int) -> list[int]:
    """The `count` largest primes < n: distinct per-head vocab sizes, like the real table's."""
    out: list[int] = []
    k = n - 1
    while len(out) < count and k > 1:
        if all(k % p for p in range(2, int(k**0.5) + 1)):
            out.append(k)
        k -= 1
    if len(out) < count:
        raise ValueError(f"ple_head_vocab {n} is too small for {count} heads")
    return out


def build_tiny_qwen4exp(
    out_path: Path,
    *,
    tokenizer_gguf: Path,
    seed: int = 0,
    ple_type: str = "f32",
    ple_rows_encode_index: bool = False,
    n_embd: int = 64,
    n_vocab: int | None = 8192,
    ple_ngram_size: int = 3,
    ple_heads_per_ngram: int = 1,
    ple_head_vocab: int = 2048,
    indexer_top_k: int = 16,
    n_ctx_train: int = 32768,
) -> Path:
    """Write the model to out_path and return it.

    n_vocab: keep this many tokenizer ids (None = SmolLM2's full 49,152). ple_head_vocab: each
    PLE head gets a distinct prime number of rows below this. ple_rows_encode_index: row r holds
    an exact encoding of r (see ple_table.py; `decode_index_rows` inverts it).
    """
    n_heads = (ple_ngram_size - 1) * ple_heads_per_ngram
    if not 2 <= ple_ngram_size <= 8 or ple_heads_per_ngram < 1:
        raise ValueError("ple_ngram_size must be 2..8 and ple_heads_per_ngram >= 1")
    if n_embd % n_heads or n_embd % HC:
        raise ValueError(f"n_embd {n_embd} must split into {n_heads} PLE heads")
    row_dim = n_embd // n_heads
    check_row_dim(ple_type, row_dim)

    out_path = Path(out_path)
    w = GGUFWriter(out_path, ARCH)
    w.add_name("tiny-qwen4exp (random weights, test only)")
    tok = copy_tokenizer(Path(tokenizer_gguf), w, n_vocab)

    head_vocab = _primes_below(ple_head_vocab, n_heads)
    head_offsets = np.concatenate([[0], np.cumsum(head_vocab)[:-1]]).tolist()
    n_rows = -(-sum(head_vocab) // 64) * 64  # padded, as the converter pads the real table
    hash_rng = np.random.default_rng((seed, 2))
    multipliers = [int(m) | 1 for m in hash_rng.integers(2**40, 2**45, size=ple_ngram_size)]

    recurrent = [(i + 1) % FULL_ATTN_INTERVAL != 0 for i in range(N_LAYER)]
    _write_hparams(w, n_embd, n_ctx_train, indexer_top_k, recurrent)
    k = f"{ARCH}.ple."
    w.add_array(k + "layers", [PLE_LAYER])
    w.add_uint32(k + "ngram_size", ple_ngram_size)
    w.add_uint32(k + "heads_per_ngram", ple_heads_per_ngram)
    w.add_uint32(k + "conv_kernel", PLE_CONV)
    w.add_uint32(k + "eos_token_id", tok.eos_token_id)
    w.add_uint32(f"{ARCH}.embedding_length_per_layer_input", row_dim)
    for name, vals in (
        ("layer_multipliers", multipliers),
        ("head_offsets", head_offsets),
        ("head_vocab_sizes", head_vocab),
    ):
        w.add_key_value(k + name, [int(v) for v in vals], GGUFValueType.ARRAY, GGUFValueType.UINT64)

    _add_weights(w, np.random.default_rng((seed, 0)), n_embd, tok.n_vocab, recurrent)
    table = make_ple_table(np.random.default_rng((seed, 1)), n_rows, row_dim, ple_type, ple_rows_encode_index)
    w.add_tensor(PLE_TENSOR, table.raw, raw_dtype=table.ggml_type)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


def _write_hparams(w: GGUFWriter, n_embd: int, n_ctx: int, top_k: int, recurrent: list[bool]) -> None:
    a = ARCH
    u32 = {
        "context_length": n_ctx,
        "embedding_length": n_embd,
        "block_count": N_LAYER,
        "feed_forward_length": N_FF_SHEXP,
        "full_attention_interval": FULL_ATTN_INTERVAL,
        "attention.head_count": N_HEAD,
        "attention.head_count_kv": N_HEAD_KV,
        "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM,
        "rope.dimension_count": N_ROT,
        "expert_count": N_EXPERT,
        "expert_used_count": N_EXPERT_USED,
        "expert_feed_forward_length": N_FF_EXP,
        "expert_shared_feed_forward_length": N_FF_SHEXP,
        "ssm.conv_kernel": SSM_CONV,
        "ssm.inner_size": SSM_V_HEADS * SSM_STATE,
        "ssm.state_size": SSM_STATE,
        "ssm.time_step_rank": SSM_V_HEADS,
        "ssm.group_count": SSM_GROUPS,
        "hyper_connection.count": HC,
        "hyper_connection.low_rank": HC_LOW_RANK,
        "attention.indexer.head_count": IDX_HEADS,
        "attention.indexer.key_length": IDX_DIM,
        "attention.indexer.top_k": top_k,
    }
    for key, val in u32.items():
        w.add_uint32(f"{a}.{key}", val)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", 1e7)
    w.add_array(f"{a}.rope.dimension_sections", list(ROPE_SECTIONS))
    ratios = [0 if r else COMPRESS_RATIO for r in recurrent]
    w.add_key_value(f"{a}.attention.compress_ratios", ratios, GGUFValueType.ARRAY, GGUFValueType.UINT32)


def _add_weights(
    w: GGUFWriter, rng: np.random.Generator, E: int, n_vocab: int, recurrent: list[bool]
) -> None:
    """All tensors except the PLE table. `ne` is ggml order (fastest first), numpy is reversed."""

    def rand(name: str, ne: tuple[int, ...], fan_in: int, gain: float = 1.0, f16=False) -> None:
        x = rng.standard_normal(ne[::-1]).astype(np.float32) * np.float32(gain / fan_in**0.5)
        w.add_tensor(name, x.astype(np.float16) if f16 else x)

    def const(name: str, ne: tuple[int, ...], value: float) -> None:
        w.add_tensor(name, np.full(ne[::-1], value, dtype=np.float32))

    hc_dim = HC * E

    def hc_block(prefix: str, inject: bool) -> None:
        const(f"{prefix}_norm.weight", (E, HC), 1.0)
        rand(f"{prefix}_down.weight", (hc_dim, HC_LOW_RANK), hc_dim)
        rand(f"{prefix}_up.weight", (HC_LOW_RANK, hc_dim), HC_LOW_RANK)
        if inject:
            rand(f"{prefix}_inject.weight", (hc_dim, HC), hc_dim)

    rand("token_embd.weight", (E, n_vocab), 1, f16=True)
    rand("output.weight", (E, n_vocab), E, gain=4.0, f16=True)
    hc_block("output_hc", inject=False)

    key_dim, val_dim = SSM_GROUPS * SSM_STATE, SSM_V_HEADS * SSM_STATE
    conv_dim = 2 * key_dim + val_dim
    for il in range(N_LAYER):
        b = f"blk.{il}."
        hc_block(b + "hc_attn", inject=True)
        hc_block(b + "hc_ffn", inject=True)
        if recurrent[il]:
            rand(b + "attn_qkv.weight", (E, conv_dim), E)
            rand(b + "attn_gate.weight", (E, val_dim), E)
            rand(b + "ssm_conv1d.weight", (SSM_CONV, conv_dim), SSM_CONV)
            w.add_tensor(b + "ssm_dt.bias", rng.uniform(-1.0, 1.0, SSM_V_HEADS).astype(np.float32))
            a = -np.exp(rng.uniform(np.log(0.5), np.log(4.0), SSM_V_HEADS)).astype(np.float32)
            w.add_tensor(b + "ssm_a", a)
            rand(b + "ssm_beta.weight", (E, SSM_V_HEADS), E)
            rand(b + "ssm_alpha.weight", (E, SSM_V_HEADS), E)
            const(b + "ssm_norm.weight", (SSM_STATE,), 1.0)
            rand(b + "ssm_out.weight", (val_dim, E), val_dim)
        else:
            rand(b + "attn_q.weight", (E, 2 * HEAD_DIM * N_HEAD), E)
            rand(b + "attn_k.weight", (E, HEAD_DIM * N_HEAD_KV), E)
            rand(b + "attn_v.weight", (E, HEAD_DIM * N_HEAD_KV), E)
            rand(b + "attn_output.weight", (HEAD_DIM * N_HEAD, E), HEAD_DIM * N_HEAD)
            const(b + "attn_q_norm.weight", (HEAD_DIM,), 1.0)
            const(b + "attn_k_norm.weight", (HEAD_DIM,), 1.0)
            rand(b + "indexer.q_proj.weight", (E, IDX_HEADS * IDX_DIM), E)
            rand(b + "indexer.k_proj.weight", (E, IDX_DIM), E)
            const(b + "indexer.q_norm.weight", (IDX_DIM,), 1.0)
            const(b + "indexer.k_norm.weight", (IDX_DIM,), 1.0)
        if il == PLE_LAYER:
            rand(b + "ple_key.weight", (E, hc_dim), E)
            rand(b + "ple_value.weight", (E, E), E)
            for n in ("key", "query", "conv"):
                const(b + f"ple_norm_{n}.weight", (E, HC), 1.0)
            rand(b + "ple_conv1d.weight", (PLE_CONV, hc_dim), PLE_CONV)
        rand(b + "ffn_gate_inp.weight", (E, N_EXPERT), E)
        rand(b + "ffn_gate_exps.weight", (E, N_FF_EXP, N_EXPERT), E)
        rand(b + "ffn_up_exps.weight", (E, N_FF_EXP, N_EXPERT), E)
        rand(b + "ffn_down_exps.weight", (N_FF_EXP, E, N_EXPERT), N_FF_EXP)
        rand(b + "ffn_gate_inp_shexp.weight", (E,), E)
        rand(b + "ffn_gate_shexp.weight", (E, N_FF_SHEXP), E)
        rand(b + "ffn_up_shexp.weight", (E, N_FF_SHEXP), E)
        rand(b + "ffn_down_shexp.weight", (N_FF_SHEXP, E), N_FF_SHEXP)


def _source_digest() -> str:
    """Hash of the generator's own source, so a changed generator never reuses a stale file."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in ("tiny_qwen4exp.py", "ple_table.py", "gguf_tokenizer.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()


def tiny_qwen4exp_path(cache_dir: Path, tokenizer_gguf: Path, **kwargs) -> Path:
    """Build (once) and return the cached model for these arguments.

    The file name carries a hash of the kwargs, the tokenizer file's name and size, and the
    generator source. The build goes to a temp file in cache_dir and is renamed into place, so
    a concurrent or killed build never leaves a half-written model under the final name.
    """
    cache_dir = Path(cache_dir)
    tokenizer_gguf = Path(tokenizer_gguf)
    key = json.dumps(
        {
            "kwargs": kwargs,
            "tokenizer": [tokenizer_gguf.name, tokenizer_gguf.stat().st_size],
            "source": _source_digest(),
        },
        sort_keys=True,
        default=str,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    final = cache_dir / f"tiny-qwen4exp-{digest}.gguf"
    if final.exists():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".tiny-qwen4exp-", suffix=".partial")
    os.close(fd)
    try:
        build_tiny_qwen4exp(Path(tmp), tokenizer_gguf=tokenizer_gguf, **kwargs)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return final


def read_tiny_qwen4exp_spec(path: Path) -> TinyQwen4expSpec:
    """Read the hyperparameters and PLE constants back from a built file (the source of truth)."""
    r = GGUFReader(path)

    def get(key: str):
        return r.fields[f"{ARCH}.{key}"].contents()

    table = next(t for t in r.tensors if t.name == PLE_TENSOR)
    n_layer = int(get("block_count"))
    interval = int(get("full_attention_interval"))
    ple = PleSpec(
        layer=int(get("ple.layers")[0]),
        ngram_size=int(get("ple.ngram_size")),
        heads_per_ngram=int(get("ple.heads_per_ngram")),
        conv_kernel=int(get("ple.conv_kernel")),
        row_dim=int(get("embedding_length_per_layer_input")),
        n_rows=int(table.shape[1]),
        layer_multipliers=tuple(int(v) for v in get("ple.layer_multipliers")),
        head_offsets=tuple(int(v) for v in get("ple.head_offsets")),
        head_vocab_sizes=tuple(int(v) for v in get("ple.head_vocab_sizes")),
        eos_token_id=int(get("ple.eos_token_id")),
        table_type=table.tensor_type.name.lower(),
    )
    return TinyQwen4expSpec(
        n_vocab=len(r.fields["tokenizer.ggml.tokens"].data),
        n_embd=int(get("embedding_length")),
        n_layer=n_layer,
        n_ctx_train=int(get("context_length")),
        recurrent_layers=tuple((i + 1) % interval != 0 for i in range(n_layer)),
        indexer_top_k=int(get("attention.indexer.top_k")),
        compress_ratios=tuple(int(v) for v in get("attention.compress_ratios")),
        ple=ple,
    )
