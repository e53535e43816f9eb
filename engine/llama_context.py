"""One llama_context over a loaded model: decode, perf counters, sequence memory and state.

The engine uses a single sequence (seq 0). Positions are left to llama.cpp (`llama_batch_get_one`
with no positions continues after the sequence's last position), which keeps the batch cheap to
build from Python: one ctypes array per call, logits only for the last token.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .llama_model import LlamaModel
from .profile_schema import ContextSettings

log = logging.getLogger(__name__)

KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8, "bf16": 30}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
SEQ = 0


class DecodeError(RuntimeError):
    """llama_decode failed; the message is one line for the user."""


class ContextCreateError(RuntimeError):
    pass


def usable_cores() -> int:
    """CPUs this process may run on (affinity-aware), the ceiling for llama.cpp threads."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def resolve_threads(requested: int) -> int:
    """0 means all usable cores; more than the usable cores is clamped (oversubscription made
    decode 35x slower on a 2-core machine)."""
    cores = usable_cores()
    return cores if requested <= 0 else min(requested, cores)


@dataclass(frozen=True)
class Perf:
    prompt_eval_ms: float
    eval_ms: float
    n_prompt_eval: int
    n_eval: int
    n_reused: int


class LlamaContext:
    def __init__(self, model: LlamaModel, settings: ContextSettings) -> None:
        from llama_cpp import llama_cpp as ll

        self._ll = ll
        self.model = model
        params = ll.llama_context_default_params()
        params.n_ctx = settings.n_ctx
        params.n_batch = settings.n_batch
        params.n_ubatch = settings.n_ubatch
        params.n_seq_max = 1
        self.n_threads = resolve_threads(settings.n_threads)
        params.n_threads = self.n_threads
        params.n_threads_batch = self.n_threads
        params.flash_attn_type = FLASH_ATTN[settings.flash_attn]
        params.type_k = KV_TYPES[settings.type_k]
        params.type_v = KV_TYPES[settings.type_v]
        params.no_perf = False  # otherwise t_eval_ms reads 0
        self.params = params
        ctx = ll.llama_init_from_model(model.model, params)
        if not ctx:
            from . import llama_log

            why = llama_log.last_error() or "see the log"
            raise ContextCreateError(
                f"could not create a context of {settings.n_ctx} tokens for {model.path.name}: "
                f"{why}"
            )
        self.ctx = ctx
        self.n_ctx = int(ll.llama_n_ctx(ctx))
        self.n_ubatch = int(ll.llama_n_ubatch(ctx))
        self.n_batch = int(ll.llama_n_batch(ctx))
        self.memory = ll.llama_get_memory(ctx)
        self._one = (ll.llama_token * 1)()
        self.settings = settings

    def decode(self, tokens: Sequence[int]) -> None:
        """Append tokens to the sequence; logits are computed for the last one only.

        Split into n_batch pieces: llama.cpp aborts the process (GGML_ASSERT) on a bigger batch."""
        for start in range(0, len(tokens), self.n_batch):
            piece = tokens[start:start + self.n_batch]
            n = len(piece)
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

    def decode_one(self, token: int) -> int:
        """The per-token hot path: no allocation, returns llama_decode's code."""
        self._one[0] = token
        return self._ll.llama_decode(self.ctx, self._ll.llama_batch_get_one(self._one, 1))

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
            self.ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, SEQ, 0)
        return data[:n]

    def set_state(self, data: bytes | bytearray | memoryview | np.ndarray) -> bool:
        """Replace the sequence with a saved state without copying the buffer in Python;
        False if llama.cpp rejects it (the sequence is then left empty)."""
        self.clear()
        n = len(data)
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
        if getattr(self, "ctx", None):
            self._ll.llama_free(self.ctx)
            self.ctx = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
