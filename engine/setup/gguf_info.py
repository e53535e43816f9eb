"""What a GGUF file says about itself, for the commands that need one fact of it without
loading the model (`bench --tools-template` reads a model's chat template)."""

from __future__ import annotations

from pathlib import Path

from ..llama import gguf_file


def chat_template_of(path: Path) -> str | None:
    """The chat template in a GGUF's metadata (None: it has none). Raises `GGUFError` for a
    file that is not a whole GGUF."""
    source = gguf_file.read_header(Path(path)).metadata.get("tokenizer.chat_template")
    return source if isinstance(source, str) and source else None
