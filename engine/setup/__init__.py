"""Setup: getting a model onto the machine (the default model's download, a requantized copy)
and finding the GGUF a profile points at."""

from .default_model import (
    BUILTIN,
    builtin_path,
    fetch_default_model,
    require_default_model,
    resolve_model_path,
)
from .default_model import is_present as default_model_present
from .gguf_info import chat_template_of
from .requantize import TYPES as REQUANTIZE_TYPES
from .requantize import derived_name
from .requantize import requantize as requantize_model

__all__ = [
    "BUILTIN",
    "REQUANTIZE_TYPES",
    "builtin_path",
    "default_model_present",
    "derived_name",
    "fetch_default_model",
    "require_default_model",
    "requantize_model",
    "resolve_model_path",
    "chat_template_of",
]
