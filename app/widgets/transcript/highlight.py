"""Syntax highlighting of a code block that grows at its end while a reply streams.

Textual's fence highlights its whole code again each time the block grows, so a streamed block of
n lines costs n lines of Pygments at every update, on the UI thread that shares the cores with the
decode (`app/stream_pacer.py`). `GrowingHighlight` keeps the lines it highlighted and lexes again
only from a few lines (`OVERLAP`) before the first line that changed, and checks those few
against what they were. Where they come out the same, the lexer was in its first state there, and
the lines before them are kept. Where they do not (the lexer starts inside a multi-line string,
whose closing can also turn its first lines into a docstring), it looks back four times as far,
and so on, up to the block's first line. What it returns is what highlighting the whole block
gives (tests/test_tui_stream_cost.py checks it after every step of a long module). A block whose
language is not named is shown plain until the reply ends: guessing the language reads every lexer
Pygments has, at every update (the message's final render guesses, once).

It does what `textual.highlight.highlight` does (the same lexer options, theme and styles), cut
into lines as `WrappedCode` shows them; the lines it returns are the ones of the last call where
they did not change, so the rows cut from them can be kept too.
"""

from __future__ import annotations

from textual.content import Content
from textual.highlight import (
    ANSIDarkHighlightTheme,
    ANSILightHighlightTheme,
    HighlightTheme,
    highlight,
)

PLAIN = "text"  # Pygments' lexer for text with no colours

WARM_LANGUAGES = ("python",)
"""Lexers built before the first reply (`warm_lexers`): the language most replies here write."""


def highlight_theme(ansi: bool, dark: bool) -> type[HighlightTheme]:
    """The theme Textual's fence highlights in (`MarkdownFence.highlight`)."""
    if not ansi:
        return HighlightTheme
    return ANSIDarkHighlightTheme if dark else ANSILightHighlightTheme


def warm_lexers(languages: tuple[str, ...] = WARM_LANGUAGES) -> None:
    """Build these languages' lexers now. Pygments compiles every regular expression of a
    lexer's rules the first time it is used, which would otherwise fall inside the decode of the
    first reply with code, on the UI thread that shares the cores with it."""
    for language in languages:
        highlight("pass", language=language)


class GrowingHighlight:
    """The highlighted lines of one code block as it grows (one language and theme)."""

    OVERLAP = 3
    """Settled lines lexed again before the first changed line, to check the lexer's state
    there; four times as many when they come out otherwise, and so on."""

    def __init__(self, language: str | None, theme: type[HighlightTheme]) -> None:
        """`language`: the fence's info string (None or "": not named, shown plain)."""
        self.language = language or PLAIN
        self.theme = theme
        self._code = ""  # the code of the last call, as highlighted (lines joined with "\n")
        self._lines: list[Content] = []
        self._starts: list[int] = []  # where each line starts in `_code`
        self.lines_lexed = 0  # lines that went through the lexer so far (the tests count them)

    def lines(self, code: str) -> tuple[list[Content], int]:
        """The highlighted lines of `code`, and how many leading lines are the very ones (the
        same objects) the last call returned."""
        code = "\n".join(code.splitlines())  # as `textual.highlight.highlight` cuts it
        if code == self._code and self._lines:
            return self._lines, len(self._lines)
        settled = self._settled(code)
        back = self.OVERLAP
        while True:
            start = max(0, settled - back)
            tail = self._lex(code[self._starts[start] :] if start else code)
            same = self._same_lines(start, settled, tail)
            if not start or same == settled - start:
                break
            back *= 4  # the lexer was not in its first state there (a multi-line string)
        settled = start + same
        lines = self._lines[:settled] + tail[same:]
        starts = self._starts[:settled]
        at = self._starts[settled] if settled else 0
        for line in lines[settled:]:
            starts.append(at)
            at += len(line.plain) + 1
        self._code, self._lines, self._starts = code, lines, starts
        return lines, settled

    def _settled(self, code: str) -> int:
        """How many of the last call's lines `code` still has whole and followed by another
        line (the last line of the last call may have grown); 0 where `code` is not the last
        call's code with more appended (then it is all lexed again)."""
        whole = len(self._lines) - 1
        if whole <= 0 or not code.startswith(self._code[: self._starts[whole]]):
            return 0
        return whole

    def _same_lines(self, start: int, settled: int, tail: list[Content]) -> int:
        """How many lines of `tail` (lexed from line `start`) are the same, with the same
        colours, as the lines from `start` up to `settled` were."""
        same = 0
        for old, new in zip(self._lines[start:settled], tail, strict=False):
            if old.plain != new.plain or list(old.spans) != list(new.spans):
                break
            same += 1
        return same

    def _lex(self, code: str) -> list[Content]:
        lines = highlight(code, language=self.language, theme=self.theme).split("\n")
        self.lines_lexed += len(lines)
        return lines
