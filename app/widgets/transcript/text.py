"""Pure text helpers for the transcript: code blocks (a reply's reasoning arrives apart from its
answer, split by the engine: `engine/prompt/thinking.py`), how wide their lines are, and where a
code line too wide for the transcript is cut into the rows that show it."""

from __future__ import annotations

from markdown_it import MarkdownIt
from rich.cells import cell_len, get_character_cell_size

TAB_SIZE = 8  # as the fence's highlighter expands tabs (`textual.highlight`)


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced and indented code blocks, in order."""
    tokens = MarkdownIt("commonmark").parse(markdown)
    return [t.content for t in tokens if t.type in ("fence", "code_block")]


def widest_code_line(markdown: str) -> int:
    """The width in cells of the widest line of the code blocks in `markdown` (0: none), tabs
    expanded as they are drawn: what the transcript needs to show every line of code whole."""
    return max(
        (
            cell_len(line.expandtabs(TAB_SIZE))
            for block in code_blocks(markdown)
            for line in block.splitlines()
        ),
        default=0,
    )


def wrap_offsets(line: str, width: int, mark_width: int) -> list[int]:
    """Where to cut `line` (offsets in characters) so that its first row takes at most `width`
    cells and each following row at most `width - mark_width` (the row starts with the wrap
    mark). A character is never split, and every row takes at least one character, so nothing is
    lost even when a wide character does not fit: that row is then one cell too wide and the
    widget crops it, which only happens at widths of a cell or two."""
    offsets: list[int] = []
    room, used = width, 0
    for i, char in enumerate(line):
        size = get_character_cell_size(char)
        if used and used + size > room:
            offsets.append(i)
            room, used = max(width - mark_width, 1), 0
        used += size
    return offsets
