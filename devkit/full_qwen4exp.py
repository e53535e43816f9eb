"""A full-width random-weight qwen4exp GGUF: Qwen3.8-Flash-Next's every per-layer shape, fewer layers.

    python -m devkit.full_qwen4exp OUT.gguf --layers 12 --ple-fraction 0.25 --threads 16 \
        [--tokenizer M.gguf] [--seed 0] [--plan]

Why: the tiny model (`tiny_qwen4exp.py`) proves behaviour, not cost. Load time, the fit estimate,
prefill and decode rates and checkpoint sizes depend on the real widths, so this writes them, in
the tensor types of a UD-Q4_K_XL file; only the depth and the PLE table's rows are scaled down, as
far as a 64 GiB disk forces. The shapes below are config.json's of Qwen/Qwen3.8-Flash-Next; the
PLE head vocabularies are the 16 consecutive primes from 20,000,000 (320,001,446 rows, padded to
320,001,536), the multipliers the published ones. At 48 layers the plan has the published GGUFs'
1,224 tensors and 176.94B parameters.

Tensor types: unsloth's per-tensor list for UD-Q4_K_XL is not public. The small families take
the types of a published type census of its UD-IQ1_S of this model (assumed kept at least there
in Q4_K_XL): F32 for 1-D tensors, norms, hyper-connection norms and injects, routers, conv
kernels and `ssm_*` gates; BF16 for the QSA indexer; Q8_0 for hyper-connection down/up,
`ple_key/value` and `ffn_down_shexp`; Q5_K and Q6_K for the mixers' projections and the shared
expert's gate/up (212 and 40 of those 252 tensors in the census, which 40 unknown: here Q6_K for
the 48 output projections, `ssm_out` and `attn_output`). The rest follows llama.cpp's Q4_K_M
rules: Q6_K `output`, Q4_K `token_embd` and routed gate/up; routed `ffn_down_exps` (640 columns,
which no 256-value K-quant block fits) Q8_0 where `use_more_bits` asks for Q6_K, else Q5_0,
llama-quant's fallbacks; IQ4_NL for the PLE table (26.82 GiB at full size, as published). At 48
layers that is about 2% over the published 103.7 GiB (docs/results/scale.md).

Weights are random with finite scales: quantized blocks are random bytes whose f16 scales are set
to one small value per tensor, spreading its values about fan-in scaled (a random f16 may be inf
or NaN). The data is written in parallel, a job per tensor or 32 MiB piece, each with its own
seed: the file depends on the arguments, not on `--threads`. data=False leaves the data a sparse
hole, for llama.cpp's `no_alloc` shape check. The tokenizer (SmolLM2's, from any GGUF) is padded
with unused tokens to the real vocabulary.
"""

from __future__ import annotations

import argparse
import errno
import json
import multiprocessing
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.gguf_writer import GGUFValue

from .gguf_tokenizer import copy_tokenizer

ARCH = "qwen4exp"
N_LAYER_REAL, N_EMBD, N_VOCAB, N_CTX = 48, 2560, 248_320, 262_144
N_HEAD, N_HEAD_KV, HEAD_DIM, N_ROT, ROPE_SECTIONS = 24, 2, 256, 64, (11, 11, 10, 0)
SSM_CONV, SSM_STATE, SSM_GROUPS, SSM_V_HEADS = 4, 128, 16, 48  # linear_num_key/value_heads, head dims
IDX_HEADS, IDX_DIM, IDX_TOP_K, COMPRESS_RATIO = 4, 128, 2048, 4  # indexer_budget: top_k
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_FF_SHEXP = 512, 10, 640, 640
HC, HC_LOW_RANK, FULL_ATTN_INTERVAL = 4, 320, 4  # hc_count, hc_lowrank
PLE_LAYER, PLE_NGRAM, PLE_HEADS_PER_NGRAM, PLE_CONV, PLE_ROW_DIM = 1, 3, 8, 4, 160  # ple_layer_ids [2]
PLE_VOCAB_BASE, PLE_ROW_ALIGN = 20_000_000, 128
PLE_MULTIPLIERS = (23_703_573_157_769, 20_109_073_645_365, 8_052_911_324_071)
PLE_TENSOR = "per_layer_token_embd.weight"
FTYPE_Q4_K_M = 15  # general.file_type of a Q4_K_M-family file
CHUNK_BYTES = 32 << 20
_UNUSED = 5  # llama_token_type LLAMA_TOKEN_TYPE_UNUSED: no special-token matching

# ggml block layouts (ggml-common.h): where each f16 scale sits, and scale = std * factor.
# The factors make random codes spread about `std` (Q4_K: d*sc*q - dmin*m, sc/m 6-bit, q 4-bit,
# dmin = 7.5 d centres it; Q6_K: d*sc*(q-32), sc int8; IQ4_NL: d*kvalue, kvalues' spread ~68).
SCALES: dict[T, tuple[tuple[int, float], ...]] = {
    T.Q4_K: ((0, 1 / 255), (2, 7.5 / 255)),
    T.Q5_K: ((0, 1 / 520), (2, 15.5 / 520)),
    T.Q6_K: ((208, 1 / 1369),),
    T.Q8_0: ((0, 1 / 74),),
    T.Q5_0: ((0, 1 / 9.2),),
    T.IQ4_NL: ((0, 1 / 68),),
}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: ggml shape (`ne`, fastest first), type, and how its values are drawn."""

    name: str
    ne: tuple[int, ...]
    type: T
    init: str = "normal"  # "normal" (std), "ones", "ssm_a" (negative), "uniform" (-1..1)
    std: float = 0.0

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne))

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.type]
        return self.n_elements // block * size


def layer_kinds(n_layer: int) -> tuple[str, ...]:
    """Each layer's kind, "gdn" or "qsa": the real pattern (every 4th is QSA) when n_layer is a multiple
    of 4; else GDN layers then one QSA layer last (a 2-layer test model is [gdn, qsa])."""
    interval = FULL_ATTN_INTERVAL if n_layer % FULL_ATTN_INTERVAL == 0 else n_layer
    return tuple("gdn" if (i + 1) % interval else "qsa" for i in range(n_layer))


def ple_layer(kinds: tuple[str, ...]) -> int:
    """The real PLE layer (1) where it is a GDN layer, else 0 (PLE must sit on a GDN layer)."""
    return PLE_LAYER if len(kinds) > PLE_LAYER and kinds[PLE_LAYER] == "gdn" else 0


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % p for p in range(2, int(n**0.5) + 1))


def ple_head_vocab(fraction: float) -> tuple[int, ...]:
    """The 16 heads' row counts: consecutive primes from 20,000,000 x fraction (the real ones at
    1.0; a smaller table keeps distinct prime head vocabularies, as the hash expects)."""
    n_heads = (PLE_NGRAM - 1) * PLE_HEADS_PER_NGRAM
    out: list[int] = []
    k = max(257, round(PLE_VOCAB_BASE * fraction))
    while len(out) < n_heads:
        if _is_prime(k):
            out.append(k)
        k += 1
    return tuple(out)


def ffn_down_type(il: int, n_layer: int) -> T:
    """llama.cpp Q4_K_M for a MoE ffn_down: Q6_K where `use_more_bits`, else Q4_K; 640 columns
    hold no 256-value block, so llama-quant's fallbacks make them Q8_0 and Q5_0."""
    more = il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2
    return T.Q8_0 if more else T.Q5_0


def tensor_plan(n_layer: int, ple_fraction: float) -> list[TensorSpec]:
    """Every tensor of the model in file order: the shapes llama.cpp's qwen4exp loader creates
    (src/models/qwen4exp.cpp, load_arch_tensors) with the UD-Q4_K_XL types above."""
    E, hc_dim, kinds = N_EMBD, HC * N_EMBD, layer_kinds(n_layer)
    key_dim, val_dim = SSM_GROUPS * SSM_STATE, SSM_V_HEADS * SSM_STATE
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    out: list[TensorSpec] = []

    def w(name: str, ne: tuple[int, ...], t: T, gain: float = 1.0) -> None:
        out.append(TensorSpec(name, ne, t, "normal", gain / ne[0] ** 0.5))

    def const(name: str, ne: tuple[int, ...], init: str = "ones") -> None:
        out.append(TensorSpec(name, ne, T.F32, init))

    def hc_block(prefix: str, inject: bool) -> None:
        const(f"{prefix}_norm.weight", (E, HC))
        w(f"{prefix}_down.weight", (hc_dim, HC_LOW_RANK), T.Q8_0)
        w(f"{prefix}_up.weight", (HC_LOW_RANK, hc_dim), T.Q8_0)
        if inject:
            w(f"{prefix}_inject.weight", (hc_dim, HC), T.F32)

    out.append(TensorSpec("token_embd.weight", (E, N_VOCAB), T.Q4_K, "normal", 1.0))
    w("output.weight", (E, N_VOCAB), T.Q6_K, gain=4.0)  # untied: a tied random head echoes
    hc_block("output_hc", inject=False)
    for il, kind in enumerate(kinds):
        b = f"blk.{il}."
        hc_block(b + "hc_attn", inject=True)
        hc_block(b + "hc_ffn", inject=True)
        if kind == "gdn":
            w(b + "attn_qkv.weight", (E, 2 * key_dim + val_dim), T.Q5_K)
            w(b + "attn_gate.weight", (E, val_dim), T.Q5_K)
            w(b + "ssm_conv1d.weight", (SSM_CONV, 2 * key_dim + val_dim), T.F32)
            const(b + "ssm_dt.bias", (SSM_V_HEADS,), "uniform")
            const(b + "ssm_a", (SSM_V_HEADS,), "ssm_a")
            w(b + "ssm_beta.weight", (E, SSM_V_HEADS), T.F32)
            w(b + "ssm_alpha.weight", (E, SSM_V_HEADS), T.F32)
            const(b + "ssm_norm.weight", (SSM_STATE,))
            w(b + "ssm_out.weight", (val_dim, E), T.Q6_K)
        else:
            w(b + "attn_q.weight", (E, 2 * q_dim), T.Q5_K)  # [q|gate] interleaved per head
            w(b + "attn_k.weight", (E, kv_dim), T.Q5_K)
            w(b + "attn_v.weight", (E, kv_dim), T.Q5_K)
            w(b + "attn_output.weight", (q_dim, E), T.Q6_K)
            const(b + "attn_q_norm.weight", (HEAD_DIM,))
            const(b + "attn_k_norm.weight", (HEAD_DIM,))
            w(b + "indexer.q_proj.weight", (E, IDX_HEADS * IDX_DIM), T.BF16)
            w(b + "indexer.k_proj.weight", (E, IDX_DIM), T.BF16)
            const(b + "indexer.q_norm.weight", (IDX_DIM,))
            const(b + "indexer.k_norm.weight", (IDX_DIM,))
        if il == ple_layer(kinds):
            w(b + "ple_key.weight", (E, hc_dim), T.Q8_0)
            w(b + "ple_value.weight", (E, E), T.Q8_0)
            for n in ("key", "query", "conv"):
                const(b + f"ple_norm_{n}.weight", (E, HC))
            w(b + "ple_conv1d.weight", (PLE_CONV, hc_dim), T.F32)
        w(b + "ffn_gate_inp.weight", (E, N_EXPERT), T.F32)
        w(b + "ffn_gate_exps.weight", (E, N_FF_EXP, N_EXPERT), T.Q4_K)
        w(b + "ffn_up_exps.weight", (E, N_FF_EXP, N_EXPERT), T.Q4_K)
        w(b + "ffn_down_exps.weight", (N_FF_EXP, E, N_EXPERT), ffn_down_type(il, n_layer))
        w(b + "ffn_gate_inp_shexp.weight", (E,), T.F32)
        w(b + "ffn_gate_shexp.weight", (E, N_FF_SHEXP), T.Q5_K)
        w(b + "ffn_up_shexp.weight", (E, N_FF_SHEXP), T.Q5_K)
        w(b + "ffn_down_shexp.weight", (N_FF_SHEXP, E), T.Q8_0)
    rows = -(-sum(ple_head_vocab(ple_fraction)) // PLE_ROW_ALIGN) * PLE_ROW_ALIGN
    out.append(TensorSpec(PLE_TENSOR, (PLE_ROW_DIM, rows), T.IQ4_NL, "normal", 0.5))
    return out


def plan_summary(n_layer: int, ple_fraction: float) -> dict[str, object]:
    """Bytes and parameters: per layer, by type, in all; what `--plan` prints."""
    plan = tensor_plan(n_layer, ple_fraction)
    per_layer = [0] * n_layer
    by_type: dict[str, list[int]] = {}
    for s in plan:
        if s.name.startswith("blk."):
            per_layer[int(s.name.split(".")[1])] += s.nbytes
        row = by_type.setdefault(s.type.name, [0, 0, 0])
        row[0], row[1], row[2] = row[0] + 1, row[1] + s.n_elements, row[2] + s.nbytes
    ple = plan[-1]
    return {
        "layers": n_layer,
        "kinds": "".join("G" if k == "gdn" else "Q" for k in layer_kinds(n_layer)),
        "ple_layer": ple_layer(layer_kinds(n_layer)),
        "tensors": len(plan),
        "params": sum(s.n_elements for s in plan),
        "bytes": sum(s.nbytes for s in plan),
        "ple_rows": ple.ne[1],
        "ple_bytes": ple.nbytes,
        "global_bytes": sum(s.nbytes for s in plan[:-1] if not s.name.startswith("blk.")),
        "layer_bytes": per_layer,
        "by_type": {k: {"tensors": v[0], "params": v[1], "bytes": v[2]} for k, v in by_type.items()},
    }


class Job(NamedTuple):
    """A self-contained piece of the data section: a worker needs nothing else to write it."""

    offset: int  # in the file
    type_name: str
    init: str
    std: float
    n: int  # blocks (quantized) or values (float) in the piece
    seed: tuple[int, int, int]


def _jobs(plan: list[TensorSpec], data_start: int, seed: int) -> list[Job]:
    jobs, offset = [], data_start
    for i, s in enumerate(plan):
        block, size = GGML_QUANT_SIZES[s.type]
        n_blocks = s.n_elements // block
        per = n_blocks if s.type in (T.F32, T.BF16) else max(1, CHUNK_BYTES // size)
        for c, first in enumerate(range(0, n_blocks, per)):
            count = min(per, n_blocks - first)
            jobs.append(Job(offset + first * size, s.type.name, s.init, s.std, count, (seed, i, c)))
        offset += GGUFWriter.ggml_pad(s.nbytes, 32)
    return jobs


def job_bytes(job: Job) -> np.ndarray:
    """The bytes of one piece (uint8): random codes with fixed finite scales, or float values."""
    rng = np.random.Generator(np.random.SFC64(list(job.seed)))
    t = T[job.type_name]
    if t in (T.F32, T.BF16):
        if job.init == "ones":
            x = np.ones(job.n, np.float32)
        elif job.init == "ssm_a":
            x = -np.exp(rng.uniform(np.log(0.5), np.log(4.0), job.n)).astype(np.float32)
        elif job.init == "uniform":
            x = rng.uniform(-1.0, 1.0, job.n).astype(np.float32)
        else:
            x = rng.standard_normal(job.n, np.float32) * np.float32(job.std)
        if t == T.BF16:  # the high half of each float32
            return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return x.view(np.uint8)
    size = GGML_QUANT_SIZES[t][1]
    words = -(-job.n * size // 8)
    raw = rng.integers(0, 2**64 - 1, words, np.uint64, endpoint=True).view(np.uint8)
    blocks = raw[: job.n * size].reshape(job.n, size)
    for at, factor in SCALES[t]:
        blocks[:, at : at + 2] = np.frombuffer(np.float16(job.std * factor).tobytes(), np.uint8)
    return blocks.reshape(-1)


_fd = -1


def _open_worker(path: str) -> None:
    global _fd
    _fd = os.open(path, os.O_WRONLY)


def _write_job(job: Job) -> None:
    data = job_bytes(job)
    if os.pwrite(_fd, data.data, job.offset) != data.nbytes:
        raise OSError(f"short write at {job.offset}")


def write_full_qwen4exp(
    out_path: Path,
    *,
    n_layer: int,
    ple_fraction: float,
    tokenizer_gguf: Path,
    threads: int = 1,
    seed: int = 0,
    data: bool = True,
) -> dict[str, object]:
    """Write the model; returns `plan_summary` plus the seconds taken. data=False leaves the
    data section a sparse hole (metadata and shapes only: for llama.cpp's `no_alloc` load)."""
    if n_layer < 2 or not 0 < ple_fraction <= 1:
        raise ValueError("n_layer must be >= 2 and ple_fraction in (0, 1]")
    t0 = time.perf_counter()
    plan = tensor_plan(n_layer, ple_fraction)
    out_path = Path(out_path)
    w = GGUFWriter(out_path, ARCH)
    w.add_name(f"full-width qwen4exp, {n_layer} of {N_LAYER_REAL} layers (random weights)")
    w.add_uint32("general.file_type", FTYPE_Q4_K_M)
    eos = _add_tokenizer(w, tokenizer_gguf)
    _add_hparams(w, n_layer, ple_fraction, eos)
    for s in plan:  # numpy order (slowest first); any non-uint8 dtype keeps the shape as given
        w.add_tensor_info(s.name, s.ne[::-1], np.dtype(np.float32), s.nbytes, raw_dtype=s.type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    data_start = fout.tell()
    w.close()
    total = data_start + sum(GGUFWriter.ggml_pad(s.nbytes, 32) for s in plan)
    with open(out_path, "r+b") as fh:
        try:  # reserve the space now: a full disk fails here, not halfway through
            os.posix_fallocate(fh.fileno(), 0, total) if data else os.truncate(fh.fileno(), total)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.truncate(fh.fileno(), total)
    if data:
        jobs = _jobs(plan, data_start, seed)
        if threads <= 1:
            _open_worker(str(out_path))
            try:
                for job in jobs:
                    _write_job(job)
            finally:
                os.close(_fd)
        else:
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(threads, initializer=_open_worker, initargs=(str(out_path),)) as pool:
                for _ in pool.imap_unordered(_write_job, jobs):
                    pass
    return {**plan_summary(n_layer, ple_fraction), "file_bytes": total, "seconds": time.perf_counter() - t0}


def _add_tokenizer(w: GGUFWriter, src: Path) -> int:
    """Copy src's tokenizer and pad it with unused tokens to the real vocabulary; returns EOS."""
    tok = copy_tokenizer(Path(src), w, None)
    pad = N_VOCAB - tok.n_vocab
    if pad < 0:
        raise ValueError(f"{src} has {tok.n_vocab} tokens, more than {N_VOCAB}")
    extra: dict[str, list[Any]] = {
        "tokenizer.ggml.tokens": [f"<|velo_unused_{i}|>" for i in range(pad)],
        "tokenizer.ggml.token_type": [_UNUSED] * pad,
        "tokenizer.ggml.scores": [0.0] * pad,
    }
    for key, values in extra.items():
        kv = w.kv_data[0].get(key)
        if kv is not None:
            w.kv_data[0][key] = GGUFValue(list(kv.value) + values, kv.type, kv.sub_type)
    return tok.eos_token_id


def _add_hparams(w: GGUFWriter, n_layer: int, ple_fraction: float, eos: int) -> None:
    a, kinds = ARCH, layer_kinds(n_layer)
    interval = FULL_ATTN_INTERVAL if n_layer % FULL_ATTN_INTERVAL == 0 else n_layer
    # fmt: off
    u32 = {
        "context_length": N_CTX, "embedding_length": N_EMBD, "block_count": n_layer,
        "feed_forward_length": N_FF_SHEXP, "full_attention_interval": interval,
        "attention.head_count": N_HEAD, "attention.head_count_kv": N_HEAD_KV,
        "attention.key_length": HEAD_DIM, "attention.value_length": HEAD_DIM, "rope.dimension_count": N_ROT,
        "expert_count": N_EXPERT, "expert_used_count": N_EXPERT_USED,
        "expert_feed_forward_length": N_FF_EXP, "expert_shared_feed_forward_length": N_FF_SHEXP,
        "ssm.conv_kernel": SSM_CONV, "ssm.inner_size": SSM_V_HEADS * SSM_STATE, "ssm.state_size": SSM_STATE,
        "ssm.time_step_rank": SSM_V_HEADS, "ssm.group_count": SSM_GROUPS,
        "hyper_connection.count": HC, "hyper_connection.low_rank": HC_LOW_RANK,
        "attention.indexer.head_count": IDX_HEADS, "attention.indexer.key_length": IDX_DIM,
        "attention.indexer.top_k": IDX_TOP_K, "embedding_length_per_layer_input": PLE_ROW_DIM,
        "ple.ngram_size": PLE_NGRAM, "ple.heads_per_ngram": PLE_HEADS_PER_NGRAM, "ple.conv_kernel": PLE_CONV,
        "ple.eos_token_id": eos,
    }
    # fmt: on
    for key, val in u32.items():
        w.add_uint32(f"{a}.{key}", val)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", 1e7)
    w.add_array(f"{a}.rope.dimension_sections", list(ROPE_SECTIONS))
    ratios = [0 if k == "gdn" else COMPRESS_RATIO for k in kinds]
    w.add_key_value(f"{a}.attention.compress_ratios", ratios, GGUFValueType.ARRAY, GGUFValueType.UINT32)
    w.add_array(f"{a}.ple.layers", [ple_layer(kinds)])
    vocab = ple_head_vocab(ple_fraction)
    offsets = np.concatenate([[0], np.cumsum(vocab)[:-1]]).tolist()
    arrays = {"layer_multipliers": PLE_MULTIPLIERS, "head_offsets": offsets, "head_vocab_sizes": vocab}
    for name, vals in arrays.items():  # UINT64, or llama.cpp refuses the arrays
        w.add_key_value(f"{a}.ple.{name}", [int(v) for v in vals], GGUFValueType.ARRAY, GGUFValueType.UINT64)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=12, help="of the real 48 (a multiple of 4)")
    ap.add_argument("--ple-fraction", type=float, default=0.25, help="share of the real PLE table's rows")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="writer processes")
    ap.add_argument("--tokenizer", type=Path, help="a GGUF to copy the tokenizer from (default: SmolLM2's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plan", action="store_true", help="print the sizes as JSON, write nothing")
    args = ap.parse_args(argv)
    if args.plan:
        print(json.dumps(plan_summary(args.layers, args.ple_fraction), indent=1))
        return
    if args.tokenizer is None:
        from .data_cache import smollm2

        args.tokenizer = smollm2(None)
    result = write_full_qwen4exp(
        args.out,
        n_layer=args.layers,
        ple_fraction=args.ple_fraction,
        tokenizer_gguf=args.tokenizer,
        threads=args.threads,
        seed=args.seed,
    )
    print(json.dumps({k: v for k, v in result.items() if k != "by_type"}))


if __name__ == "__main__":
    main()
