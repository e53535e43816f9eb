"""The profile schema: every setting a profile can hold, with its documentation and allowed range.

A profile is a TOML file with one table per section. Each field below is declared once, with its
type, default, allowed values and the doc text that the settings screen shows next to it; the
loader (`engine/config/profiles.py`) validates a file against these declarations and builds
frozen dataclasses.
Changing a setting means building a new `Profile` (`dataclasses.replace`), never mutating one.

`reload` in a field's metadata says whether changing it needs the model or context rebuilt
("model": reload the weights, "context": a new llama_context) or applies to the next turn (None).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def setting(
    default: Any,
    doc: str,
    *,
    min: float | None = None,
    max: float | None = None,
    choices: tuple[str, ...] | None = None,
    reload: str | None = None,
    auto: bool = False,
) -> Any:
    """Declare one profile field with its documentation and constraints. `auto`: besides a
    value of its type, the field accepts the string "auto" (resolved when it is used)."""
    return field(
        default=default,
        metadata={"doc": doc, "min": min, "max": max, "choices": choices, "reload": reload, "auto": auto},
    )


def value_type(f: Any) -> type:
    """The Python type of a field's values ("auto" aside): `int` for `int | str`."""
    if isinstance(f.type, type):
        return f.type
    name = f.type.split("|")[0].strip()
    return {"int": int, "float": float, "str": str, "bool": bool}[name]


@dataclass(frozen=True)
class BackendSettings:
    """Where the model runs: in this process, or behind an OpenAI-compatible server (llama.cpp's
    llama-server, vLLM, ... running on other machines, docs/remote.md)."""

    kind: str = setting(
        "local",
        '"local": llama.cpp in this process ([model] and [context] apply). "remote": an '
        "OpenAI-compatible chat-completions server at `base_url` (needs the `remote` extra: "
        "pip install 'velo-chat[remote]').",
        choices=("local", "remote"),
        reload="model",
    )
    base_url: str = setting(
        "",
        'The server\'s API root, e.g. "http://spark-1:8080/v1" (llama-server) or '
        '"http://spark-1:8000/v1" (vLLM). Remote only.',
        reload="model",
    )
    model: str = setting(
        "",
        "The model name the server knows (its /v1/models list); empty: the server's only or "
        "first model. Remote only.",
        reload="model",
    )
    api_key_env: str = setting(
        "",
        "The name of an environment variable holding the API key (the key itself is never "
        "written to a profile, a session, an export or a log); empty: no key. Remote only.",
        reload="model",
    )
    timeout_s: float = setting(
        600.0,
        "Seconds to wait for the server to answer and between two streamed chunks. Remote only.",
        min=1.0,
        max=86400.0,
    )
    max_retries: int = setting(
        3,
        "Retries, with backoff, when the server is busy (429), failing (5xx) or unreachable, "
        "before a turn gives up. Remote only.",
        min=0,
        max=10,
    )


@dataclass(frozen=True)
class ModelSettings:
    """Which GGUF to load and how its weights are placed."""

    path: str = setting(
        "default",
        'Path to a GGUF file (the first shard of a split model), or "default" for the embedded '
        'SmolLM2-135M-Instruct, or "default-q8_0" for it requantized to Q8_0 on first use (a '
        "CPU computes its batches faster: prefill, speculation). `~` is expanded.",
        reload="model",
    )
    n_gpu_layers: int = setting(
        0,
        "Layers offloaded to the GPU: 0 = CPU only, -1 = all layers. Ignored by a CPU build.",
        min=-1,
        max=100000,
        reload="model",
    )
    # The trade-off (docs/fit.md): mapped weights live in the page cache, so a model already
    # cached starts fastest on the CPU, but the kernel may evict its pages under memory pressure
    # and read them back from disk; false reads each tensor into its own buffer, the fast way to
    # load layers onto a GPU (docs/results/fit.md has what a Spark reported). A lazily read PLE
    # table (`lazy_ple`) stays mapped either way. The doc line stays one line: the settings
    # screen shows it under the field.
    use_mmap: bool = setting(True, "Map the GGUF instead of reading it into RAM.", reload="model")
    lazy_ple: str = setting(
        "auto",
        'How the per-layer n-gram embedding table (qwen4exp PLE, ~27 GiB) is read: "on" keeps '
        "it on mmap and reads rows on demand (what a Spark needs: llama.cpp turns it off on "
        'integrated GPUs), "off" reads it all up front, "auto" lets llama.cpp decide.',
        choices=("off", "auto", "on"),
        reload="model",
    )
    ple_gather: str = setting(
        "auto",
        "Where a qwen4exp model's per-layer n-gram embedding rows (PLE) are gathered: "
        '"gpu" on the GPU by the velo-chat CUDA kernel on the llama.cpp CUDA stream, with the '
        "token-embedding table on the GPU too (no CPU split for the input embeddings), "
        '"stock" by llama.cpp on the CPU. "auto": "gpu" when llama.cpp is built '
        "with CUDA (and the PLE patch), CuPy works, the model has a PLE table and its PLE layer "
        'is on the GPU; otherwise "stock". If the GPU path cannot start, the log says why and '
        "the model runs stock (docs/ple.md).",
        choices=("auto", "gpu", "stock"),
        reload="model",
    )
    gpu_wait: str = setting(
        "auto",
        "How the CPU thread waits for the GPU to finish a step, when layers are on a CUDA GPU "
        '(CUDA\'s device scheduling flag): "spin" polls (what CUDA does by default; beside busy '
        "processes the polling thread is time-sliced against them while the GPU waits for it), "
        '"yield" polls but yields the core between polls, "block" sleeps until the GPU is done. '
        '"auto": CUDA\'s default, which lost nothing to "block" or "yield" where measured. Applies '
        "to the whole process; ignored without CUDA (docs/threads.md).",
        choices=("auto", "spin", "yield", "block"),
        reload="model",
    )


@dataclass(frozen=True)
class ContextSettings:
    """The llama_context: its size, batching, threads and KV cache."""

    n_ctx: int = setting(
        8192,
        "Context length in tokens (0 = the model's training context).",
        min=0,
        max=1048576,
        reload="context",
    )
    n_batch: int = setting(
        512,
        "Logical batch: tokens handed to one llama_decode call during prefill.",
        min=1,
        max=65536,
        reload="context",
    )
    n_ubatch: int = setting(
        512,
        "Physical micro-batch; prefill progress and cancellation are checked per ubatch.",
        min=1,
        max=65536,
        reload="context",
    )
    n_threads: int | str = setting(
        "auto",
        'CPU threads for decoding one token. "auto": 1 when every layer is on the GPU (the '
        "CPU only looks up the input embeddings; waking more threads for that costs more than "
        "it does), else the usable cores. A number is used as is; 0 = the usable cores. Never "
        "more than the usable cores (docs/threads.md).",
        min=0,
        max=1024,
        reload="context",
        auto=True,
    )
    n_threads_batch: int | str = setting(
        "auto",
        'CPU threads for prefill (many tokens per step). "auto" and 0: the usable cores.',
        min=0,
        max=1024,
        reload="context",
        auto=True,
    )
    adapt_threads: bool = setting(
        True,
        "While other processes keep the cores busy (a compile, a test run), decode and prefill "
        "with fewer threads, down to 1, and go back up when the cores are free again: threads "
        "that wait for a descheduled thread spin, so a full pool on a busy machine runs at a "
        "fraction of its fair share (docs/threads.md).",
        reload="context",
    )
    thread_pool: bool = setting(
        True,
        "Keep llama.cpp's worker threads between steps (persistent ggml thread pools, attached "
        "to the context). false: llama.cpp starts and joins its threads for every step, as "
        "llama-cpp-python does by default (slower decode, and worse beside busy processes).",
        reload="context",
    )
    thread_poll: int = setting(
        0,
        "How long the pool's idle worker threads poll for the next step before they sleep "
        "(ggml's polling level: 0 = sleep at once, 100 = poll longest). Polling burns a core "
        "that a busy machine needs; it bought no speed when measured (docs/threads.md).",
        min=0,
        max=100,
        reload="context",
    )
    flash_attn: str = setting(
        "auto",
        'Flash attention: "on", "off" or "auto".',
        choices=("auto", "on", "off"),
        reload="context",
    )
    type_k: str = setting(
        "f16",
        "KV cache type for K.",
        choices=("f32", "f16", "bf16", "q8_0", "q4_0"),
        reload="context",
    )
    type_v: str = setting(
        "f16",
        "KV cache type for V (quantized V needs flash attention).",
        choices=("f32", "f16", "bf16", "q8_0", "q4_0"),
        reload="context",
    )
    when_full: str = setting(
        "compact",
        "What a turn does when the conversation fills the context to `compact_at` (or would not "
        'fit at all): "compact" asks the model for a summary of the conversation so far, as a '
        "continuation of it (the history is reused from the cache, only the request is "
        "prefilled), and goes on in a new session that opens with the summary and the last "
        'turns (the original stays whole); "drop_oldest" takes the oldest turns out of the '
        "model's view (they stay stored and shown; the system prompt and pinned files stay in "
        'view); "refuse" refuses a turn that does not fit, as before (docs/compaction.md).',
        choices=("compact", "drop_oldest", "refuse"),
    )
    compact_at: float = setting(
        0.85,
        "The share of the context the next turn's prompt may fill before `when_full` acts "
        '("refuse" waits until the turn does not fit at all).',
        min=0.3,
        max=0.99,
    )
    keep_share: float = setting(
        0.25,
        "The share of the context that the last turns kept word for word in a compaction's "
        "continuation may take (after the summary and the pinned files); 0 keeps none.",
        min=0.0,
        max=0.8,
    )
    summary_prompt: str = setting(
        "Summarize our conversation so far so that we can continue it from your summary alone: "
        "what we set out to do, the decisions made and why, the code, file, function and "
        "command names that matter, what is done, and the open questions and next steps. "
        "Be concise; use short bullet points.",
        "The request a compaction sends, appended to the conversation as a user message, to "
        "have the model summarize it; its answer opens the continuation. `/compact FOCUS` (and "
        "`sessions compact --focus`) adds a line saying what to focus on.",
    )


@dataclass(frozen=True)
class SamplingSettings:
    """How the next token is chosen. Changes apply to the next turn."""

    temperature: float = setting(0.0, "0 = greedy (deterministic); higher = more random.", min=0.0, max=5.0)
    top_p: float = setting(1.0, "Nucleus sampling: keep the smallest set with this mass.", min=0.0, max=1.0)
    top_k: int = setting(0, "Keep only the k most likely tokens; 0 = off.", min=0, max=100000)
    min_p: float = setting(0.0, "Drop tokens below this fraction of the top probability.", min=0.0, max=1.0)
    repeat_penalty: float = setting(1.0, "Penalty for recently seen tokens; 1.0 = off.", min=0.0, max=5.0)
    repeat_last_n: int = setting(64, "How many recent tokens the repeat penalty looks at.", min=0, max=65536)
    seed: int = setting(-1, "Sampling seed; -1 = a new random seed each turn.", min=-1, max=2**32 - 1)
    max_tokens: int = setting(2048, "Most tokens one reply may have.", min=1, max=1048576)


@dataclass(frozen=True)
class ReasoningSettings:
    """Thinking models (`<think>...</think>`): whether and how hard they think, passed to the chat
    template as its own variables (docs/thinking.md). Changes apply to the next turn."""

    enabled: str = setting(
        "auto",
        'Whether the model thinks before it answers: "on" or "off" sets the chat '
        "template's switch (`enable_thinking`, or what the template calls it: `thinking`, "
        '`reasoning`, `thinking_mode`...); "auto" leaves the template\'s default. Ctrl+G '
        "flips it in the chat for the turns that follow. A template without a switch ignores it.",
        choices=("auto", "on", "off"),
    )
    effort: str = setting(
        "auto",
        "How hard to think, for templates with levels (`reasoning_effort`, `thinking_effort` or "
        "`reasoning_strength`; e.g. low, medium, high, max: the template says which it takes). "
        '"auto" leaves the template\'s default. Passed as written; a template that checks its '
        "levels refuses the turn with its own message. Templates without levels ignore it.",
    )
    show_thinking: bool = setting(
        True, "Show the model's reasoning in a collapsible block (collapsed by default)."
    )
    budget_tokens: int = setting(
        0,
        "Most reasoning tokens a reply may spend (0: no limit). Past it the engine closes the "
        "reasoning itself with the template's own end marker (after `budget_message`, if set) "
        "and the answer follows. A template whose reasoning markers velo-chat cannot find "
        "refuses a turn with a budget. A remote server gets it as `thinking_budget_tokens` "
        "(llama-server enforces it; others ignore it).",
        min=0,
    )
    budget_message: str = setting(
        "",
        "Text written at the end of the reasoning, on a line of its own, when the budget cuts "
        'it, before the end marker (e.g. "Time is up; answering now."). It stays part of the '
        'stored reasoning. "": the end marker alone.',
    )


@dataclass(frozen=True)
class SpeculationSettings:
    """Exact n-gram speculation: the reply's next tokens are drafted from text already in the
    session (the prompt, earlier replies, the reply so far) and verified in one batch; the
    output is the one plain decoding gives, to the bit where a verify batch's logits equal
    one-token steps' (every layer on the CPU, an attention model), and otherwise only with
    `allow_batch_rounding` (docs/speculation.md)."""

    enabled: bool = setting(
        False,
        "Draft from the session and verify drafts in one batch. Wins where replies repeat "
        "session text (code edits given back whole) and the backend computes a batch of tokens "
        "for little more than one; novel text drafts nothing. Used only where the output stays "
        "bit-identical to plain decoding, unless `allow_batch_rounding` (the model's load "
        "message says which). On a hybrid model the context then keeps `max_draft` "
        "recurrent-state snapshots (more state memory, and checkpoints saved without them are "
        "not reused).",
        reload="context",
    )
    allow_batch_rounding: bool = setting(
        False,
        "Also speculate where a verify batch's logits are not bit-identical to one-token "
        "steps': with layers on a GPU (CUDA computes a batch with other kernels), on hybrid "
        "models (a batch takes the recurrence's chunked path), and on the CPU with decode on "
        "more than one thread or without flash attention (one token's attention is summed "
        "otherwise than a batch's), with weights other than Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 (K-quants, "
        "IQ4 and float weights take other batch kernels) or on a CPU other than x86_64 (not "
        "checked). The output is "
        "then the model's up to that rounding: greedy text can take "
        "another token where the two best logits are that close, and then goes on differently.",
        reload="context",
    )
    max_draft: int = setting(
        16,
        "Most tokens one verify batch drafts. A hybrid model keeps this many recurrent-state "
        "snapshots per sequence (llama.cpp's n_rs_seq: each costs one more copy of the "
        "recurrent state's memory); the batch, draft plus one, must fit `context.n_ubatch`.",
        min=1,
        max=64,
        reload="context",
    )
    min_match: int = setting(
        3,
        "Shortest run of tokens that must repeat earlier session text before what followed it is drafted.",
        min=1,
        max=32,
    )
    min_gain: float = setting(
        0.05,
        "Draft only when the expected tokens per unit of time beat a plain step by this "
        "fraction (the acceptance so far at this match length and the measured cost of each "
        "batch size decide).",
        min=0.0,
        max=10.0,
    )
    batch_cost_prior: float = setting(
        0.8,
        "What each extra token of a verify batch is assumed to cost, as a fraction of a "
        "one-token step, until batches have been timed in the turn, or in earlier turns where "
        "`keep_costs` keeps them (then the measured values are used, with what a new graph "
        "costs when the batch size changes): about 0.05-0.2 on "
        "a GPU; on a CPU about 0.25 for weights it multiplies a batch at once (Q8_0, Q4_0), "
        "0.6-0.9 for those it takes a token at a time (Q4_1). Set too high, a turn declines "
        "short drafts that would pay and so never times one.",
        min=0.0,
        max=2.0,
    )
    keep_costs: str = setting(
        "auto",
        "Keep what verify batches and new graphs were timed at from one turn to the next, so "
        "a turn's first drafts are priced from measurements instead of `batch_cost_prior` "
        "(a turn still times them again, and a cost it carries is never dearer than the prior). "
        "auto: only with every layer on a GPU, where a batch costs about the same at any context "
        "length and a new graph is the largest cost; on a CPU a verify row's attention grows "
        "with the context, so costs timed in one turn misprice the next (docs/speculation.md).",
        choices=("auto", "on", "off"),
    )
    warm_up: bool = setting(
        True,
        "With layers on a GPU, decode a verify batch of every size twice when the context is "
        "made, so the GPU loads each size's kernels and captures its CUDA graph before the "
        "first turn instead of in it (without it, a context's first speculative reply pays all "
        "of that). Costs 2 x (max_draft + 1) small batches at load.",
        reload="context",
    )


@dataclass(frozen=True)
class CheckpointSettings:
    """Prefix checkpoints: saved model state at message boundaries, for fast resume."""

    enabled: bool = setting(True, "Save and reuse prefix checkpoints.")
    ram_budget_mib: int = setting(
        2048,
        "Memory for saved states in MiB: the RAM tier (LRU) plus states still waiting to "
        "be written to disk (one array when in both, counted once). Over it, the oldest states "
        "waiting for the disk are dropped with a warning; only the newest state and the one "
        "being written may go past it (docs/checkpoints.md).",
        min=0,
        max=1048576,
    )
    ram_chunks: bool = setting(
        True,
        "Keep RAM-tier states as content-defined chunks shared between them (cut in the "
        "background, after a state is saved), so the checkpoints of one long conversation hold "
        "what each adds instead of a whole state each; off: every state whole.",
    )
    disk_budget_gib: float = setting(
        16.0, "Disk tier budget in GiB (LRU, never exceeded).", min=0.0, max=65536.0
    )
    interval_tokens: int = setting(
        8192,
        "Also save every this many tokens inside a long prefill; 0 = only at boundaries.",
        min=0,
        max=1048576,
    )
    min_prefill_tokens: int = setting(
        256,
        "Save the state before a reply (what a regenerate resumes from) only after a "
        "prefill of at least this many tokens; a shorter tail is cheaper to prefill again from "
        "the previous boundary than to copy the whole state before the first token.",
        min=0,
        max=1048576,
    )
    close_timeout_s: float = setting(
        30.0,
        "Seconds closing the engine (quitting, switching model or profile) waits for "
        "states still being written to disk, logging progress; what is not written by then is "
        "abandoned, and no partial file is left behind.",
        min=0.0,
        max=3600.0,
    )


@dataclass(frozen=True)
class AttachmentSettings:
    """Files attached to a message (`@path` and `/read` in the TUI, `ask --file`)."""

    max_files: int = setting(
        50,
        "Most files one message may attach; a glob matching more is refused (say a narrower one).",
        min=1,
        max=10000,
    )
    max_file_kib: int = setting(
        4096,
        "Largest file that may be attached, in KiB; a larger one is refused before it is read.",
        min=1,
        max=1048576,
    )


@dataclass(frozen=True)
class ToolSettings:
    """Tools the model may call in a turn: read, list and search files, edit and write them, run
    commands, all in the session's working folder, with the user's approval (docs/tools.md)."""

    enabled: bool = setting(
        False,
        "Offer the model tools (the chat template must support them; `ask --tools` turns them on "
        "for one command). Each call is a step of the turn; its result goes back to the model.",
    )
    offered: str = setting(
        "all",
        'Which tools the model is offered: "all", "read-only" (read_file, list_files, search) or '
        "a comma-separated list of tool names.",
    )
    approve: str = setting(
        "read",
        'What runs without asking: "read" (read_file, list_files, search), "read,edit" (also '
        'edit_file and write_file), "all", "none", or a comma-separated list of tool names. '
        "Anything outside the working folder always asks.",
    )
    choice: str = setting(
        "auto",
        '"auto": the model decides whether to call a tool; "required": every step must be a '
        'call (constrained from its first token); "none": tools are described but never called.',
        choices=("auto", "required", "none"),
    )
    command_timeout_s: float = setting(
        120.0, "A command is stopped (its whole process group) after this many seconds.", min=1.0, max=86400.0
    )
    max_output_kib: int = setting(
        64,
        "Most KiB of a tool's output the model is shown (a command's output, a file read); the rest "
        "is cut and the cut is said.",
        min=1,
        max=16384,
    )
    max_steps: int = setting(
        25,
        "Most tool steps one turn may take; at the limit the turn ends normally and says so.",
        min=1,
        max=1000,
    )


@dataclass(frozen=True)
class DisplaySettings:
    """How the TUI looks."""

    theme: str = setting("textual-dark", "A Textual theme name.")
    show_live_panel: bool = setting(True, "Show the live speed panel.")


@dataclass(frozen=True)
class Profile:
    """A named, validated, immutable set of settings."""

    name: str
    description: str = ""
    system_prompt: str = ""
    backend: BackendSettings = field(default_factory=BackendSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    context: ContextSettings = field(default_factory=ContextSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    reasoning: ReasoningSettings = field(default_factory=ReasoningSettings)
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    checkpoints: CheckpointSettings = field(default_factory=CheckpointSettings)
    attachments: AttachmentSettings = field(default_factory=AttachmentSettings)
    tools: ToolSettings = field(default_factory=ToolSettings)
    display: DisplaySettings = field(default_factory=DisplaySettings)


SECTIONS: dict[str, type] = {
    f.name: f.default_factory  # type: ignore[misc]
    for f in fields(Profile)
    if f.name not in ("name", "description", "system_prompt")
}
"""Section name -> settings dataclass, in declaration order (the settings screen groups by it)."""
