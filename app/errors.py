"""Which exceptions are the user's doing: the CLI prints them as one line and exits 2."""

from __future__ import annotations

from velo_chat.engine import (
    ChatTemplateError,
    ContextCreateError,
    DefaultModelMissing,
    DoesNotFit,
    GGUFError,
    ModelLoadError,
    ProfileError,
    PromptTooLong,
    RemoteError,
)
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
