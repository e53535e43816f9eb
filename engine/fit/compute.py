"""The compute buffers llama.cpp reserves for its graphs, estimated from the graph's largest
tensors (docs/fit.md explains each part, and where it was measured).

With every layer on the CPU there is one buffer (`compute_bytes`). With the output layer on a
GPU there are two: the GPU's (`compute_bytes(..., cuda=True)`) and the CPU backend's, in pinned
host memory, which holds the graph's inputs (`graph_inputs`), the CPU's own split (`cpu_split`)
and, when flash attention runs on the CPU, that split's inputs (`attention_on_cpu`).
"""

from __future__ import annotations

from ..config.profile_schema import Profile
from .model_facts import ModelFacts
from .sizes import fmt, row_bytes, size

# head sizes (K, V) that CUDA's flash-attention kernels take (ggml-cuda/fattn.cu); others
# (192, 320, 512 only for some GQA ratios) are left out: the estimate then assumes the CPU
CUDA_FA_HEADS = {(d, d) for d in (40, 64, 72, 80, 96, 112, 128, 256)} | {(576, 512)}


def cuda_fa_kernel(facts: ModelFacts) -> bool:
    """Whether CUDA runs flash attention for this model's head size."""
    return (facts.head_dim_k, facts.head_dim_v) in CUDA_FA_HEADS


def cuda_ssm_conv(facts: ModelFacts) -> bool:
    """Whether CUDA runs the recurrent layers' conv: its kernel wants the channels in multiples
    of 128 (ggml-cuda.cu). Otherwise llama.cpp keeps the conv weights and the op on the CPU."""
    return facts.ssm_channels % 128 == 0


def flash_attn_on(profile: Profile, facts: ModelFacts | None = None, cuda: bool = False) -> bool:
    """Whether llama.cpp runs the attention with flash attention. "auto" enables it on the CPU;
    on CUDA only for a head size CUDA's kernels take (llama.cpp checks where the op lands)."""
    setting = profile.context.flash_attn
    if setting == "auto" and cuda and facts is not None:
        return cuda_fa_kernel(facts)
    return setting != "off"


def fa_on_cpu(profile: Profile, facts: ModelFacts, cuda: bool) -> bool:
    """Flash attention forced on ("on") for a head size CUDA does not take: llama.cpp runs that
    op on the CPU, with copies of its inputs in the pinned host buffer."""
    return cuda and bool(facts.kv_layers) and profile.context.flash_attn == "on" and not cuda_fa_kernel(facts)


def ubatch_of(profile: Profile) -> int:
    return min(profile.context.n_ubatch, profile.context.n_batch)


def _sum(parts: list[tuple[str, float]]) -> tuple[float, str]:
    shown = [(what, n) for what, n in parts if n]
    return sum(n for _w, n in shown), " + ".join(f"{size(n)} {what}" for what, n in shown)


def per_pair(facts: ModelFacts, fa: bool, cuda: bool) -> tuple[float, str]:
    """Bytes per (cached token, batch token) pair at an attention layer's peak: the KQ mask (f16
    with flash attention, f32 without); without flash attention the f32 scores of every head
    (the softmax overwrites them in place); the qwen4exp indexer's scores (per block and head
    before they are summed, then two f32 values per cell: the block scores spread over the
    cells and the mask added to them); with more than one indexer layer, the holes that the
    first one's scratch leaves in the allocator's layout, which a later one's is laid out
    around (fitted to llama.cpp's reserve at full width, docs/fit.md); the temporaries that
    remain (measured); on CUDA without flash attention the mask twice: the scheduler copies the
    mask and its reshaped view to the GPU apart."""
    parts: list[tuple[str, float]] = [("mask", 2 if fa else 4)]
    if not fa:
        parts.append((f"scores ({facts.n_head} heads x 4 B)", 4 * facts.n_head))
    r = facts.indexer_ratio
    if r:
        idx = max(8, 4 * facts.indexer_heads / r) + 4 / r
        parts.append((f"indexer (max(2 x 4 B, {facts.indexer_heads} heads x 4 B / {r}) + 4 B / {r})", idx))
        if len(facts.kv_layers) > 1:
            parts.append(("a later indexer layer's layout", 1.5))
    parts.append(("temporaries", 0.3 if fa else 0.5))
    if cuda and not fa:
        parts.append(("mask's second GPU copy", 4))
    return _sum(parts)


def block_tables(facts: ModelFacts, n_ctx: int) -> int:
    """The indexer's per-cell inputs: each cell's block, each block's cells (i32), and each
    block's 4 positions (i32)."""
    r = facts.indexer_ratio
    return n_ctx * 8 + -(-n_ctx // r) * 16 if r else 0


def compute_bytes(
    profile: Profile, facts: ModelFacts, n_ctx: int, *, cuda: bool = False, fa: bool | None = None
) -> tuple[int, str]:
    """llama.cpp's compute buffer (on the CPU, or the GPU's when every layer is offloaded),
    estimated. The graph allocator reuses memory, so the buffer is the largest of its peaks:
    the logits of a full micro-batch (n_ubatch x n_vocab f32, plus 8 bytes per embedding value
    and token); with hyper-connections, the activations of the hc-wide residual; a recurrent
    layer's state update; an attention layer's scratch per (cached token, batch token) pair (`per_pair`),
    plus the indexer's block tables; and on qwen4exp the indexer pooling its keys over the whole
    cache (gathered as f32 rows, then a block slice and the running block sum) while the mask, the
    block bias and, without flash attention, the scores are there: the peak of small micro-batches
    and of the one-token graph llama.cpp also reserves."""
    ub = ubatch_of(profile)
    fa = flash_attn_on(profile, facts, cuda) if fa is None else fa
    logits = ub * (4 * facts.n_vocab + 8 * facts.n_embd)
    logits_f = f"logits {ub} x ({facts.n_vocab:,} x 4 B + {facts.n_embd} x 8 B) = {fmt(logits)}"
    if not facts.kv_layers:
        return logits, logits_f
    pair, pair_f = per_pair(facts, fa, cuda)
    tables = block_tables(facts, n_ctx)
    r = facts.indexer_ratio
    # per token beside the pairs: 8 B per embedding value, and one hc-wide residual row with
    # hyper-connections (measured on the 2560-wide qwen4exp); with the indexer, which runs
    # between the attention's query projection and its flash attention, also the query with
    # its output gate and the query after its norm and rotation (3 x n_head x head_dim f32),
    # the layer's normed hc-wide input, and one f32 per routed expert for every layer (the
    # router's, kept to the graph's end, so the peak grows with depth; docs/fit.md)
    hc_row = 4 * facts.hc * facts.n_embd if facts.hc > 1 else 0
    row = 8 * facts.n_embd + hc_row
    if r:
        row += 4 * 3 * facts.n_head * facts.head_dim_k + hc_row + 4 * facts.n_expert * facts.n_layer
    attn = int(n_ctx * ub * pair) + ub * row + tables
    peaks = [logits_f, f"attention {n_ctx:,} x {ub} x ({pair_f}) + {ub} x {row:,} B = {fmt(attn)}"]
    best = max(logits, attn)
    if facts.recurrent_layers:
        # a recurrent layer's step: the state read and the state written (2 x ssm state), the conv
        # states, and qwen4exp's PLE conv history, f32
        step = 4 * (2 * facts.n_embd_s + 2 * facts.n_embd_r + facts.ple_conv_state)
        states = f"2 x {facts.n_embd_s:,} + 2 x {facts.n_embd_r:,} + {facts.ple_conv_state:,}"
        peaks.append(f"recurrent step 4 B x ({states}) = {fmt(step)}")
        best = max(best, step)
    if facts.hc > 1:
        # a hyper-connection model's residual is hc x n_embd wide, and around its MoE about six
        # such rows per token are alive at once (measured on a 2560-wide qwen4exp: 12 x n_embd
        # x 4 B per token), with the mask's and the block bias's rows still there
        rows = (2 if fa else 4) + (4 / r if r else 0)
        act = int(ub * 4 * 6 * facts.hc * facts.n_embd + n_ctx * ub * rows) + tables
        peaks.append(f"activations {ub} x 6 x {facts.hc} x {facts.n_embd} x 4 B + mask, bias = {fmt(act)}")
        best = max(best, act)
    if r:
        d = facts.indexer_key_length
        # with the keys: the mask (twice on CUDA without flash attention), the scores without
        # flash attention, and the block bias, for each batch token
        with_keys = (2 if fa else 4 + 4 * facts.n_head + (4 if cuda else 0)) + 4 / r
        pool = int(n_ctx * (4 * d + 8 * d // r + ub * with_keys)) + tables
        peaks.append(
            f"indexer keys {n_ctx:,} x ({4 * d} + 2 x {4 * d // r} B + {ub} x {with_keys:g} B) = {fmt(pool)}"
        )
        best = max(best, pool)
    return best, "max(" + ", ".join(peaks) + ")"


def graph_inputs(
    profile: Profile, facts: ModelFacts, n_ctx: int, *, cuda: bool = True, fa: bool | None = None
) -> tuple[int, str]:
    """The compute graph's inputs for a full micro-batch. llama.cpp fills them on the host, so
    with layers on a GPU they are allocated in the CPU backend's buffer (CUDA_Host, pinned), all
    at the start of the graph, and copied to the GPU where its nodes read them: token ids, the
    f32 embeddings input (for a micro-batch of embeddings instead of tokens; allocated either
    way), positions, output rows, the KQ mask, the cache rows written (V's per value without
    flash attention: it is stored transposed), the indexer's block tables and per-block bias,
    and the PLE row ids. `fa`: flash attention as resolved, when not by where the layers are."""
    ub = ubatch_of(profile)
    fa = flash_attn_on(profile, facts, cuda) if fa is None else fa
    parts: list[tuple[str, float]] = [
        ("tokens", 4 * ub),
        (f"embeddings ({ub} x {facts.n_embd} x 4 B, unused with tokens)", 4 * ub * facts.n_embd),
        (f"positions ({facts.n_pos_per_token} per token)", 4 * ub * facts.n_pos_per_token),
        ("output rows", 4 * ub),
    ]
    if facts.kv_layers:
        mask = 2 if fa else 4
        parts.append((f"KQ mask ({n_ctx:,} x {ub} x {mask} B)", n_ctx * ub * mask))
        v_rows = 1 if fa else facts.kv_v_width[0]
        parts.append(("cache rows", 8 * ub * (1 + v_rows + (1 if facts.indexer_ratio else 0))))
    r = facts.indexer_ratio
    if r:
        blocks = -(-n_ctx // r)
        parts.append(("block tables", block_tables(facts, n_ctx)))
        parts.append((f"block bias ({blocks:,} x {ub} x 4 B)", blocks * ub * 4))
    if facts.ple_heads:
        parts.append(("PLE row ids", 4 * ub * facts.ple_heads))
    # every input is aligned to 32 B: cache rows and block tables are 2-3 and 3 tensors, and a
    # recurrent model has its state rows too
    n = len(parts) + (2 if facts.kv_layers else 0) + (2 if r else 0) + (1 if facts.recurrent_layers else 0)
    parts.append((f"alignment ({n} inputs x 32 B)", 32 * n))
    total, formula = _sum(parts)
    return int(total), formula


OP_OFFLOAD_MIN_BATCH = 32
"""llama.cpp's CUDA backend takes the operations of a CPU layer whose batch is at least this
(`op_offload`, on by default): a micro-batch that large runs its matrix products on the GPU."""


def op_offload_peak(profile: Profile, facts: ModelFacts, n_ctx: int) -> tuple[int, str]:
    """The GPU's compute buffer when no layer is on it but the build has a GPU: llama.cpp runs
    a full micro-batch's operations there, copying each weight it needs into the buffer. The
    peak is the graph's own (flash attention resolved as for the CPU, where the layers are), or
    the largest weight a product reads with its input and output rows, if larger."""
    fa = flash_attn_on(profile, facts)
    graph, graph_f = compute_bytes(profile, facts, n_ctx, cuda=True, fa=fa)
    w, ne0, ne1 = facts.largest_matmul
    ub = ubatch_of(profile)
    copy = w + 4 * ub * (ne0 + ne1)
    copy_f = f"the largest weight {size(w)} + {ub} x ({ne0:,} + {ne1:,}) x 4 B = {size(copy)}"
    return (graph, graph_f) if graph >= copy else (copy, copy_f)


def cpu_split(profile: Profile, facts: ModelFacts, ple_gpu: bool) -> tuple[int, str]:
    """What the CPU computes when every layer is on the GPU, one split at a time (each split's
    tensors are freed once copied to the GPU, so the largest split counts). llama.cpp keeps the
    input embeddings on the CPU, so the first split gathers the micro-batch's token rows (f32)
    there, and with the stock PLE gather the PLE rows too; the GPU PLE gather puts `token_embd`
    on the GPU, and that split goes. Where CUDA's conv cannot take the recurrent layers'
    channels (`cuda_ssm_conv`), each such layer's conv is a CPU split: its input (the conv
    history and the micro-batch) and its output."""
    ub = ubatch_of(profile)
    splits: list[tuple[int, str]] = []
    if not ple_gpu:
        parts: list[tuple[str, float]] = [
            (f"token rows ({ub} x {facts.n_embd} x 4 B)", 4 * ub * facts.n_embd)
        ]
        if facts.ple_heads:
            ple = 4 * ub * facts.ple_heads * facts.ple_head_dim
            parts.append((f"PLE rows ({ub} x {facts.ple_heads} x {facts.ple_head_dim} x 4 B)", ple))
        total, formula = _sum(parts)
        splits.append((int(total), f"the input split {formula}"))
    if facts.recurrent_layers and not cuda_ssm_conv(facts):
        c, k = facts.ssm_channels, facts.ssm_conv
        conv = 4 * c * (ub + k - 1 + ub)
        splits.append((conv, f"the conv split ({c} channels x ({ub} + {k - 1} + {ub}) x 4 B = {size(conv)})"))
    if not splits:
        return 0, "no CPU split"
    return max(splits)


def attention_on_cpu(profile: Profile, facts: ModelFacts, n_ctx: int) -> tuple[int, str]:
    """With flash attention on the CPU (`fa_on_cpu`), the host buffer also takes that split's
    inputs, copied from the GPU: Q, the K and V cache (the rows of every cell) and the combined
    f16 mask. They go into the holes the graph inputs left once copied to the GPU (the KQ mask;
    the block bias and the block tables, allocated side by side), each into the smallest hole it
    fits (ggml-alloc's best fit); what fits in none adds to the buffer. (The output, Q's size, is
    left out: measured, it finds room.)"""
    ub = ubatch_of(profile)
    ctx = profile.context
    q = 4 * ub * facts.n_head * facts.head_dim_k
    k = n_ctx * row_bytes(ctx.type_k, facts.kv_k_width[0])
    v = n_ctx * row_bytes(ctx.type_v, facts.kv_v_width[0])
    mask = n_ctx * ub * 2
    holes = [mask]
    if facts.indexer_ratio:  # the bias and the block tables are allocated side by side: one hole
        holes.append(-(-n_ctx // facts.indexer_ratio) * ub * 4 + block_tables(facts, n_ctx))
    extra = 0
    for n in (q, k, v, mask):  # in the order ggml-alloc places them
        fits = [h for h in holes if h >= n]
        if fits:
            best = min(fits)
            holes[holes.index(best)] = best - n
        else:
            extra += n
    return extra, (
        f"flash attention on the CPU: Q {fmt(q)}, K {fmt(k)}, V {fmt(v)}, mask {fmt(mask)}; "
        f"{fmt(extra)} past the holes of the copied inputs"
    )
