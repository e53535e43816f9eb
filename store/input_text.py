"""Text from outside velo-chat, made safe to store: one policy for stdin, argv, session files and
the TUI's composer (docs/privacy-and-input.md).

- NUL bytes (or NUL characters) mean binary input (an executable, an image, a UTF-16 file):
  `BinaryInput`, which the CLI reports in one line with exit 2. Nothing sensible can be said
  about a binary prompt, and guessing would store garbage.
- Bytes that are not valid UTF-8 in otherwise-text input become U+FFFD, one per byte, and the
  caller is told how many (a Latin-1 file, a truncated paste): the rest of the text is worth
  keeping, and the user is warned rather than refused.
- Lone surrogates in a `str` become U+FFFD too. Python makes them from argv and terminal bytes
  that are not UTF-8 (`surrogateescape`), `json.loads` makes them from `"\\ud800"` escapes, and
  neither UTF-8 nor SQLite can hold them (`sqlite3` raises `UnicodeEncodeError: surrogates not
  allowed`). The store applies `replace_surrogates` to every text it writes, so whatever a
  caller forgets can never crash a write.

No Textual and no engine import: the CLI, the TUI and the store all use this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REPLACEMENT = "\ufffd"

# A high surrogate followed by a low one is a UTF-16 pair split into two code points (a UTF-16
# clipboard, a JSON library that does not join them): joined, it is the character it meant.
# Any other surrogate is lone.
_SURROGATES = re.compile(r"[\ud800-\udbff][\udc00-\udfff]|[\ud800-\udfff]")


class BinaryInput(ValueError):
    """The input holds NUL bytes: it is binary, not text. Refused, so nothing is stored."""


@dataclass(frozen=True, slots=True)
class CleanText:
    """Text ready to store, and how many invalid bytes or lone surrogates became U+FFFD."""

    text: str
    replaced: int = 0


def _count_and_replace(text: str) -> CleanText:
    replaced = 0

    def fix(match: re.Match[str]) -> str:
        nonlocal replaced
        pair = match.group()
        if len(pair) == 2:
            return chr(0x10000 + ((ord(pair[0]) - 0xD800) << 10) + (ord(pair[1]) - 0xDC00))
        replaced += 1
        return REPLACEMENT

    return CleanText(_SURROGATES.sub(fix, text), replaced)


def replace_surrogates(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD (split UTF-16 pairs joined).

    The store's last line of defence: never raises, keeps NUL characters (a model can emit one,
    and a JSON `\\u0000` escape is valid text)."""
    return _count_and_replace(text).text if _SURROGATES.search(text) else text


def clean_text(text: str, what: str = "the text") -> CleanText:
    """Check and clean a `str` typed, pasted or passed on the command line.

    The TUI calls this on the composer's text before sending; the CLI on a PROMPT argument.
    Raises `BinaryInput` (message naming `what`) if it holds a NUL character; otherwise returns
    the text with lone surrogates replaced by U+FFFD and their count (for argv, decoded with
    `surrogateescape`, that is the number of bytes that were not UTF-8)."""
    if "\0" in text:
        raise BinaryInput(f"{what} is binary (it contains NUL bytes), not text; nothing was stored")
    return _count_and_replace(text)


def decode_text(data: bytes, what: str) -> CleanText:
    """Decode bytes read from stdin or a file as UTF-8, by the same rules as `clean_text`.

    Each byte that is not part of valid UTF-8 becomes one U+FFFD (decoded with
    `surrogateescape`, then replaced), so `replaced` counts bytes, as for argv."""
    if b"\0" in data:
        raise BinaryInput(f"{what} is binary (it contains NUL bytes), not text; nothing was stored")
    return _count_and_replace(data.decode("utf-8", errors="surrogateescape"))
