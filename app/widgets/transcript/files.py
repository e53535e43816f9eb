"""The files attached to a user message, each a collapsed block above the typed text.

Expanded, a file shows in a read-only `TextArea` of at most 30 rows (chat.tcss) that scrolls
both ways, not as a Markdown code block: an attached file may be thousands of lines, and
Markdown would build and lay out every line of it in the transcript, while a `TextArea` draws only
the rows in view, can be focused and scrolled with the keys, and shows a scrollbar where lines go
past its edge. Its language is named from the file's extension (`textual.highlight.guess_language`,
as Textual's code blocks name theirs) and set where the TextArea can highlight it (with Textual's
`syntax` extra installed); elsewhere the file shows as plain text. The area is built the first
time the block opens, so a session with many files costs nothing for the ones never opened.
"""

from __future__ import annotations

from typing import Protocol

from textual.highlight import guess_language
from textual.markup import escape
from textual.widgets import Collapsible, TextArea


class AttachedFile(Protocol):
    """What the transcript needs of a file attached to a message (`store.Attachment`)."""

    @property
    def path(self) -> str: ...

    @property
    def content(self) -> str: ...


def file_title(path: str, content: str) -> str:
    """The folded block's title: "📎 app/model.py · 1,512 lines" (a last line without a line
    break counts; only "\n" breaks lines, as in the text the model is shown)."""
    n = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
    return f"📎 {path} · {n:,} line{'' if n == 1 else 's'}"


class FileBlock(Collapsible):
    """One attached file: its title while folded, its text once opened."""

    def __init__(self, file: AttachedFile) -> None:
        super().__init__(
            title=escape(file_title(file.path, file.content)), collapsed=True, classes="file-block"
        )
        self.file = file

    def watch_collapsed(self, collapsed: bool) -> None:
        """The first time the block opens, its text is put in it."""
        if not collapsed and self.is_mounted:
            contents = self.query_children(Collapsible.Contents).first()
            if not contents.children:
                contents.mount(self._file_area())

    def _file_area(self) -> TextArea:
        area = TextArea(
            self.file.content,
            read_only=True,
            soft_wrap=False,
            show_line_numbers=True,
            compact=True,
            classes="file-body",
        )
        lang = guess_language("", self.file.path)  # by the name only: a file may be long
        if lang in area.available_languages:
            area.language = lang
        return area
