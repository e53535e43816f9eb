"""A loaded GGUF model behind a small wrapper over llama.cpp's C API.

Why not llama-cpp-python's `Llama` class: it never reuses a prefix on hybrid models, pickles its
disk cache and dup2s the process's stdout/stderr when quiet (docs/architecture.md). This wrapper only owns
the `llama_model*` and its vocabulary: tokenize, detokenize one token, end-of-generation checks,
the chat template and a fingerprint. Contexts are in `context.py`.

Chat prompts are tokenized segment by segment (`tokenize_segments`): the template's own text with
control tokens parsed, message text as plain text (`prompt/segments.py`, `prompt/tokens.py`).
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import ModelLoadError
from . import gguf_file, log as llama_log, ple_provider
from ..scheduling import gpu_wait
from ..prompt.chat_template import ChatTemplate, ChatTemplateError
from ..config.profile_schema import ModelSettings
from ..prompt.segments import Segment
from ..prompt.tokens import PromptTokenizer, scan_vocab

log = logging.getLogger(__name__)

LAZY_MODES = {"off": 0, "auto": 1, "on": 2}


class LoadCancelled(ModelLoadError):
    pass


class LlamaModel:
    def __init__(
        self, path: Path, settings: ModelSettings, on_progress: Callable[[float], bool] | None = None
    ) -> None:
        """Load `path`; `on_progress(fraction)` may return False to cancel the load."""
        from llama_cpp import llama_cpp as ll

        self._ll = ll
        self.path = Path(path)
        self.header = gguf_file.read_header(self.path)  # raises GGUFError with a clear line
        # Before llama.cpp sees it: a missing shard of a split model is a clear error here.
        self.fingerprint = gguf_file.model_fingerprint(self.header)
        llama_log.install()
        # Before the model's CUDA context does any work: how the CPU waits for the GPU.
        self.gpu_wait = gpu_wait.apply(settings.gpu_wait, uses_gpu=settings.n_gpu_layers != 0)

        params = ll.llama_model_default_params()
        params.n_gpu_layers = settings.n_gpu_layers if settings.n_gpu_layers >= 0 else 2**30
        params.load_mode = ll.LLAMA_LOAD_MODE_MMAP if settings.use_mmap else ll.LLAMA_LOAD_MODE_NONE
        params.lazy_mode = LAZY_MODES[settings.lazy_ple]
        # qwen4exp's PLE rows gathered on the GPU (ple_provider.py): decided before the load,
        # because the token-embedding table then goes to the GPU too (a tensor override).
        self.ple: ple_provider.PleProvider | None = None
        self.ple_table = self.header.tensor(ple_provider.PLE_TENSOR) is not None
        ple_plan = ple_provider.plan(settings.ple_gather, self.header, settings.n_gpu_layers)
        if ple_plan.buft is not None:
            overrides = ple_provider.token_embd_override(ple_plan.buft)
            params.tensor_buft_overrides = ctypes.addressof(overrides)
        cancelled = False

        @ll.llama_progress_callback
        def _progress(fraction: float, _user: ctypes.c_void_p) -> bool:
            nonlocal cancelled
            if on_progress is None:
                return True
            try:
                keep_going = on_progress(float(fraction)) is not False
            except Exception:  # never raise into C
                log.exception("load progress callback failed")
                keep_going = True
            cancelled = not keep_going
            return keep_going

        params.progress_callback = _progress
        t0 = time.perf_counter()
        model = ll.llama_model_load_from_file(str(self.path).encode(), params)
        self.load_s = time.perf_counter() - t0
        if not model:
            if cancelled:
                raise LoadCancelled(f"loading {self.path.name} was cancelled")
            why = llama_log.last_error() or "see the log for details"
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {why}")
        self.model = model
        self.ple_mode, self.ple_reason = ple_plan.mode, ple_plan.reason
        if ple_plan.mode == "gpu":  # before any context exists (it sizes its buffers for this graph)
            try:
                self.ple = ple_provider.PleProvider(self.path, model)
                self.ple_reason = f"{ple_plan.reason}; {self.ple.describe()}"
            except Exception as exc:  # noqa: BLE001 - any failure: say why, run stock
                log.warning("PLE gather on the GPU failed to start, running stock: %s", exc)
                self.ple_mode, self.ple_reason = "stock", f"registration failed: {exc}"
        self.vocab = ll.llama_model_get_vocab(model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = ll.llama_model_n_ctx_train(model)
        self.n_params = int(ll.llama_model_n_params(model))
        self.size_bytes = int(ll.llama_model_size(model))
        self.hybrid = bool(ll.llama_model_is_recurrent(model) or ll.llama_model_is_hybrid(model))
        self.architecture = self.header.architecture
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self.vocab))
        self.bos_id = int(ll.llama_vocab_bos(self.vocab))
        self.eos_id = int(ll.llama_vocab_eos(self.vocab))
        self._piece_buf = ctypes.create_string_buffer(256)
        self._eog_cache: dict[int, bool] = {}
        self._pieces: dict[int, bytes] = {}  # token -> its bytes (the per-token path of a reply)
        self._template: ChatTemplate | None = None
        self._prompt_tokenizer: PromptTokenizer | None = None
        log.info(
            "loaded %s (%s, %.1f MB, hybrid=%s) in %.2fs; PLE gather %s (%s)",
            self.path,
            self.architecture,
            self.size_bytes / 1e6,
            self.hybrid,
            self.load_s,
            self.ple_mode,
            self.ple_reason,
        )
        self._prepare_chat()

    def _prepare_chat(self) -> None:
        """Compile the chat template and read the vocabulary's special tokens with the model:
        the first turn after a start (a resume from disk) would otherwise pay for them in its
        time to first token, a few hundred ms on a 250k vocabulary. A model without a usable
        template still loads; the turn that needs one says why."""
        try:
            _ = self.chat_template
        except ChatTemplateError as exc:
            log.info("%s", exc)

    # -- vocabulary -----------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Raw llama.cpp tokenization. With `parse_special`, control-token text becomes control
        tokens: never pass message text that way (use `tokenize_segments`)."""
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (self._ll.llama_token * n_max)()
        n = self._ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (self._ll.llama_token * n_max)()
            n = self._ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character). Kept per token, as
        every streamed token asks (a vocabulary's pieces are a few MB at most)."""
        if not special and (piece := self._pieces.get(token)) is not None:
            return piece
        buf = self._piece_buf
        n = self._ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        piece = buf.raw[:n]
        if not special:
            self._pieces[token] = piece
        return piece

    def token_text(self, token: int) -> str:
        return self.token_bytes(token, special=True).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        cached = self._eog_cache.get(token)
        if cached is None:
            cached = self._eog_cache[token] = bool(self._ll.llama_vocab_is_eog(self.vocab, token))
        return cached

    # -- chat -----------------------------------------------------------------------------------

    @property
    def prompt_tokenizer(self) -> PromptTokenizer:
        """Tokenizes chat segments; knows which tokens message text must never become."""
        if self._prompt_tokenizer is None:
            special = scan_vocab(self._ll, self.vocab, self.n_vocab)
            self._prompt_tokenizer = PromptTokenizer(
                lambda text, parse_special: self.tokenize(text, parse_special=parse_special), special
            )
        return self._prompt_tokenizer

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's own template (raises ChatTemplateError if the GGUF has none)."""
        if self._template is None:
            self._template = ChatTemplate(
                self.chat_template_source,
                bos_token=self.token_text(self.bos_id) if self.bos_id >= 0 else "",
                eos_token=self.token_text(self.eos_id) if self.eos_id >= 0 else "",
                model_name=self.path.name,
                protected=self.prompt_tokenizer.special.protected_texts,
            )
        return self._template

    @property
    def chat_template_source(self) -> str | None:
        """The Jinja source of the model's chat template (None: the GGUF has none)."""
        raw = self._ll.llama_model_chat_template(self.model, None)
        return raw.decode("utf-8") if raw else None

    def tokenize_segments(self, segments: Sequence[Segment]) -> list[int]:
        """Tokens for a rendered chat: scaffolding with control tokens, message text as plain
        text; BOS added once if the model wants it."""
        tokens = self.prompt_tokenizer.tokens(segments)
        if self.add_bos and self.bos_id >= 0 and (not tokens or tokens[0] != self.bos_id):
            tokens.insert(0, self.bos_id)
        return tokens

    def close(self) -> None:
        ple = getattr(self, "ple", None)  # (None too where __init__ failed before setting it)
        if ple is not None:
            ple.close()  # unregisters before the model goes
            self.ple = None
        if getattr(self, "model", None):
            self._ll.llama_model_free(self.model)
            self.model = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
