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

While a reply streams, a code block grows at its end, and what an update costs follows what it
appended, not the block's length (the UI thread's time is the decode's on a small machine:
`app/stream_pacer.py`): the block's lines are highlighted again only from a few lines before the
first changed one (`highlight.GrowingHighlight`); only the changed lines are cut into rows again;
and each row is drawn on its own (`WrappedCode.render_line`) and kept, so a repaint draws the new
rows and takes the others as they were. A block that names no language is shown plain until
the reply ends (guessing it reads every lexer Pygments has). The reply's final render is
Textual's, whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from markdown_it.token import Token
from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.content import Content
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.visual import Visual
from textual.widget import Widget
from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownBlock, MarkdownFence

from .highlight import PLAIN, GrowingHighlight, highlight_theme
from .lists import GrowingBulletList, GrowingOrderedList
from .one_layout import OneLayout, one_layout_blocks
from .text import wrap_offsets

WRAP_MARK = "↪ "


def line_rows(line: Content, width: int, mark: Content) -> list[Content]:
    """The rows that show one line of code in `width` cells (see `wrapped_rows`)."""
    if width <= mark.cell_length:
        return [line]
    first, *rest = line.divide(wrap_offsets(line.plain, width, mark.cell_length))
    return [first, *(mark + piece for piece in rest)]


def wrapped_rows(code: Content, width: int, mark: Content) -> list[Content]:
    """The rows that show `code` in `width` cells: each line cut where it would overflow, and
    every row after the first of a line opening with `mark`. A width too small to hold the mark
    and a character leaves the lines whole (the widget is not laid out yet)."""
    return [row for line in code.split("\n") for row in line_rows(line, width, mark)]


class WrappedCode(OneLayout, Widget):
    """The highlighted code of one block, soft-wrapped at this widget's width.

    It keeps the rows of each line and each row drawn: a block that grew cuts and draws only
    its changed lines (`set_lines`)."""

    def __init__(self, code: Content | Sequence[Content]) -> None:
        """`code`: the highlighted code, whole or as its lines."""
        super().__init__(classes="code-rows")
        self.auto_links = False  # no links in code (as Textual's fence), none to style per row
        self._lines = code.split("\n") if isinstance(code, Content) else list(code)
        self._width = 0  # the width the rows were cut at (0: not yet)
        self._rows: list[Content] = []
        self._starts: list[int] = []  # the row each line starts at
        self._strips: list[Strip | None] = []  # each row drawn (None: not yet)
        self._strip_style: object = None  # the visual style the rows were drawn in
        self.lines_cut = 0  # lines cut into rows so far (the tests count them)
        self.rows_drawn = 0  # rows drawn so far (likewise)

    def set_code(self, code: Content) -> None:
        """New code, whole (the block was restyled): lines that are the same as before, with
        the same colours, keep their rows."""
        lines = code.split("\n")
        kept = 0
        for old, new in zip(self._lines, lines, strict=False):
            if old.plain != new.plain or list(old.spans) != list(new.spans):
                break
            kept += 1
        self.set_lines(lines, kept)

    def set_lines(self, lines: Sequence[Content], kept: int) -> None:
        """New lines, of which the first `kept` are the same as before (a streamed block grew):
        only the others are cut into rows and drawn again."""
        kept = min(kept, len(self._lines), len(lines))
        height = len(self._rows)
        self._lines = list(lines)
        if not self._width:
            self.refresh(layout=True)
            return
        cut = self._starts[kept] if kept < len(self._starts) else len(self._rows)
        del self._rows[cut:], self._starts[kept:], self._strips[cut:]
        self._cut(kept)
        if len(self._rows) != height:
            self.refresh(layout=True)  # a resize repaints it all: the rows drawn are kept
        else:  # the same height: only the changed rows
            self.refresh(Region(0, cut, self._width, height - cut))

    def _cut(self, first: int) -> None:
        """Cut the lines from `first` on into rows at `_width`."""
        mark = Content.styled(WRAP_MARK, "$text-muted")
        for line in self._lines[first:]:
            self._starts.append(len(self._rows))
            pieces = line_rows(line, self._width, mark)
            self._rows.extend(pieces)
            self._strips.extend([None] * len(pieces))
        self.lines_cut += len(self._lines) - first

    @property
    def lines(self) -> tuple[Content, ...]:
        """The highlighted lines of code it shows (each cut into one or more rows)."""
        return tuple(self._lines)

    def rows(self, width: int) -> list[Content]:
        """The rows at `width` cells (kept until the width changes)."""
        if width != self._width:
            self._width, self._rows, self._starts, self._strips = width, [], [], []
            self._cut(0)
        return self._rows

    def plain_rows(self) -> list[str]:
        """The rows as they are drawn now, as plain text."""
        return [row.plain for row in self.rows(self.content_size.width)]

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.rows(width))

    def render(self) -> Content:
        """All the rows: what a text selection draws and copies."""
        return Content("\n").join(self.rows(self.content_size.width))

    def render_line(self, y: int) -> Strip:
        """Row `y`, drawn once and kept (Textual would draw every row of the block again). With
        a text selection in the widget, Textual's own drawing of all the rows shows it."""
        if self.text_selection is not None:
            return super().render_line(y)
        width = self.content_size.width
        rows = self.rows(width)
        style = self.visual_style
        if style is not self._strip_style:
            self._strip_style, self._strips = style, [None] * len(rows)
        if not 0 <= y < len(rows) or width <= 0:
            return Strip.blank(max(width, 0), style.rich_style)
        strip = self._strips[y]
        if strip is None:
            strip = self._strips[y] = Visual.to_strips(self, rows[y], width, 1, style)[0]
            self.rows_drawn += 1
        return strip


NOT_HIGHLIGHTED = Content("")
"""What a fence made while the document is streamed holds instead of its highlighted code."""


class WrappedFence(OneLayout, MarkdownFence):
    """A fenced or indented code block whose lines wrap instead of scrolling out of sight.

    While the document is streamed, a fence highlights its code as it grows
    (`GrowingHighlight`), and leaves a fence it did not name unhighlighted: a streamed update
    parses the document's last block again into a new fence and hands it to the one shown
    (`set_content`), which takes its code and highlights only what changed; the new fence
    highlights nothing."""

    def __init__(self, markdown: Markdown, token: Token, code: str) -> None:
        self._streamed = isinstance(markdown, CodeWrappingMarkdown) and markdown.appending
        super().__init__(markdown, token, "" if self._streamed else code)
        self.code = code
        self._growing: GrowingHighlight | None = None
        if self._streamed:
            self._highlighted_code = NOT_HIGHLIGHTED

    @classmethod
    def highlight(cls, code: str, language: str, ansi: bool = False, dark: bool = False) -> Content:
        """As Textual's, less the lexer's look-up for no code (a fence just opened): a name that
        is not a lexer's, as a fence's first line can be before it is whole, makes Pygments
        read the entry points of every installed package."""
        return super().highlight(code, language, ansi, dark) if code else Content("")

    def compose(self) -> ComposeResult:
        yield WrappedCode(self._grow()[0] if self._streamed else self._highlighted_code)

    def _grow(self) -> tuple[list[Content], int]:
        """The code's lines, highlighted from what was highlighted before (`GrowingHighlight`),
        and how many leading lines did not change."""
        theme = highlight_theme(self.app.native_ansi_color, self.app.current_theme.dark)
        growing = self._growing
        if growing is None or (growing.language, growing.theme) != (self.lexer or PLAIN, theme):
            growing = self._growing = GrowingHighlight(self.lexer, theme)
        return growing.lines(self.code)

    def set_content(self, content: Content) -> None:
        """Called by Textual when the block is restyled or a streamed update hands it a new
        fence (its code is already copied here)."""
        self._content = content
        self._streamed = self._streamed or content is NOT_HIGHLIGHTED
        if self._streamed:
            lines, kept = self._grow()
            for rows in self.query_children(WrappedCode):
                rows.set_lines(lines, kept)
            return
        for rows in self.query_children(WrappedCode):
            rows.set_code(content)

    def notify_style_update(self) -> None:
        """Restyled (on mount too): Textual's fence highlights its code again; a streamed one
        only if the theme changed (`_grow`)."""
        if not self._streamed:
            super().notify_style_update()
            return
        self.set_content(self._content)
        super(MarkdownFence, self).notify_style_update()


class CodeWrappingMarkdown(OneLayout, Markdown):
    """Markdown whose code blocks wrap (`WrappedFence`) and whose lists grow by their last item
    while streamed (`lists.py`); everything else is Textual's, laid out once per update
    (`one_layout.py`)."""

    BLOCKS: dict[str, type[MarkdownBlock]] = one_layout_blocks(
        {
            **Markdown.BLOCKS,
            "fence": WrappedFence,
            "code_block": WrappedFence,
            "bullet_list_open": GrowingBulletList,
            "ordered_list_open": GrowingOrderedList,
        }
    )

    appending = False
    """Whether the document is being streamed (`append`) since it was last set whole."""

    def append(self, markdown: str) -> AwaitComplete:
        self.appending = True
        return super().append(markdown)

    def update(self, markdown: str) -> AwaitComplete:
        self.appending = False
        return super().update(markdown)
