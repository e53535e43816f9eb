"""The live sequence: the tokens the llama.cpp context holds, and the only code that changes them.

Every turn starts from the longest usable prefix of its prompt: the live context itself, a RAM
checkpoint or a disk checkpoint. What "usable" means depends on the model's memory
(docs/engine.md): an attention-only model can drop the tail of its sequence (`seq_rm`), so any
common prefix is usable; a hybrid or recurrent model cannot rewind its recurrent state, so the
live sequence is usable only when the whole of it is a prefix of the new prompt, and otherwise a
checkpoint saved at a prefix boundary is the way back.

Invariant: `tokens` is exactly what the context holds, in order. Every operation that changes
the context goes through this class and keeps it so, including the failure paths (a failed
restore, truncation or rollback leaves an empty context and an empty list, never a stale one).

Speculation (`speculation/stepper.py`) adds two operations: `verify` decodes a pending token and its
draft in one batch with logits for every position, and `rollback` drops the rejected tail. An
attention model drops any tail (`seq_rm`); a hybrid model keeps `n_rs_seq` recurrent-state
snapshots of its last batch and can go back to one of them, once per batch, so its rollback
must stay inside the last batch (`max_draft` is what a verify batch may draft).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .checkpoints.manager import Candidate, Checkpoints
from .llama.context import DecodeError, LlamaContext, Perf
from .llama.sampling import Sampler
from .prompt.tokens import common_prefix
from .speculation.cost import CostModel

RESTORE_MIN_GAIN = 32
"""Tokens a checkpoint must save over the live context to be worth restoring (a restore copies
the whole state, roughly the cost of prefilling a few dozen tokens)."""

KV_WINDOW = 256
"""llama.cpp pads the attention's KV length to a multiple of this (`llama_kv_cache::get_n_kv`,
so that a graph keeps its shape from one call to the next). A decode call whose context end
lies in another window than the last call of its size had finds that graph's shapes changed:
llama.cpp builds it anew and a GPU backend captures its CUDA graph again (`graph_stale`)."""

MIN_TIMED_PREFILL = 64
"""Prompt tokens llama.cpp must have timed in this context before its rate is trusted to weigh a
restore against a prefill (until then a checkpoint is restored, as it always was)."""

MAX_RESTORE_ATTEMPTS = 4
"""Checkpoints tried in turn when restoring fails (each failure drops the bad one)."""


@dataclass(frozen=True)
class RestoreChoice:
    """Restoring a checkpoint or prefilling the tokens it would save, by their expected cost:
    the state's bytes at the tier's measured read rate against the tokens at the context's
    measured prefill rate (a restore from disk can be slower than prefilling a short
    conversation). `prefill_est_s` is None while no prefill rate is known: then it restores."""

    decision: str  # "restore" or "prefill"
    restore_est_s: float
    prefill_est_s: float | None


@dataclass(frozen=True)
class StartPoint:
    """Where a prompt's turn can start: `n_tokens` already computed, from `source`."""

    n_tokens: int
    source: str  # "live", "ram", "disk" or "none"
    candidate: Candidate | None = None  # the checkpoint to restore, when source is ram/disk
    choice: RestoreChoice | None = None  # how a usable checkpoint was weighed (None: none was)


class LiveSequence:
    """The context's token sequence. Not thread-safe (the engine is used one call at a time)."""

    def __init__(self, ctx: LlamaContext, *, hybrid: bool) -> None:
        self._ctx = ctx
        self._tokens: list[int] = []
        self.hybrid = hybrid
        self._rollable = 0  # tokens a hybrid model can still roll back (of its last batch)
        # verify batch sizes this context has decoded: the first batch of a size builds what
        # the backend keeps for that shape (a CUDA graph captured, buffers), which later ones
        # reuse, so its time says little of theirs (`SpecStepper` does not time it)
        self.verified_sizes: set[int] = set()
        # each one-token step's or verify batch's size -> the KV window its last call ended in
        # (`graph_stale`); a size not here has not run in this context
        self._windows: dict[int, int] = {}
        self._last_window = -(-ctx.n_ctx // KV_WINDOW)  # the cache's own end (n_kv's cap)
        # what the speculation stepper timed its calls at (None: no speculative turn yet): kept
        # with the context, which keeps the graphs and buffers those costs are of
        self.spec_costs: CostModel | None = None
        self.last_choice: RestoreChoice | None = None  # of the last `start_from_best`

    # -- reading ----------------------------------------------------------------------------

    @property
    def tokens(self) -> tuple[int, ...]:
        """A copy of the tokens the context holds (O(n): not for per-token use)."""
        return tuple(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def n_ctx(self) -> int:
        return self._ctx.n_ctx

    @property
    def gpu_resident(self) -> bool:
        """Every layer on the GPU (the context's thread plan): what a verify batch costs follows."""
        return self._ctx.thread_plan.gpu_resident

    @property
    def n_ubatch(self) -> int:
        return self._ctx.n_ubatch

    def perf(self) -> Perf:
        """llama.cpp's counters (eval time, graph reuse) for this context."""
        return self._ctx.perf()

    def decode_threads(self) -> tuple[int, int]:
        """One-token decode steps so far and the threads they ran with, summed (the thread
        count follows the machine's load: `engine/scheduling/threads.py`)."""
        return self._ctx.decode_steps, self._ctx.decode_thread_steps

    def synchronize(self) -> None:
        """Wait for queued work (books a prefill into the prompt-eval counters)."""
        self._ctx.synchronize()

    @property
    def max_draft(self) -> int:
        """Most draft tokens one verify batch may hold: the batch (draft plus the pending
        token) fits one ubatch, and a hybrid model can roll all of the draft back."""
        cap = min(self._ctx.n_ubatch, self._ctx.n_batch) - 1
        return min(cap, self._ctx.n_rs_seq) if self.hybrid else cap

    def sample(self, sampler: Sampler, i: int = -1) -> int:
        """The next token from the logits of output `i` of the last batch (-1: the last)."""
        return sampler.sample(self._ctx.ctx, i)

    def pick(self, sampler: Sampler, i: int) -> int:
        """`sample(sampler, i)` for a verify batch's positions (`Sampler.pick`: the argmax in
        place when the chain is greedy alone)."""
        return sampler.pick(self._ctx.ctx, i)

    def logits(self, i: int = -1) -> np.ndarray:
        """A copy of the logits of output `i` of the last batch (tests compare them)."""
        return self._ctx.logits_at(i)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        return common_prefix(self._tokens, tokens)

    def _window(self, n: int) -> int:
        """The KV window a call of `n` tokens ends in (once per token: kept to integer steps)."""
        return min((len(self._tokens) + n - 1) // KV_WINDOW + 1, self._last_window)

    def graph_stale(self, n: int) -> bool:
        """Whether a call of `n` tokens with logits for each (n = 1: a one-token step; more: a
        verify batch) would find its graph otherwise than the last call of that size left it:
        that call ended in another KV window (`KV_WINDOW`), or there was none. On a GPU such a
        call runs eagerly while its CUDA graph is captured again, at several one-token steps'
        cost; a one-token step pays it every `KV_WINDOW` tokens,
        a verify batch of a size used now and then nearly every time (the speculation cost
        model prices it: `speculation.cost.CostModel.stale`). Prefill chunks are not followed: their
        graphs are another shape."""
        return self._windows.get(n) != self._window(n)

    def usable(self, tokens: Sequence[int]) -> int:
        """How much of `tokens` the live context can serve. At least the last token is always
        left to decode (its logits start the reply); a hybrid model's context serves only if
        all of it is a prefix of `tokens`."""
        keep = min(common_prefix(self._tokens, tokens), len(tokens) - 1)
        if self.hybrid and keep < len(self._tokens):
            return 0
        return max(keep, 0)

    def prefill_tok_s(self) -> float | None:
        """The prompt-eval rate llama.cpp has timed in this context (None: too little yet)."""
        perf = self._ctx.perf()
        if perf.n_prompt_eval < MIN_TIMED_PREFILL or perf.prompt_eval_ms <= 0:
            return None
        return perf.n_prompt_eval / (perf.prompt_eval_ms / 1000)

    def best_start(self, tokens: Sequence[int], checkpoints: Checkpoints | None) -> StartPoint:
        """The longest usable prefix of `tokens` and where it is. The live context costs
        nothing to reuse, a checkpoint a copy of the whole state: one must save
        `RESTORE_MIN_GAIN` more tokens than the live context to be chosen, and restoring it
        must be expected to take less than prefilling those tokens (`RestoreChoice`). The
        preview and the turn both ask here, so they say the same."""
        live_n = self.usable(tokens)
        cand = checkpoints.find(np.asarray(tokens, dtype=np.int32)) if checkpoints else None
        if (
            checkpoints is None
            or cand is None
            or cand.n_tokens < live_n + (RESTORE_MIN_GAIN if live_n else 1)
        ):
            return StartPoint(live_n, "live" if live_n else "none")
        choice = self._weigh(checkpoints, cand, cand.n_tokens - live_n)
        if choice.decision == "restore":
            return StartPoint(cand.n_tokens, cand.source, cand, choice)
        return StartPoint(live_n, "live" if live_n else "none", None, choice)

    def _weigh(self, checkpoints: Checkpoints, cand: Candidate, saved_tokens: int) -> RestoreChoice:
        restore_s = checkpoints.restore_estimate_s(cand)
        rate = self.prefill_tok_s()
        prefill_s = saved_tokens / rate if rate else None
        decision = "prefill" if prefill_s is not None and prefill_s < restore_s else "restore"
        return RestoreChoice(decision, restore_s, prefill_s)

    # -- changing -----------------------------------------------------------------------------

    def clear(self) -> None:
        self._ctx.clear()
        self._tokens.clear()
        self._rollable = 0

    def truncate(self, n: int) -> bool:
        """Keep the first `n` tokens (attention models). False, with the context emptied, when
        llama.cpp cannot remove the tail (a recurrent state)."""
        if n >= len(self._tokens):
            return n == len(self._tokens)
        # a hybrid model's snapshots (n_rs_seq) belong to its last batch only: never here
        if not self.hybrid and self._ctx.truncate(n):
            del self._tokens[n:]
            return True
        self.clear()
        return False

    def extend(self, chunk: Sequence[int]) -> None:
        """Decode `chunk` (one ubatch at most) after the live tokens."""
        self._rollable = 0
        self._ctx.decode(chunk)
        self._tokens.extend(chunk)

    def append(self, token: int) -> None:
        """Decode one sampled token (the per-token path of a reply)."""
        self._rollable = 0
        self._windows[1] = self._window(1)
        rc = self._ctx.decode_one(token)
        if rc != 0:
            raise DecodeError(f"llama_decode failed during generation (code {rc})")
        self._tokens.append(token)

    def verify(self, tokens: Sequence[int]) -> None:
        """Decode a pending token and its draft (`tokens`, at most `max_draft + 1`) in one
        batch with logits for every position: `sample(sampler, i)` reads the prediction after
        `tokens[i]`. The context holds all of them until `rollback` drops the rejected tail."""
        if len(tokens) - 1 > self.max_draft or len(self._tokens) + len(tokens) > self.n_ctx:
            raise ValueError(f"a verify batch of {len(tokens)} tokens does not fit")
        self._rollable = 0
        self._windows[len(tokens)] = self._window(len(tokens))
        self._decoding(lambda: self._ctx.decode_all_logits(tokens, len(self._tokens)))
        self._tokens.extend(tokens)
        self._rollable = len(tokens) - 1 if self.hybrid else 0
        self.verified_sizes.add(len(tokens))

    def warm_up(self, max_draft: int, token: int = 0, repeats: int = 2) -> float:
        """Decode a verify batch of every size a turn may use (1 to `max_draft + 1` tokens, as
        far as the context allows) `repeats` times on the empty context, then empty it again;
        the seconds it took. What a backend keeps per batch shape is then made before the first
        turn: ggml-cuda runs a new shape eagerly once and captures its CUDA graph the next time,
        and CUDA loads a kernel at its first launch (each batch size up to 8 has its own
        matrix-vector kernels, larger ones the matrix-matrix ones). The sizes count as verified
        (`verified_sizes`): the speculation stepper times a turn's first batch of each, which it
        would otherwise leave untimed as the one that builds the shape."""
        if self._tokens:
            raise RuntimeError("warm_up needs an empty context")
        t0 = time.perf_counter()
        for n in range(1, min(max_draft, self.max_draft) + 2):
            if n > self.n_ctx:
                break
            batch = [token] * n
            self._windows[n] = self._window(n)
            for _ in range(repeats):
                self._decoding(functools.partial(self._ctx.decode_all_logits, batch, 0))
                self._ctx.clear()
            if n > 1:  # built: a turn's first batch of this size is timed like the others
                self.verified_sizes.add(n)
        self._ctx.synchronize()
        self.clear()
        return time.perf_counter() - t0

    def rollback(self, n: int) -> None:
        """Drop the last `n` tokens (rejected drafts). A hybrid model goes back to a snapshot of
        its last batch: at most that batch's length minus one, once. A failure (which would be
        a bug) empties the context and raises `DecodeError`: the turn fails, the next starts cold."""
        if n <= 0:
            return
        keep = len(self._tokens) - n
        if self.hybrid and n > self._rollable:
            self._lost()
            raise DecodeError(f"cannot roll back {n} tokens of a hybrid model's state")
        if not self._ctx.truncate(keep):
            self._lost()
            raise DecodeError(f"llama.cpp refused to roll back {n} tokens")
        del self._tokens[keep:]
        self._rollable = 0

    def _decoding(self, decode: Callable[[], None]) -> None:
        """Run a decode; if it raises, the context's state is unknown: empty it."""
        try:
            decode()
        except BaseException:
            self._lost()
            raise

    def _lost(self) -> None:
        try:
            self.clear()
        except Exception:  # pragma: no cover - the context is beyond use anyway
            self._tokens.clear()

    def restore(self, checkpoints: Checkpoints, cand: Candidate, tokens: Sequence[int]) -> float | None:
        """Load a checkpoint that holds `tokens[:cand.n_tokens]`; its restore seconds, or None
        when it failed (the checkpoint is dropped by its tier and the context is empty)."""
        self._rollable = 0
        restored = checkpoints.restore(self._ctx, cand)
        if restored is None:
            self._tokens = []
            return None
        self._tokens = list(tokens[: restored.n_tokens])
        return restored.seconds

    def start_from_best(
        self, tokens: Sequence[int], checkpoints: Checkpoints | None
    ) -> tuple[int, str, float]:
        """Make the context hold the best usable prefix of `tokens`; (n, source, restore_s).

        A checkpoint that fails to restore is dropped (with a warning) and the next best is
        tried; the last resort is a cold start."""
        start = StartPoint(0, "none")
        for _attempt in range(MAX_RESTORE_ATTEMPTS):
            start = self.best_start(tokens, checkpoints)
            self.last_choice = start.choice
            if start.candidate is None or checkpoints is None:
                break
            seconds = self.restore(checkpoints, start.candidate, tokens)
            if seconds is not None:
                return start.n_tokens, start.source, seconds
        else:
            start = StartPoint(0, "none")
        if start.n_tokens == 0:
            self.clear()
            return 0, "none", 0.0
        if start.n_tokens < len(self._tokens) and not self.truncate(start.n_tokens):
            return 0, "none", 0.0
        return start.n_tokens, start.source, 0.0

    def save(self, checkpoints: Checkpoints) -> tuple[int, int]:
        """Checkpoint the context as it is; (tokens saved, bytes) — (0, 0) when not saved."""
        return checkpoints.save(self._ctx, self._tokens)
