"""One llama_context over a loaded model: decode, perf counters, sequence memory and state.

The engine uses a single sequence (seq 0). Positions are left to llama.cpp (`llama_batch_get_one`
with no positions continues after the sequence's last position), which keeps the batch cheap to
build from Python: one ctypes array per call, logits only for the last token.
"""

from __future__ import annotations

import ctypes
import logging
import time
from typing import Any
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..errors import ContextCreateError
from .model import LlamaModel
from ..config.profile_schema import ContextSettings
from ..scheduling.threads import (
    ThreadGovernor,
    ThreadPlan,
    Threadpools,
    is_gpu_resident,
    plan_for,
    resolve_threads,
    usable_cores,
)

log = logging.getLogger(__name__)

KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8, "bf16": 30}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
SEQ = 0


class DecodeError(RuntimeError):
    """llama_decode failed; the message is one line for the user."""


__all__ = ["ContextCreateError", "DecodeError", "LlamaContext", "Perf", "resolve_threads", "usable_cores"]


@dataclass(frozen=True)
class Perf:
    prompt_eval_ms: float
    eval_ms: float
    n_prompt_eval: int
    n_eval: int
    n_reused: int


class LlamaContext:
    def __init__(
        self, model: LlamaModel, settings: ContextSettings, *, n_gpu_layers: int = 0, n_rs_seq: int = 0
    ) -> None:
        """`n_gpu_layers` is the model's setting: whether every layer is on the GPU decides
        what `"auto"` threads are (`scheduling/threads.py`). `n_rs_seq`: recurrent-state
        snapshots kept per sequence, so a hybrid model can roll back that many tokens of its
        last batch (speculation); llama.cpp sets it to 0 for an architecture without the support."""
        from llama_cpp import llama_cpp as ll

        self._ll = ll
        self.model = model
        params = ll.llama_context_default_params()
        params.n_ctx = settings.n_ctx
        params.n_batch = settings.n_batch
        params.n_ubatch = settings.n_ubatch
        params.n_seq_max = 1
        gpu = is_gpu_resident(
            n_gpu_layers, int(ll.llama_model_n_layer(model.model)), bool(ll.llama_supports_gpu_offload())
        )
        plan = plan_for(settings, gpu, model.gpu_wait)
        self.thread_plan: ThreadPlan = plan
        self.n_threads = plan.decode  # as planned; fewer while the machine is busy
        self.n_threads_batch = plan.batch
        params.n_threads = plan.decode
        params.n_threads_batch = plan.batch
        params.flash_attn_type = FLASH_ATTN[settings.flash_attn]
        params.type_k = KV_TYPES[settings.type_k]
        params.type_v = KV_TYPES[settings.type_v]
        params.no_perf = False  # otherwise t_eval_ms reads 0
        params.n_rs_seq = n_rs_seq
        self.params = params
        ctx = ll.llama_init_from_model(model.model, params)
        if not ctx:
            from . import log as llama_log

            why = llama_log.last_error() or "see the log"
            raise ContextCreateError(
                f"could not create a context of {settings.n_ctx} tokens for {model.path.name}: {why}"
            )
        self.ctx = ctx
        self.n_ctx = int(ll.llama_n_ctx(ctx))
        self.n_ubatch = int(ll.llama_n_ubatch(ctx))
        self.n_batch = int(ll.llama_n_batch(ctx))
        self.memory = ll.llama_get_memory(ctx)
        self._one = (ll.llama_token * 1)()
        self._batch_one = ll.llama_batch_get_one(self._one, 1)  # a view of `_one`, made once
        self.n_rs_seq = int(ll.llama_n_rs_seq(ctx))
        self._batch: object | None = None  # llama_batch with logits for every token (verify)
        self._batch_cap = 0
        self.settings = settings
        self._pools: Threadpools | None = None
        self._old_pools: list[Threadpools] = []
        self._governor: ThreadGovernor | None = None
        self._in_use = plan.decode  # threads the last llama_decode ran with
        # one-token decode steps so far, and the threads they ran with summed: a turn's stats
        # say how many threads its decode had (the governor changes it with the machine's load)
        self.decode_steps = 0
        self.decode_thread_steps = 0
        self._threads = (plan.decode, plan.batch)
        # Verify batches (speculation) on the decode threads and pool when every layer is on
        # the GPU: there a batch of a few tokens is, for the CPU, a token's step (an embedding
        # lookup), and waking the prefill pool's threads for it costs more than the step
        # (docs/threads.md). With layers on the CPU a verify batch is CPU work like a small
        # prefill, and keeps the prefill threads. Switched lazily: `_verify_threads`.
        self.verify_on_decode_threads = plan.gpu_resident
        self._verify_on = False  # batches run on the decode threads and pool now
        if plan.pool:
            self._attach_pools(plan.decode, plan.batch)
        log.info("threads: %s", plan.describe())
        if plan.adapt:
            self._governor = ThreadGovernor(plan)
            changed = self._governor.first_look()
            if changed is not None:
                self._set_threads(*changed)

    # -- threads ----------------------------------------------------------------------------------

    def _attach_pools(self, decode: int, batch: int) -> None:
        """Persistent ggml thread pools with the profile's polling level (llama.cpp would
        otherwise make and join a new pool for every graph)."""
        try:
            pools = Threadpools(self.ctx, decode, batch, poll=self.thread_plan.poll)
        except (OSError, AttributeError) as exc:
            log.warning("no persistent thread pools (%s); llama.cpp makes one per step", exc)
            return
        if self._pools is not None:
            self._old_pools.append(self._pools)  # freed with the context (see Threadpools)
        self._pools = pools
        self._verify_on = False  # the new pools are attached as decode and prefill pools

    @property
    def threads_now(self) -> tuple[int, int]:
        """(decode, prefill) threads the next llama_decode calls use."""
        return self._threads

    def _set_threads(self, decode: int, batch: int) -> None:
        self._ll.llama_set_n_threads(self.ctx, decode, decode if self._verify_on else batch)
        self._threads = (decode, batch)

    def _verify_threads(self, on: bool) -> None:
        """Batches on the decode threads and pool (`on`: verify batches, when
        `verify_on_decode_threads`) or on the prefill ones. Two cheap calls, made only when
        the decode phase of a speculating turn starts and when a prefill follows it."""
        if on == self._verify_on:
            return
        self._verify_on = on
        pools = self._pools
        if pools is not None and pools.batch != pools.decode:
            pools.attach(batch_on_decode=on)
        self._set_threads(*self._threads)

    def _adapt(self) -> None:
        gov = self._governor
        assert gov is not None
        changed = gov.update(self._in_use)
        if changed is not None:
            self._set_threads(*changed)

    @contextmanager
    def fixed_threads(self, decode: int, batch: int | None = None) -> Iterator[None]:
        """Run with these thread counts and no adaptation for a while (the benchmark compares
        fixed counts with the planned ones)."""
        decode = resolve_threads(decode)
        batch = resolve_threads(batch or self.thread_plan.batch)
        governor, saved = self._governor, self._threads
        self._governor = None
        pools = self._pools
        if pools is not None and (decode > pools.sizes[0] or batch > pools.sizes[1]):
            self._attach_pools(max(decode, pools.sizes[0]), max(batch, pools.sizes[1]))
        self._set_threads(decode, batch)
        try:
            yield
        finally:
            self._set_threads(*saved)
            self._governor = governor

    def decode(self, tokens: Sequence[int]) -> None:
        """Append tokens to the sequence; logits are computed for the last one only.

        Split into n_batch pieces: llama.cpp aborts the process (GGML_ASSERT) on a bigger batch."""
        for start in range(0, len(tokens), self.n_batch):
            piece = tokens[start : start + self.n_batch]
            n = len(piece)
            gov = self._governor
            if gov is not None and gov.due(time.monotonic()):
                self._adapt()
            if n > 1 and self._verify_on:
                self._verify_threads(False)
            self._in_use = self._threads[1] if n > 1 else self._threads[0]
            if n == 1:
                arr = self._one
                arr[0] = piece[0]
            else:
                arr = (self._ll.llama_token * n)(*piece)
            rc = self._ll.llama_decode(self.ctx, self._ll.llama_batch_get_one(arr, n))
            if rc != 0:
                if rc == 1:
                    raise DecodeError(f"the context is full ({self.n_ctx} tokens)")
                raise DecodeError(f"llama_decode failed (code {rc}); see the log")
            self._check_ple()

    def decode_one(self, token: int) -> int:
        """The per-token hot path: no allocation, returns llama_decode's code. Every
        `ThreadGovernor.interval` it looks at the machine's load (a /proc read)."""
        gov = self._governor
        if gov is not None and gov.due(time.monotonic()):
            self._in_use = self._threads[0]
            self._adapt()
        self._one[0] = token
        self.decode_steps += 1
        self.decode_thread_steps += self._threads[0]
        rc = self._ll.llama_decode(self.ctx, self._batch_one)
        if self.model.ple is not None and self.model.ple.error is not None:
            self._check_ple()
        return rc

    def _check_ple(self) -> None:
        """The GPU PLE gather records a failure instead of raising into llama.cpp: raise it here."""
        ple = self.model.ple
        err = ple.take_error() if ple is not None else None
        if err is not None:
            raise DecodeError(err)

    def decode_all_logits(self, tokens: Sequence[int], pos0: int) -> None:
        """Decode `tokens` at positions `pos0`, `pos0 + 1`, ... in one llama_decode with logits
        for every one of them (`logits_at(i)`, `Sampler.sample(ctx, i)`): a speculative
        draft's verification. At most n_batch tokens."""
        ll = self._ll
        n = len(tokens)
        if n > self._batch_cap:
            if self._batch is not None:
                ll.llama_batch_free(self._batch)
            self._batch = ll.llama_batch_init(max(n, 16), 0, 1)
            self._batch_cap = max(n, 16)
        b: Any = self._batch  # a ctypes llama_batch (made above when too small or missing)
        assert b is not None
        b.n_tokens = n
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = SEQ
            b.logits[i] = 1
        if self._verify_on != self.verify_on_decode_threads:
            self._verify_threads(self.verify_on_decode_threads)
        self._in_use = self._threads[0] if self._verify_on else self._threads[1]
        rc = ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise DecodeError(f"llama_decode failed verifying a draft (code {rc}); see the log")
        self._check_ple()

    def logits_at(self, i: int) -> np.ndarray:
        """A copy of the logits of output `i` of the last batch (-1: the last)."""
        n_vocab = self.model.n_vocab
        ptr = self._ll.llama_get_logits_ith(self.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()

    def synchronize(self) -> None:
        """Wait for queued work; llama.cpp books a batch's time into its perf counters here."""
        self._ll.llama_synchronize(self.ctx)

    def perf(self) -> Perf:
        p = self._ll.llama_perf_context(self.ctx)
        return Perf(p.t_p_eval_ms, p.t_eval_ms, p.n_p_eval, p.n_eval, p.n_reused)

    # -- sequence memory ------------------------------------------------------------------------

    def clear(self) -> None:
        self._ll.llama_memory_clear(self.memory, True)

    def truncate(self, n_keep: int) -> bool:
        """Drop positions >= n_keep. Hybrid/recurrent memories refuse this (returns False)."""
        return bool(self._ll.llama_memory_seq_rm(self.memory, SEQ, n_keep, -1))

    def pos_max(self) -> int:
        return int(self._ll.llama_memory_seq_pos_max(self.memory, SEQ))

    # -- state (checkpoints) --------------------------------------------------------------------

    def state_size(self) -> int:
        return int(self._ll.llama_state_seq_get_size_ext(self.ctx, SEQ, 0))

    def get_state(self) -> np.ndarray:
        """The full sequence state (attention KV + recurrent state; flags 0), copied once.

        A uint8 array (not zero-filled first, unlike a bytearray) that llama.cpp writes straight
        into; callers treat it as read-only."""
        size = self.state_size()
        data = np.empty(size, dtype=np.uint8)
        n = self._ll.llama_state_seq_get_data_ext(
            self.ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, SEQ, 0
        )
        return data[:n]

    def set_state(self, data: bytes | bytearray | memoryview | np.ndarray) -> bool:
        """Replace the sequence with a saved state without copying the buffer in Python;
        False if llama.cpp rejects it (the sequence is then left empty)."""
        self.clear()
        n = len(data)
        ptr: ctypes._Pointer[ctypes.c_uint8] | ctypes.Array[ctypes.c_uint8]
        if isinstance(data, bytes):
            ptr = ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))
        elif isinstance(data, np.ndarray):
            ptr = data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        else:
            ptr = (ctypes.c_uint8 * n).from_buffer(data)
        used = self._ll.llama_state_seq_set_data_ext(self.ctx, ptr, n, SEQ, 0)
        del ptr
        if used == 0:
            self.clear()
            return False
        return True

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self._ll.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "ctx", None):
            self._ll.llama_free(self.ctx)
            self.ctx = None
        for pools in [*getattr(self, "_old_pools", []), getattr(self, "_pools", None)]:
            if pools is not None:
                pools.close()  # after llama_free: the context may use them until then
        self._pools, self._old_pools = None, []

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
