"""Which exceptions are the user's doing: the CLI prints them as one line and exits 2."""

from __future__ import annotations

from velo_chat.engine.prompt.chat_template import ChatTemplateError
from velo_chat.engine.setup.default_model import DefaultModelMissing
from velo_chat.engine.engine import PromptTooLong
from velo_chat.engine.fit.report import DoesNotFit
from velo_chat.engine.llama.gguf_file import GGUFError
from velo_chat.engine.llama.context import ContextCreateError
from velo_chat.engine.llama.model import ModelLoadError
from velo_chat.engine.config.profiles import ProfileError
from velo_chat.engine.remote.errors import RemoteError
from velo_chat.store import StoreError
from velo_chat.store.input_text import BinaryInput


class UserError(Exception):
    """A mistake in what the user asked for (a bad argument, an empty prompt)."""


USER_ERRORS: tuple[type[BaseException], ...] = (
    UserError,
    ProfileError,
    GGUFError,
    ModelLoadError,
    ContextCreateError,
    DefaultModelMissing,
    PromptTooLong,
    ChatTemplateError,
    DoesNotFit,
    StoreError,
    BinaryInput,
    RemoteError,
)
