"""The live panel: decode speed (sparkline, current/average/peak), TTFT, prefill progress,
cached vs prefilled tokens and where the state came from, context fill and turns left, graph reuse,
speculation, and process memory. When the model thinks: its thinking and answer tokens apart (against the
thinking budget, when the profile sets one: "thinking N / budget", "cut" once the budget closed
the reasoning), and the time to the first answer token under the TTFT (shown only for a reply
that had reasoning). While a turn takes tool steps: its step and where its time went, the model's
(prefill and decode) against the tools' ("step 3", then "model 4.1 s · tools 0.8 s"; shown only
for a turn that took a tool step).

The chat screen calls its methods (calls go down); it never talks to the engine. Its `clock`
(for the live TTFT while waiting) and `memory_probe` are injectable so snapshots are
deterministic. Decode rates come from token timestamps (`DecodeMeter`).

Its lines change several times a second while a reply streams, and in Textual any widget that
asks for a layout makes the whole screen lay out again: every message of the transcript, several
hundred widgets in a long session. So a line is rewritten only when its text changed, and without
a layout when it keeps its number of lines and fits the panel (`_show`). While tokens stream, the
memory line waits for the next streamed update instead of drawing a frame of its own every
`memory_interval` (`_memory_tick`): on a small machine every frame is taken from the decode.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Sparkline, Static

from velo_chat.engine import ModelLoaded, PrefillProgress, TurnStarted, TurnStats
from velo_chat.engine.fit import WARM_BELOW

from ...sysinfo import memory_probe as default_memory_probe
from .meter import DecodeMeter

MemoryProbe = Callable[[], tuple[int | None, int | None]]
SOURCES = {"live": "live", "ram": "RAM", "disk": "disk", "none": "cold", "server": "server"}


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:,.0f} MiB"


def speculation_line(mode: str) -> tuple[bool, str]:
    """The panel's speculation line from the engine's mode (`ModelLoaded.speculation.mode`):
    whether it drafts, and in a few words its guarantee or why it does not draft."""
    if mode.startswith("on: bit-identical"):
        return True, "on (exact)"
    if mode.startswith("on"):
        return True, "on (batch rounding)"
    if mode.startswith("off:") and "next load" in mode:
        return False, "off (until a reload)"
    if mode.startswith("off:"):
        return False, "off (needs allow_batch_rounding)"
    return False, "off"


def _rate(x: float) -> str:
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


class LivePanel(Vertical):
    """Shown on the right of the chat screen; hidden with a key (`chat.toggle_panel`)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.perf_counter,
        memory_probe: MemoryProbe = default_memory_probe,
        memory_interval: float | None = 2.0,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        self.clock = clock
        self.memory_probe = memory_probe
        self.memory_interval = memory_interval
        self.meter = DecodeMeter()
        self.sent_at: float | None = None
        self.ttft: float | None = None
        self.first_answer: float | None = None  # seconds from sending to the first answer text
        self.n_reasoning = 0  # of the reply's tokens, the reasoning's
        self.thinking_budget = 0  # the profile's `reasoning.budget_tokens` (0: none)
        self.budget_hit = False  # the last turn's reasoning was closed by the budget
        self.n_ctx = 0
        self.context_line = "no turn yet"
        self.fill_tokens = 0
        self.turns_left: int | None = None  # about how many turns before `context.when_full` acts
        self.graphs = "—"
        self.speculation = "off"
        self.speculation_enabled = False
        self._engine_speculation = ""  # the loaded model's word on it (`model_ready`), if any
        self._engine_if_enabled = ""  # and its word with it switched on (`set_speculation`)
        self._lines: dict[str, str] = {}  # what each line shows (`_show`)
        self.ple_fraction: float | None = None  # the PLE table's share in the page cache
        self._streaming = False  # tokens are streaming: the memory line waits for `tokens`
        self._memory_due = False  # the memory timer fired while they did

    def compose(self) -> ComposeResult:
        yield Static("Model", classes="panel-title")
        yield Static("loading…", id="panel-model")
        yield ProgressBar(total=1.0, show_eta=False, id="panel-load")
        yield Static("Decode tok/s", classes="panel-title")
        yield Sparkline([], id="panel-spark")
        yield Static("", id="panel-decode")
        yield Static("", id="panel-thinking")
        yield Static("", id="panel-ttft")
        yield Static("", id="panel-tools")
        with Vertical(id="panel-prefill"):
            yield Static("Prefill", classes="panel-title")
            yield ProgressBar(total=1, show_eta=False, id="panel-prefill-bar")
            yield Static("", id="panel-prefill-stats")
        yield Static("Context", classes="panel-title")
        yield Static("", id="panel-context")
        yield Static("Memory", classes="panel-title")
        yield Static("", id="panel-memory")

    def on_mount(self) -> None:
        self._render_decode()
        self._render_context()
        self.refresh_memory()
        if self.memory_interval:
            self.set_interval(self.memory_interval, self._memory_tick)
        self.query_one("#panel-prefill").display = False
        self.query_one("#panel-tools").display = False

    # -- model --------------------------------------------------------------------------------

    def model_loading(self, progress: float, name: str = "") -> None:
        self._engine_speculation = self._engine_if_enabled = ""  # the next load will say
        bar = self.query_one("#panel-load", ProgressBar)
        bar.display = True
        bar.update(progress=progress)
        self.query_one("#panel-model", Static).update(f"loading {name}".rstrip() + "…")

    def model_ready(self, info: ModelLoaded, name: str) -> None:
        self.query_one("#panel-load", ProgressBar).display = False
        self.n_ctx = info.n_ctx
        kind = "hybrid" if info.hybrid else "attention"
        if info.threads is None:  # a server: its threads and memory are its own
            kind, threads = "server", "runs on the server"
        else:
            threads = f"threads {info.threads.decode}"
            if info.threads.prefill:
                threads += f" · prefill {info.threads.prefill}"
        lines = f"{name}\n{info.architecture} · {kind}\n{threads}"
        if info.ple is not None and info.ple.table:  # qwen4exp: where its PLE rows are gathered,
            n = info.local.graph_splits if info.local is not None else 0  # and the decode graph's splits
            splits = f" · {n} split{'s' if n != 1 else ''}" if n else ""
            lines += f"\nPLE {info.ple.gather}{splits}"
        self.query_one("#panel-model", Static).update(lines)
        spec = info.speculation
        self._engine_speculation = spec.mode if spec is not None else ""
        self._engine_if_enabled = spec.if_enabled if spec is not None else ""
        if self._engine_speculation:  # what the engine made of the profile's setting on this model
            self.speculation_enabled, self.speculation = speculation_line(self._engine_speculation)
        self._render_context()

    def model_failed(self, reason: str) -> None:
        self.query_one("#panel-load", ProgressBar).display = False
        self.query_one("#panel-model", Static).update("[b red]not loaded[/]")

    def set_speculation(self, enabled: bool) -> None:
        """The profile's switch. Switched on, the loaded model's word on it wins where it has
        one (drafting refused there, or on with its guarantee): adopting the loaded profile
        calls this after the engine has spoken, and must not say "on" where it refused."""
        word = self._engine_speculation
        if enabled and word and word != "off":
            self.speculation_enabled, self.speculation = speculation_line(word)
            return
        if enabled and self._engine_if_enabled:  # loaded with it off: what switching it on gets
            self.speculation_enabled, self.speculation = speculation_line(self._engine_if_enabled)
            self._render_context()
            return
        self.speculation_enabled = enabled
        self.speculation = "on" if enabled else "off"
        self._render_context()

    def set_thinking_budget(self, tokens: int) -> None:
        """The profile's thinking budget (`reasoning.budget_tokens`; 0: none), which the
        thinking line counts against."""
        self.thinking_budget = tokens
        self._render_decode()

    # -- a turn -------------------------------------------------------------------------------

    def turn_sent(self) -> None:
        self.meter.reset()
        self.sent_at, self.ttft = self.clock(), None
        self.first_answer, self.n_reasoning, self.budget_hit = None, 0, False
        self.query_one("#panel-spark", Sparkline).data = []
        self.query_one("#panel-tools").display = False
        self._render_decode()

    def tool_step_began(self) -> None:
        """The model answers again after a tool step: the decode line counts this step's tokens
        (the worker's counts start again with each step's reply)."""
        self.meter.reset()

    def tool_steps(self, step: int, model_s: float, tool_s: float) -> None:
        """The turn's tool step and its time so far: the model's and the tools'."""
        line = self.query_one("#panel-tools", Static)
        if not line.display:
            line.display = True
        # two lines: the panel is narrow
        self._show("#panel-tools", f"step {step}\nmodel {model_s:.1f} s · tools {tool_s:.1f} s")

    def turn_began(self, started: TurnStarted, n_ctx: int) -> None:
        self.n_ctx = n_ctx
        self.context_line = (
            f"cached {started.cached_tokens:,} "
            f"({SOURCES.get(started.source, started.source)})\n"
            f"prefill {started.prefill_tokens:,}"
        )
        self.fill_tokens = started.prompt_tokens
        self._render_context()

    def prefill(self, p: PrefillProgress) -> None:
        box = self.query_one("#panel-prefill")
        box.display = p.done < p.total
        bar = self.query_one("#panel-prefill-bar", ProgressBar)
        bar.update(total=max(p.total, 1), progress=p.done)
        self._show(
            "#panel-prefill-stats",
            f"{p.done:,}/{p.total:,} · {_rate(p.tok_s)} tok/s\nETA {p.eta_s:.1f} s",
        )

    def tokens(
        self,
        n_tokens: int,
        t_first: float,
        t_last: float,
        *,
        n_reasoning: int = 0,
        answering: bool = False,
        samples: tuple[float, ...] | None = None,
    ) -> None:
        """The reply so far: `n_tokens` sampled, `n_reasoning` of them reasoning; `answering`:
        answer text has appeared; `samples`: the rate samples the worker measured over every
        token (else the panel samples the updates it gets, which depend on the UI's pace)."""
        self.query_one("#panel-prefill").display = False
        self._streaming = True
        if self._memory_due:
            self._memory_due = False
            self.refresh_memory()
        if self.ttft is None and self.sent_at is not None:
            self.ttft = max(0.0, self.clock() - self.sent_at)
        self.n_reasoning = n_reasoning
        if answering and self.first_answer is None and self.sent_at is not None:
            self.first_answer = max(0.0, self.clock() - self.sent_at)
        before = list(self.meter.samples)
        self.meter.update(n_tokens, t_first, t_last)
        if samples is not None:
            self.meter.samples[:] = samples[-self.meter.history :]
        if self.meter.samples != before:
            self.query_one("#panel-spark", Sparkline).data = list(self.meter.samples)
        self._render_decode()

    def turn_ended(self, stats: TurnStats | None) -> None:
        self._streaming = self._memory_due = False
        self.query_one("#panel-prefill").display = False
        if stats is not None:
            self.ttft = stats.ttft_s
            self.n_reasoning, self.first_answer = stats.reasoning_tokens, stats.first_answer_s
            self.budget_hit = stats.reasoning_budget_hit
            self.graphs = f"{stats.llama.graphs_reused:,}" if stats.llama is not None else "—"
            spec = stats.speculation
            if self.speculation_enabled and spec is not None:  # the last turn's drafts
                self.speculation = (
                    f"on · {spec.accepted:,}/{spec.drafted:,} accepted"
                    f" ({spec.acceptance:.0%}) · {stats.tokens_per_call:.2f} tok/call"
                    if spec.drafted
                    else "on · nothing drafted"
                )
            self.fill_tokens = stats.prompt_tokens + stats.decode_tokens
            if stats.backend == "remote":  # known only once the server reported its numbers
                source = "server" if stats.cached_tokens else "cold"
                self.context_line = (
                    f"cached {stats.cached_tokens:,} ({source})\nprefill {stats.prefill_tokens:,}"
                )
            self._render_decode(final=stats.decode_tok_s)
            self._render_context()
        self.refresh_memory()

    # -- rendering ----------------------------------------------------------------------------

    def _show(self, selector: str, text: str) -> None:
        """Set a panel line; ask for a layout only if its height may change."""
        old = self._lines.get(selector)
        if text == old:
            return
        static = self.query_one(selector, Static)
        width = static.content_size.width
        same_shape = (
            old is not None
            and text.count("\n") == old.count("\n")
            and width > 0
            and all(len(line) <= width for line in text.split("\n"))  # markup only overestimates
        )
        self._lines[selector] = text
        static.update(text, layout=not same_shape)

    def _render_decode(self, final: float | None = None) -> None:
        m = self.meter
        avg = final if final is not None else m.average
        self._show(
            "#panel-decode",
            f"now [b]{_rate(m.current)}[/b] avg {_rate(avg)}\npeak {_rate(m.peak)} · {m.n_tokens:,} tok",
        )
        ttft = "—" if self.ttft is None else f"{self.ttft:.2f} s"
        thinking = self.query_one("#panel-thinking", Static)
        thinking.display = self.n_reasoning > 0
        if self.n_reasoning:
            answer = "—" if self.first_answer is None else f"{self.first_answer:.2f} s"
            self._show("#panel-thinking", self._thinking_line(m.n_tokens))
            ttft += f"\nfirst answer {answer}"
        self._show("#panel-ttft", f"TTFT {ttft}")

    def _thinking_line(self, n_tokens: int) -> str:
        """Thinking and answer tokens; with a budget, thinking against it on a line of its own
        (the panel is narrow)."""
        answer = f"answer {max(0, n_tokens - self.n_reasoning):,} tok"
        if not self.thinking_budget:
            return f"thinking {self.n_reasoning:,} · {answer}"
        cut = " · cut" if self.budget_hit else ""
        return f"thinking {self.n_reasoning:,} / {self.thinking_budget:,}{cut}\n{answer}"

    def set_turns_left(self, turns: int | None) -> None:
        """About how many more turns of the session's average size fit before the context is
        full and `context.when_full` acts (None: not known; no line). Shown under the fill."""
        self.turns_left = turns
        self._render_context()

    def _render_context(self) -> None:
        fill = "—"
        if self.n_ctx:
            fill = f"{self.fill_tokens:,}/{self.n_ctx:,} ({self.fill_tokens / self.n_ctx:.0%})"
        if self.turns_left is not None:
            left = f"~{self.turns_left:,} turn{'' if self.turns_left == 1 else 's'} left"
            fill += f"\n[b $warning]{left}[/]" if self.turns_left == 0 else f"\n{left}"
        self._show(
            "#panel-context",
            f"{self.context_line}\nfill {fill}\ngraphs reused {self.graphs}\nspeculation {self.speculation}",
        )

    def _memory_tick(self) -> None:
        if self._streaming:
            self._memory_due = True  # drawn with the next streamed update (`tokens`)
        else:
            self.refresh_memory()

    def refresh_memory(self) -> None:
        rss, gpu = self.memory_probe()
        text = f"RSS {_mib(rss)}"
        if gpu is not None:
            text += f"\nGPU {_mib(gpu)}"
        ple = self.ple_fraction
        if ple is not None:
            text += (
                f"\nPLE cache {ple:.0%}"
                if ple >= WARM_BELOW
                else f"\n[b $warning]PLE cache {ple:.0%}[/]: warm it with velo-chat doctor --warm-ple"
            )
        self._show("#panel-memory", text)

    def ple_residency(self, fraction: float | None) -> None:
        """Show the share of the PLE table in the page cache under the memory, with a warning
        and the command that reads it in again when a big file copy has evicted it (None: the
        model has no such table, no line)."""
        self.ple_fraction = fraction
        self.refresh_memory()
