"""The memory a profile needs, term by term, from the model's headers (`ModelFacts`).

Each term says how many bytes, where they live (RAM, GPU memory, or the page cache) and the
arithmetic, so the table can be followed by hand. The formulas follow llama.cpp's allocations:

- weights: the tensor sizes of each layer, on the device llama.cpp puts that layer on
  (`n_gpu_layers` = the last N layers plus the output layer; the input embeddings stay on the CPU);
- KV cache: n_ctx (rounded up to 256) x, per attention layer, one K row and one V row of the
  cache types; recurrent layers keep none (plus qwen4exp's indexer keys, one K row per layer);
- recurrent state: (conv + ssm state values) x 4 bytes per recurrent layer, x n_seq x (1 + n_rs_seq);
- compute buffers: estimated from the graph's largest tensors (`compute_bytes`); with every
  layer on a GPU, the GPU's buffer and the pinned host buffer that holds the graph's inputs and
  the CPU's split (`graph_inputs`, `cpu_split`); each term is checked against llama.cpp's own
  logged buffers by benchmarks/fit_sweep.py (docs/fit.md; where: docs/results/fit.md);
- checkpoints: the RAM budget plus the two states that may go past it (docs/checkpoints.md);
- the PLE table: read into RAM, or kept on lazy mmap (page cache: reclaimable, but decode slows
  when it is evicted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config.profile_schema import Profile
from .compute import (
    OP_OFFLOAD_MIN_BATCH,
    attention_on_cpu,
    compute_bytes,
    cpu_split,
    cuda_ssm_conv,
    fa_on_cpu,
    flash_attn_on,
    graph_inputs,
    op_offload_peak,
    ubatch_of,
)
from .model_facts import ModelFacts
from .sizes import GIB, MIB, fmt, row_bytes, size

N_CTX_PAD = 256  # llama.cpp pads n_ctx to this
LAZY_AUTO_MIN = 4 * GIB  # lazy_mode "auto" keeps a PLE table this large on mmap
CUDA_CONTEXT = 512 * MIB  # the CUDA runtime's own context and kernels (an estimate)
RESERVE = 1 * GIB  # kept free: a machine with nothing available stalls instead of failing
N_SEQ = 1  # the engine runs one sequence

RAM, GPU, CACHE = "RAM", "GPU", "page cache"


@dataclass(frozen=True)
class Term:
    key: str  # stable name (JSON, tests)
    label: str
    bytes: int
    place: str  # RAM, GPU or page cache
    formula: str  # the arithmetic, in words and numbers
    # what llama.cpp's buffer line shows for it when that differs from the memory needed: the
    # mapped file range of the CPU weights (`mapped_span`); None: `bytes`
    logged: int | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "key": self.key,
            "label": self.label,
            "bytes": self.bytes,
            "place": self.place,
            "formula": self.formula,
        }
        if self.logged is not None:
            out["logged"] = self.logged
        return out


@dataclass(frozen=True)
class Placement:
    """Which layers llama.cpp puts on the GPU (llama-model.cpp: `i_gpu_start`)."""

    n_layer: int
    n_gpu_layers: int  # as resolved: 0 without GPU offload

    @classmethod
    def of(cls, n_layer: int, setting: int, offload: bool) -> Placement:
        if not offload:
            return cls(n_layer, 0)
        return cls(n_layer, n_layer + 1 if setting < 0 else min(setting, n_layer + 1))

    def on_gpu(self, il: int) -> bool:
        """Layer `il` (n_layer = the output layer) on the GPU?"""
        return il >= self.n_layer + 1 - self.n_gpu_layers

    @property
    def any_gpu(self) -> bool:
        return self.n_gpu_layers > 0


def n_ctx_of(profile: Profile, facts: ModelFacts) -> int:
    n = profile.context.n_ctx or facts.n_ctx_train or 4096
    return -(-n // N_CTX_PAD) * N_CTX_PAD


def n_rs_seq_of(profile: Profile, facts: ModelFacts) -> int:
    """Recurrent-state snapshots per sequence: with speculative decoding on a hybrid model the
    engine keeps one per draft token (`speculation.max_draft`), so a rejected draft can be
    rolled back; none otherwise. A hybrid model's verify batches are never bit-identical to
    one-token steps, so it drafts (and keeps snapshots) only where the profile accepts the
    batch rounding (`engine/speculation/stepper.py: speculation_mode`)."""
    spec = profile.speculation
    if not facts.hybrid or not getattr(spec, "enabled", False):
        return 0
    if not getattr(spec, "allow_batch_rounding", False):
        return 0
    return int(getattr(spec, "max_draft", 0) or 0)


def ple_lazy(profile: Profile, facts: ModelFacts, integrated_gpu: bool) -> bool:
    """Whether llama.cpp keeps the PLE table on lazy mmap: "on" always; "auto" when it is over
    4 GiB, except on an integrated GPU, where llama.cpp turns lazy reading off."""
    mode = profile.model.lazy_ple
    if not facts.ple_bytes or mode == "off":
        return False
    return mode == "on" or (facts.ple_bytes > LAZY_AUTO_MIN and not integrated_gpu)


def mapped_span(facts: ModelFacts, on_cpu: Callable[[str], bool]) -> int:
    """The bytes llama.cpp maps for the CPU's weights with `use_mmap`: per shard, the file range
    from its first CPU tensor to its last, GPU tensors in between included (llama-model.cpp:
    `get_mapping_range`). Those pages are mapped, not all resident: only the CPU tensors' must
    stay in the page cache, which is what the weights term counts."""
    total = 0
    for shard in {s.shard for s in facts.spans}:
        mine = [s for s in facts.spans if s.shard == shard and on_cpu(s.group)]
        if mine:
            total += max(s.end for s in mine) - min(s.start for s in mine)
    return total


def estimate(
    profile: Profile,
    facts: ModelFacts,
    *,
    gpu_offload: bool = False,
    integrated_gpu: bool = False,
    ple_gpu: bool = False,
) -> list[Term]:
    """Every term of the memory the profile needs. `gpu_offload`: the llama.cpp build can put
    layers on a GPU; `integrated_gpu`: that GPU allocates from system RAM (its terms still say
    GPU; the report compares them with MemAvailable); `ple_gpu`: the PLE rows are gathered on the
    GPU (`model.ple_gather` resolved to "gpu", engine/llama/ple_provider.py), which puts the
    token-embedding table on the GPU too."""
    place = Placement.of(facts.n_layer, profile.model.n_gpu_layers, gpu_offload)
    ple_gpu = ple_gpu and place.any_gpu
    lazy = ple_lazy(profile, facts, integrated_gpu and place.any_gpu)
    n_ctx = n_ctx_of(profile, facts)
    split = WeightSplit.of(facts, place, ple_gpu)
    terms = [
        _cpu_weights(profile, facts, split, lazy),
        *_gpu_weights(profile, facts, split),
        *_ple_table(profile, facts, lazy),
        *_kv_cache(profile, facts, place, n_ctx),
        *_recurrent_state(profile, facts, place),
        *_buffers(profile, facts, split, n_ctx, op_offload=gpu_offload and not place.any_gpu),
    ]
    return terms + _checkpoints(profile, facts, terms)


@dataclass(frozen=True)
class WeightSplit:
    """Which weights llama.cpp puts on the CPU and which on the GPU."""

    place: Placement
    gpu_layers: list[int]
    cpu_layers: list[int]
    out_gpu: bool  # the output layer is on the GPU
    ple_gpu: bool  # the PLE rows are gathered on the GPU
    embd_gpu: int  # token-embedding bytes on the GPU (the GPU gather's tensor override)
    conv_cpu_always: bool  # recurrent conv weights stay on the CPU whatever their layer's device
    conv_moved: int  # conv weights of GPU layers kept on the CPU for that reason

    @classmethod
    def of(cls, facts: ModelFacts, place: Placement, ple_gpu: bool) -> WeightSplit:
        gpu_layers = [il for il in range(facts.n_layer) if place.on_gpu(il)]
        # llama.cpp keeps the recurrent layers' conv weights on the CPU where CUDA's conv cannot
        # take their channel count (it checks each weight's op on the layer's device)
        conv_cpu_always = place.any_gpu and bool(facts.recurrent_layers) and not cuda_ssm_conv(facts)
        conv_per_layer = facts.ssm_conv_bytes // max(len(facts.recurrent_layers), 1)
        conv_moved = conv_per_layer * len([il for il in gpu_layers if il in facts.recurrent_layers])
        return cls(
            place,
            gpu_layers,
            [il for il in range(facts.n_layer) if not place.on_gpu(il)],
            place.on_gpu(facts.n_layer),
            ple_gpu,
            facts.token_embd_bytes if ple_gpu else 0,
            conv_cpu_always,
            conv_moved if conv_cpu_always else 0,
        )

    def tensor_on_cpu(self, group: str, lazy: bool) -> bool:
        """Whether a tensor group (`ModelFacts.spans`: "12:ssm_conv", "token_embd", ...) is
        read on the CPU."""
        layer, _, part = group.partition(":")
        if layer.isdigit():
            return not self.place.on_gpu(int(layer)) or (part == "ssm_conv" and self.conv_cpu_always)
        return {"token_embd": not self.ple_gpu, "ple": not lazy, "output": not self.out_gpu}.get(group, True)


def _cpu_weights(profile: Profile, facts: ModelFacts, split: WeightSplit, lazy: bool) -> Term:
    cpu_w = (
        facts.input_bytes
        - split.embd_gpu
        + sum(facts.layer_bytes[il] for il in split.cpu_layers)
        + split.conv_moved
    )
    cpu_w += 0 if split.out_gpu else facts.output_bytes
    how = "mmap, must stay in the page cache" if profile.model.use_mmap else "read into RAM"
    with_input = " + input" if facts.input_bytes > split.embd_gpu else ""
    logged = None
    if profile.model.use_mmap and split.place.any_gpu:
        logged = mapped_span(facts, lambda group: split.tensor_on_cpu(group, lazy))
        logged -= 0 if lazy else facts.ple_bytes
        how += f"; llama.cpp maps {fmt(logged + (0 if lazy else facts.ple_bytes))} (`mapped_span`)"
    conv = split.conv_moved
    output = "" if split.out_gpu else " + output"
    return Term(
        "weights_cpu",
        f"weights on the CPU ({len(split.cpu_layers)} layers{output}{with_input})",
        cpu_w,
        RAM,
        f"tensor sizes from the GGUF tables of {len(facts.shards)} shard(s)"
        + (f" (+ {size(conv)} conv weights CUDA's conv cannot take)" if conv else "")
        + f"; {how}",
        logged,
    )


def _gpu_weights(profile: Profile, facts: ModelFacts, split: WeightSplit) -> list[Term]:
    if not split.place.any_gpu:
        return []
    gpu_layers, out_gpu, embd_gpu = split.gpu_layers, split.out_gpu, split.embd_gpu
    gpu_w = sum(facts.layer_bytes[il] for il in gpu_layers) + (facts.output_bytes if out_gpu else 0)
    tied = out_gpu and facts.tied_output
    gpu_w += (facts.token_embd_bytes if tied else 0) + embd_gpu - split.conv_moved
    return [
        Term(
            "weights_gpu",
            f"weights on the GPU ({len(gpu_layers)} layers{' + output' if out_gpu else ''}"
            f"{' + token_embd' if embd_gpu else ''})",
            gpu_w,
            GPU,
            f"n_gpu_layers {profile.model.n_gpu_layers}: layers {gpu_layers[0] if gpu_layers else '-'}"
            f"..{facts.n_layer - 1}"
            + (" (+ token_embd again: tied output head)" if tied else "")
            + (" (+ token_embd: moved there for the GPU PLE gather)" if embd_gpu else ""),
        )
    ]


def _ple_table(profile: Profile, facts: ModelFacts, lazy: bool) -> list[Term]:
    if not facts.ple_bytes:
        return []
    if lazy:
        return [
            Term("ple", "PLE table (lazy mmap)", facts.ple_bytes, CACHE, "rows read on demand; reclaimable")
        ]
    return [
        Term("ple", "PLE table (read at load)", facts.ple_bytes, RAM, f"lazy_ple {profile.model.lazy_ple!r}")
    ]


def _kv_cache(profile: Profile, facts: ModelFacts, place: Placement, n_ctx: int) -> list[Term]:
    """The KV cache: attention layers only."""
    if not facts.kv_layers:
        return []
    ctx = profile.context
    kv_cpu = kv_gpu = 0
    for il, kw, vw in zip(facts.kv_layers, facts.kv_k_width, facts.kv_v_width, strict=True):
        per_cell = row_bytes(ctx.type_k, kw) + row_bytes(ctx.type_v, vw)
        if facts.indexer_key_length and facts.indexer_heads:
            per_cell += row_bytes(ctx.type_k, facts.indexer_key_length)
        if place.on_gpu(il):
            kv_gpu += n_ctx * N_SEQ * per_cell
        else:
            kv_cpu += n_ctx * N_SEQ * per_cell
    kw0, vw0 = facts.kv_k_width[0], facts.kv_v_width[0]
    formula = (
        f"{n_ctx:,} cells x {len(facts.kv_layers)} attention layers of {facts.n_layer} x "
        f"(K {kw0} x {ctx.type_k} + V {vw0} x {ctx.type_v}"
        + (f" + indexer K {facts.indexer_key_length} x {ctx.type_k}" if facts.indexer_key_length else "")
        + ")"
    )
    return [
        Term(key, f"KV cache ({where if where == GPU else 'CPU'})", nbytes, where, formula)
        for key, nbytes, where in (("kv_cpu", kv_cpu, RAM), ("kv_gpu", kv_gpu, GPU))
        if nbytes
    ]


def _recurrent_state(profile: Profile, facts: ModelFacts, place: Placement) -> list[Term]:
    if not facts.recurrent_layers:
        return []
    rows = N_SEQ * (1 + n_rs_seq_of(profile, facts))
    rs_cpu = rs_gpu = 0
    ple_layer_state = facts.ple_conv_state * 4 * rows
    for i, il in enumerate(facts.recurrent_layers):
        nbytes = (facts.n_embd_r + facts.n_embd_s) * 4 * rows + (ple_layer_state if i == 0 else 0)
        if place.on_gpu(il):
            rs_gpu += nbytes
        else:
            rs_cpu += nbytes
    formula = (
        f"{len(facts.recurrent_layers)} recurrent layers x (conv {facts.n_embd_r:,} + ssm "
        f"{facts.n_embd_s:,}) x 4 B x {N_SEQ} seq x (1 + n_rs_seq {rows // N_SEQ - 1})"
        + (f" + PLE conv {facts.ple_conv_state:,} x 4 B" if facts.ple_conv_state else "")
    )
    return [
        Term(key, f"recurrent state ({where if where == GPU else 'CPU'})", nbytes, where, formula)
        for key, nbytes, where in (("rs_cpu", rs_cpu, RAM), ("rs_gpu", rs_gpu, GPU))
        if nbytes
    ]


def _buffers(
    profile: Profile, facts: ModelFacts, split: WeightSplit, n_ctx: int, *, op_offload: bool = False
) -> list[Term]:
    """The logits output and the compute buffers. `op_offload`: no layer is on the GPU but the
    build has one, which then runs the large micro-batches' operations (`op_offload_peak`)."""
    output = Term("output", "logits output", facts.n_vocab * 4 * N_SEQ, RAM, f"{facts.n_vocab:,} x 4 B")
    if op_offload and ubatch_of(profile) >= OP_OFFLOAD_MIN_BATCH:
        comp, formula = op_offload_peak(profile, facts, n_ctx)
        fa = flash_attn_on(profile, facts)
        inputs, inputs_f = graph_inputs(profile, facts, n_ctx, fa=fa)
        work, work_f = cpu_split(profile, facts, ple_gpu=False)
        gpu_side = Term(
            "compute_gpu", "compute buffer (GPU, large micro-batches offloaded)", comp, GPU, formula
        )
        return [output, *_gpu_and_pinned(gpu_side, (inputs, inputs_f), (work, work_f))]
    if not split.out_gpu:
        comp, formula = compute_bytes(profile, facts, n_ctx)
        return [output, Term("compute_cpu", "compute buffer (CPU)", comp, RAM, formula)]
    comp, formula = compute_bytes(profile, facts, n_ctx, cuda=True)
    inputs, inputs_f = graph_inputs(profile, facts, n_ctx)
    if split.cpu_layers:  # the CPU runs whole layers too: its own peak, not measured on a GPU machine
        work, work_f = compute_bytes(profile, facts, n_ctx)
        work_f = f"the CPU layers' {work_f} (not measured with a GPU)"
    else:
        work, work_f = cpu_split(profile, facts, split.ple_gpu)
    if fa_on_cpu(profile, facts, cuda=True):  # one more CPU split: the largest counts
        fa_extra, fa_f = attention_on_cpu(profile, facts, n_ctx)
        work, work_f = max(work, fa_extra), f"the larger of {work_f} and {fa_f}"
    gpu_side = Term("compute_gpu", "compute buffer (GPU)", comp, GPU, formula)
    return [output, *_gpu_and_pinned(gpu_side, (inputs, inputs_f), (work, work_f))]


def _gpu_and_pinned(gpu_side: Term, inputs: tuple[int, str], work: tuple[int, str]) -> list[Term]:
    """The GPU's compute buffer, the CPU side's (pinned: the graph's inputs and the CPU's own
    work), and the CUDA context."""
    return [
        gpu_side,
        Term(
            "compute_cpu",
            "compute buffer (CPU side, pinned)",
            inputs[0] + work[0],
            RAM,
            f"graph inputs {inputs[1]} = {fmt(inputs[0])}; {work[1]}",
        ),
        Term("cuda", "CUDA context", CUDA_CONTEXT, GPU, "an estimate; not yet measured"),
    ]


def _checkpoints(profile: Profile, facts: ModelFacts, terms: list[Term]) -> list[Term]:
    """The checkpoints' RAM: the budget plus two states (the KV and recurrent terms) past it."""
    cp = profile.checkpoints
    if not cp.enabled:
        return []
    state = sum(t.bytes for t in terms if t.key.startswith(("kv_", "rs_")))
    return [
        Term(
            "checkpoints",
            "checkpoints in RAM",
            cp.ram_budget_mib * MIB + 2 * state,
            RAM,
            f"ram_budget_mib {cp.ram_budget_mib:,} + 2 states past it x {fmt(state)} "
            + ("(KV + recurrent)" if facts.recurrent_layers else "(KV)"),
        )
    ]
