"""The errors a caller of the engine handles: each one is a user's problem (a bad file, a
profile that cannot be used, a model that does not fit, a server that refused), and its message
is one line meant for the user.

They are defined here, apart from the code that raises them, so the app can name them all
through `velo_chat.engine` without importing llama.cpp, the fit estimate or the remote SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .fit.report import FitReport

__all__ = [
    "CgroupError",
    "ChatTemplateError",
    "ContextCreateError",
    "DefaultModelMissing",
    "DoesNotFit",
    "GGUFError",
    "ModelLoadError",
    "ProfileError",
    "PromptTooLong",
    "RemoteError",
    "RequantizeError",
    "SpecSourceError",
]


class ProfileError(ValueError):
    """A profile that cannot be used; the message is one line naming the profile and field."""


class GGUFError(ValueError):
    """The file is not a usable GGUF; the message says why in one line."""


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message is one line meant for the user."""


class ContextCreateError(RuntimeError):
    """llama.cpp could not create the context; the message says why in one line."""


class ChatTemplateError(ValueError):
    """The model has no usable chat template, or rendering failed."""


class PromptTooLong(ValueError):
    """The conversation does not fit in the context; a user error."""


class DoesNotFit(ValueError):
    """The profile's model does not fit in memory; the message is one line, `report` has the
    table. A user error: the CLI refuses with exit 2 (`--force` loads anyway), the TUI asks."""

    def __init__(self, report: FitReport) -> None:
        self.report = report
        fix = " or ".join(report.suggestions)
        super().__init__(
            f"the model does not fit in memory ({report.summary()})"
            + (f"; to fit: {fix}" if fix else "")
            + "; --force loads it anyway"
        )


class DefaultModelMissing(RuntimeError):
    """The default model is not on disk (or is corrupt) and could not be fetched."""


class RequantizeError(RuntimeError):
    """The copy could not be made; the message says why in one line."""


class RemoteError(RuntimeError):
    """The server or the network refused a request; the message is one line for the user."""


class SpecSourceError(ValueError):
    """The file or the rename cannot make a copy-edit workload (one line for the user)."""


class CgroupError(OSError):
    """A cgroup could not be created or joined (one line, for the user)."""
