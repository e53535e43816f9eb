"""Code blocks in messages soft-wrap at the transcript's width, each continuation row opening with
a mark, so no code is ever cut off without a sign.

Textual's `MarkdownFence` lays its code out on one row per line and scrolls it sideways with a
scrollbar of size 0: in a narrow transcript the end of a long line is just not there, nothing
says so, and no key reaches it (a fence cannot be focused). Wrapping was chosen over a visible
scrollbar: every character is on screen at once, with no per-block scrolling to find, with the
keyboard only, in the transcript that already scrolls; a scrollbar would also cost each block a
row. The mark (`WRAP_MARK`, dimmed) tells a continuation row from a real new line, which matters
in code where indentation is meaning. When the transcript can be made wide enough, the side panes
give way instead (`panes.py`), so wrapping is what is left when the window itself is too narrow.

Copying a code block (`y`) takes it from the message's Markdown (`text.code_blocks`), never from
these rows: the copy is the original text, without marks or cuts.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content
from textual.geometry import Size
from textual.widget import Widget
from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownBlock, MarkdownFence

from .text import wrap_offsets

WRAP_MARK = "↪ "


def wrapped_rows(code: Content, width: int, mark: Content) -> list[Content]:
    """The rows that show `code` in `width` cells: each line cut where it would overflow, and
    every row after the first of a line opening with `mark`. A width too small to hold the mark
    and a character leaves the lines whole (the widget is not laid out yet)."""
    lines = code.split("\n")
    if width <= mark.cell_length:
        return lines
    rows: list[Content] = []
    for line in lines:
        first, *rest = line.divide(wrap_offsets(line.plain, width, mark.cell_length))
        rows.append(first)
        rows.extend(mark + piece for piece in rest)
    return rows


class WrappedCode(Widget):
    """The highlighted code of one block, soft-wrapped at this widget's width."""

    def __init__(self, code: Content) -> None:
        super().__init__(classes="code-rows")
        self._code = code
        self._rows: tuple[int, list[Content]] | None = None  # the last width asked and its rows

    def set_code(self, code: Content) -> None:
        """New code (a streamed block grew): its rows are cut again at the next layout."""
        self._code, self._rows = code, None
        self.refresh(layout=True)

    def rows(self, width: int) -> list[Content]:
        """The rows at `width` cells (kept for the last width: layout and render both ask)."""
        if self._rows is None or self._rows[0] != width:
            mark = Content.styled(WRAP_MARK, "$text-muted")
            self._rows = (width, wrapped_rows(self._code, width, mark))
        return self._rows[1]

    def plain_rows(self) -> list[str]:
        """The rows as they are drawn now, as plain text."""
        return [row.plain for row in self.rows(self.content_size.width)]

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.rows(width))

    def render(self) -> Content:
        return Content("\n").join(self.rows(self.content_size.width))


class WrappedFence(MarkdownFence):
    """A fenced or indented code block whose lines wrap instead of scrolling out of sight."""

    def compose(self) -> ComposeResult:
        yield WrappedCode(self._highlighted_code)

    def set_content(self, content: Content) -> None:
        """Called by Textual when the block is restyled or a streamed update replaces it."""
        self._content = content
        for rows in self.query_children(WrappedCode):
            rows.set_code(content)


class CodeWrappingMarkdown(Markdown):
    """Markdown whose code blocks wrap (`WrappedFence`); everything else is Textual's."""

    BLOCKS: dict[str, type[MarkdownBlock]] = {
        **Markdown.BLOCKS,
        "fence": WrappedFence,
        "code_block": WrappedFence,
    }
