"""Keeping a tool's output within `tools.max_output_kib`, and saying what was cut.

Every byte a tool returns is prefilled into the model's context, so output is capped; a cut is
always said in the text itself, with what to do next, because the model cannot see a flag. A
command keeps its head and its tail (the start says what ran, the end how it ended: the failing
test, the error); a listing or a read keeps its head, since it can be read on from there.
"""

from __future__ import annotations

LONG_LINE_CHARS = 400
"""A search hit's line is cut at this many characters (a minified file is one huge line)."""


def decode(data: bytes) -> str:
    """Bytes as text; bytes that are not UTF-8 become U+FFFD rather than failing the tool."""
    return data.decode("utf-8", errors="replace")


def shorten(line: str, limit: int = LONG_LINE_CHARS) -> str:
    """`line` cut to `limit` characters, marked when cut."""
    if len(line) <= limit:
        return line
    return f"{line[:limit]} ... [{len(line) - limit} more characters]"


class HeadTail:
    """The first and the last bytes of a stream of unknown length, at most `cap` in all, kept in
    bounded memory however much the stream produces."""

    def __init__(self, cap: int) -> None:
        self.cap = max(cap, 2)
        self._head_cap = self.cap // 2
        self._tail_cap = self.cap - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            extra = len(self._tail) - self._tail_cap
            if extra > 0:
                del self._tail[:extra]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def text(self) -> str:
        """Everything, or the head and the tail cut at line ends where one is near, with a line
        between them saying how much was left out."""
        if not self.truncated:
            return decode(bytes(self._head + self._tail))
        head, tail = bytes(self._head), bytes(self._tail)
        end = head.rfind(b"\n")
        if end >= len(head) // 2:
            head = head[: end + 1]
        start = tail.find(b"\n")
        if 0 <= start < len(tail) // 2:
            tail = tail[start + 1 :]
        cut = self.total - len(head) - len(tail)
        note = f"... cut: {cut:,} bytes in the middle of the output ({self.total:,} bytes in all) ..."
        head_text = decode(head)
        if head_text and not head_text.endswith("\n"):
            head_text += "\n"
        return f"{head_text}{note}\n{decode(tail)}"


def count(n: int, noun: str) -> str:
    """`1 file`, `3 files`, `2 matches`."""
    if n == 1:
        return f"{n:,} {noun}"
    return f"{n:,} {noun}es" if noun.endswith(("ch", "sh", "s", "x")) else f"{n:,} {noun}s"
