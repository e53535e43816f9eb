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
  the CPU's split (`graph_inputs`, `cpu_split`); checked against llama.cpp's logs on the CPU and
  on an H200 (docs/fit.md);
- checkpoints: the RAM budget plus the two states that may go past it (docs/checkpoints.md);
- the PLE table: read into RAM, or kept on lazy mmap (page cache: reclaimable, but decode slows
  when it is evicted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config.profile_schema import Profile
from .compute import attention_on_cpu, compute_bytes, cpu_split, cuda_ssm_conv, fa_on_cpu, graph_inputs
from .model_facts import ModelFacts
from .sizes import GIB, MIB, fmt, row_bytes, size

N_CTX_PAD = 256  # llama.cpp pads n_ctx to this
LAZY_AUTO_MIN = 4 * GIB  # lazy_mode "auto" keeps a PLE table this large on mmap
CUDA_CONTEXT = 512 * MIB  # the CUDA runtime's own context and kernels (an estimate)
RESERVE = 1 * GIB  # kept free: a machine with nothing available stalls instead of failing

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
    terms: list[Term] = []
    ctx = profile.context
    n_ctx = n_ctx_of(profile, facts)
    n_seq = 1  # the engine runs one sequence

    # -- weights
    gpu_layers = [il for il in range(facts.n_layer) if place.on_gpu(il)]
    cpu_layers = [il for il in range(facts.n_layer) if not place.on_gpu(il)]
    out_gpu = place.on_gpu(facts.n_layer)
    embd_gpu = facts.token_embd_bytes if ple_gpu else 0  # the GPU gather's tensor override
    # llama.cpp keeps the recurrent layers' conv weights on the CPU where CUDA's conv cannot
    # take their channel count (it checks each weight's op on the layer's device)
    conv_cpu_always = place.any_gpu and bool(facts.recurrent_layers) and not cuda_ssm_conv(facts)
    conv_per_layer = facts.ssm_conv_bytes // max(len(facts.recurrent_layers), 1)
    conv_moved = conv_per_layer * len([il for il in gpu_layers if il in facts.recurrent_layers])
    conv_moved = conv_moved if conv_cpu_always else 0
    cpu_w = facts.input_bytes - embd_gpu + sum(facts.layer_bytes[il] for il in cpu_layers) + conv_moved
    cpu_w += 0 if out_gpu else facts.output_bytes
    how = "mmap, must stay in the page cache" if profile.model.use_mmap else "read into RAM"
    with_input = " + input" if facts.input_bytes > embd_gpu else ""
    logged = None
    if profile.model.use_mmap and place.any_gpu:

        def on_cpu(group: str) -> bool:
            layer, _, part = group.partition(":")
            if layer.isdigit():
                return not place.on_gpu(int(layer)) or (part == "ssm_conv" and conv_cpu_always)
            return {"token_embd": not ple_gpu, "ple": not lazy, "output": not out_gpu}.get(group, True)

        logged = mapped_span(facts, on_cpu) - (0 if lazy else facts.ple_bytes)
        how += f"; llama.cpp maps {fmt(logged + (0 if lazy else facts.ple_bytes))} (`mapped_span`)"
    terms.append(
        Term(
            "weights_cpu",
            f"weights on the CPU ({len(cpu_layers)} layers{'' if out_gpu else ' + output'}{with_input})",
            cpu_w,
            RAM,
            f"tensor sizes from the GGUF tables of {len(facts.shards)} shard(s)"
            + (f" (+ {size(conv_moved)} conv weights CUDA's conv cannot take)" if conv_moved else "")
            + f"; {how}",
            logged,
        )
    )
    if place.any_gpu:
        gpu_w = sum(facts.layer_bytes[il] for il in gpu_layers) + (facts.output_bytes if out_gpu else 0)
        tied = out_gpu and facts.tied_output
        gpu_w += (facts.token_embd_bytes if tied else 0) + embd_gpu - conv_moved
        terms.append(
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
        )
    if facts.ple_bytes:
        if lazy:
            terms.append(
                Term(
                    "ple", "PLE table (lazy mmap)", facts.ple_bytes, CACHE, "rows read on demand; reclaimable"
                )
            )
        else:
            terms.append(
                Term(
                    "ple",
                    "PLE table (read at load)",
                    facts.ple_bytes,
                    RAM,
                    f"lazy_ple {profile.model.lazy_ple!r}",
                )
            )

    # -- KV cache: attention layers only
    kv_cpu = kv_gpu = 0
    for il, kw, vw in zip(facts.kv_layers, facts.kv_k_width, facts.kv_v_width, strict=True):
        per_cell = row_bytes(ctx.type_k, kw) + row_bytes(ctx.type_v, vw)
        if facts.indexer_key_length and facts.indexer_heads:
            per_cell += row_bytes(ctx.type_k, facts.indexer_key_length)
        if place.on_gpu(il):
            kv_gpu += n_ctx * n_seq * per_cell
        else:
            kv_cpu += n_ctx * n_seq * per_cell
    if facts.kv_layers:
        kw0, vw0 = facts.kv_k_width[0], facts.kv_v_width[0]
        formula = (
            f"{n_ctx:,} cells x {len(facts.kv_layers)} attention layers of {facts.n_layer} x "
            f"(K {kw0} x {ctx.type_k} + V {vw0} x {ctx.type_v}"
            + (f" + indexer K {facts.indexer_key_length} x {ctx.type_k}" if facts.indexer_key_length else "")
            + ")"
        )
        for key, nbytes, where in (("kv_cpu", kv_cpu, RAM), ("kv_gpu", kv_gpu, GPU)):
            if nbytes:
                terms.append(
                    Term(key, f"KV cache ({where if where == GPU else 'CPU'})", nbytes, where, formula)
                )

    # -- recurrent state
    rows = n_seq * (1 + n_rs_seq_of(profile, facts))
    rs_cpu = rs_gpu = 0
    ple_layer_state = facts.ple_conv_state * 4 * rows
    for i, il in enumerate(facts.recurrent_layers):
        nbytes = (facts.n_embd_r + facts.n_embd_s) * 4 * rows + (ple_layer_state if i == 0 else 0)
        if place.on_gpu(il):
            rs_gpu += nbytes
        else:
            rs_cpu += nbytes
    if facts.recurrent_layers:
        formula = (
            f"{len(facts.recurrent_layers)} recurrent layers x (conv {facts.n_embd_r:,} + ssm "
            f"{facts.n_embd_s:,}) x 4 B x {n_seq} seq x (1 + n_rs_seq {rows // n_seq - 1})"
            + (f" + PLE conv {facts.ple_conv_state:,} x 4 B" if facts.ple_conv_state else "")
        )
        for key, nbytes, where in (("rs_cpu", rs_cpu, RAM), ("rs_gpu", rs_gpu, GPU)):
            if nbytes:
                terms.append(
                    Term(key, f"recurrent state ({where if where == GPU else 'CPU'})", nbytes, where, formula)
                )

    # -- output and compute buffers
    terms.append(Term("output", "logits output", facts.n_vocab * 4 * n_seq, RAM, f"{facts.n_vocab:,} x 4 B"))
    if out_gpu:
        comp, formula = compute_bytes(profile, facts, n_ctx, cuda=True)
        terms.append(Term("compute_gpu", "compute buffer (GPU)", comp, GPU, formula))
        inputs, inputs_f = graph_inputs(profile, facts, n_ctx)
        if cpu_layers:  # the CPU runs whole layers too: its own peak, not measured on a GPU machine
            work, work_f = compute_bytes(profile, facts, n_ctx)
            work_f = f"the CPU layers' {work_f} (not measured with a GPU)"
        else:
            work, work_f = cpu_split(profile, facts, ple_gpu)
        if fa_on_cpu(profile, facts, cuda=True):  # one more CPU split: the largest counts
            fa_extra, fa_f = attention_on_cpu(profile, facts, n_ctx)
            work, work_f = max(work, fa_extra), f"the larger of {work_f} and {fa_f}"
        terms.append(
            Term(
                "compute_cpu",
                "compute buffer (CPU side, pinned)",
                inputs + work,
                RAM,
                f"graph inputs {inputs_f} = {fmt(inputs)}; {work_f}",
            )
        )
        terms.append(Term("cuda", "CUDA context", CUDA_CONTEXT, GPU, "an estimate; not yet measured"))
    else:
        comp, formula = compute_bytes(profile, facts, n_ctx)
        terms.append(Term("compute_cpu", "compute buffer (CPU)", comp, RAM, formula))

    # -- checkpoints
    cp = profile.checkpoints
    if cp.enabled:
        state = kv_cpu + kv_gpu + rs_cpu + rs_gpu
        terms.append(
            Term(
                "checkpoints",
                "checkpoints in RAM",
                cp.ram_budget_mib * MIB + 2 * state,
                RAM,
                f"ram_budget_mib {cp.ram_budget_mib:,} + 2 states past it x {fmt(state)} "
                + ("(KV + recurrent)" if facts.recurrent_layers else "(KV)"),
            )
        )
    return terms
