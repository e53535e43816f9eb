"""How the model sees a file attached to a user message: a block before the typed text,

    app/model.py
    ```python
    <the file's text>
    ```

    <the typed text>

The block is a pure function of the path and the text, and it always opens the message, so the
same file attached again renders to the same tokens: the prefix before it stays reusable from a
checkpoint, and a reply that gives the file back can be drafted from it by speculation. The app
keeps the files apart from the typed text (the session store's `Attachment`) and renders them
here for every turn that has them in its history; `velo-chat bench --spec` builds its copy-edit
prompt the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["FileText", "fence", "language", "render_block", "render_user_content"]


class FileText(Protocol):
    """A file as attached: the path it is shown under and its text."""

    @property
    def path(self) -> str: ...

    @property
    def content(self) -> str: ...


LANGUAGES = {
    "py": "python", "pyi": "python", "rs": "rust", "go": "go", "c": "c", "h": "c",
    "cc": "cpp", "cpp": "cpp", "cxx": "cpp", "hpp": "cpp", "hh": "cpp", "cu": "cuda",
    "cuh": "cuda", "js": "javascript", "mjs": "javascript", "cjs": "javascript",
    "jsx": "jsx", "ts": "typescript", "tsx": "tsx", "java": "java", "kt": "kotlin",
    "swift": "swift", "rb": "ruby", "php": "php", "cs": "csharp", "scala": "scala",
    "lua": "lua", "pl": "perl", "r": "r", "jl": "julia", "zig": "zig", "nim": "nim",
    "sh": "bash", "bash": "bash", "zsh": "zsh", "fish": "fish", "ps1": "powershell",
    "sql": "sql", "html": "html", "htm": "html", "css": "css", "scss": "scss",
    "json": "json", "jsonl": "json", "toml": "toml", "yaml": "yaml", "yml": "yaml",
    "xml": "xml", "md": "markdown", "rst": "rst", "tex": "latex", "ini": "ini",
    "cfg": "ini", "dockerfile": "dockerfile", "makefile": "makefile", "cmake": "cmake",
    "tcss": "css", "proto": "protobuf", "graphql": "graphql", "vue": "vue", "dart": "dart",
    "ex": "elixir", "exs": "elixir", "erl": "erlang", "hs": "haskell", "ml": "ocaml",
    "clj": "clojure", "diff": "diff", "patch": "diff",
}  # fmt: skip
"""File extension (or a whole lower-case file name) -> the fence's language label."""


def language(path: str) -> str:
    name = path.rsplit("/", 1)[-1].lower()
    if name in LANGUAGES:
        return LANGUAGES[name]
    return LANGUAGES.get(name.rsplit(".", 1)[-1], "") if "." in name else ""


def fence(content: str) -> str:
    """A backtick fence longer than any run of backticks in `content`, so a file that holds
    Markdown fences of its own cannot close the block early (CommonMark's rule)."""
    longest = run = 0
    for ch in content:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


def render_block(attachment: FileText) -> str:
    """One file as the model sees it: its path, then its text fenced with its language."""
    body = (
        attachment.content
        if attachment.content.endswith("\n") or not attachment.content
        else (attachment.content + "\n")
    )
    marks = fence(attachment.content)
    return f"{attachment.path}\n{marks}{language(attachment.path)}\n{body}{marks}"


def render_user_content(attachments: Sequence[FileText], text: str) -> str:
    """A user message as the model sees it: each file's block, then the typed text."""
    if not attachments:
        return text
    blocks = "\n\n".join(render_block(a) for a in attachments)
    return f"{blocks}\n\n{text}"
