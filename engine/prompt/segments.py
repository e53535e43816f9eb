"""Which parts of a rendered chat are the template's own text and which are message text.

The prompt must not let message text become control tokens: a pasted log or diff that contains
"<|im_end|>\\n<|im_start|>assistant\\n" has to stay text, not end the user's turn. So the rendered
conversation is cut into segments, the template's scaffolding (tokenized with control tokens
parsed) and each message's text (tokenized as plain text, `tokens.py`).

How the cut is found: the template is rendered a second time with a unique marker in place of each
message's text. The text between markers is the scaffolding; the real rendering must then read
scaffold, message text, scaffold, ... where each message text is the original or what templates
commonly make of it (`strip`/`trim`, the part after a `split` separator such as "</think>"). If
that alignment fails (a template that transforms message text some other way), the fallback is
still safe: before any rendering, the text of every protected token inside a message is swapped
for a placeholder, so the real rendering holds no control-token text that came from a message;
each placeholder becomes a plain segment with the original text, everything else is parsed.

Markers and placeholders are built from characters of Unicode's Supplementary Private Use Area-B
that occur in no message, nor in the template or its BOS/EOS strings, so they cannot collide with
real text; they contain no whitespace, so `strip` and `trim` leave them intact.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

_SENTINEL_TOP = 0x10FFFD  # last character of Supplementary Private Use Area-B
_SENTINEL_FLOOR = 0x100000


def _numbered(sentinel: str) -> re.Pattern[str]:
    """Matches a marker or placeholder: a number between two sentinel characters."""
    s = re.escape(sentinel)
    return re.compile(f"{s}([0-9]+){s}")


@dataclass(frozen=True)
class Segment:
    """A piece of the rendered prompt. `plain`: message text, never parsed for control tokens;
    otherwise the template's own text. `message` is the index of the message the text comes from
    (None for scaffolding, and for placeholders restored by the fallback)."""

    text: str
    plain: bool
    message: int | None = None


class SegmentationError(ValueError):
    """No two sentinel characters are free (the messages use thousands of private-use chars)."""


class PromptSplitter:
    """Cuts renderings of one template into segments. Built once per template."""

    def __init__(
        self, *, protected: Iterable[str], separators: Iterable[str], fixed_texts: Iterable[str]
    ) -> None:
        """`protected`: token texts message text must never turn into (control tokens...).
        `separators`: strings the template splits message text on (e.g. "</think>").
        `fixed_texts`: the template source and the strings it is rendered with."""
        texts = sorted({t for t in protected if t}, key=len, reverse=True)
        self.protected: tuple[str, ...] = tuple(texts)
        self._index = {t: k for k, t in enumerate(texts)}
        # longest first: at one position, the longest protected text wins (as llama.cpp does)
        self._pattern = re.compile("|".join(map(re.escape, texts))) if texts else None
        self.separators = tuple(dict.fromkeys(s for s in separators if s))
        self._taken = {ch for t in fixed_texts for ch in t if ord(ch) >= _SENTINEL_FLOOR}

    def split(self, render: Callable[[Sequence[str]], str], contents: Sequence[str]) -> list[Segment]:
        """Render with `render(contents)` and return the segments, which concatenate to the
        rendering (with the original message text). Errors of `render` on the real contents
        propagate; the marker rendering may fail, which only selects the fallback."""
        mark, hole = self._sentinels(contents)
        escaped = [self._escape(c, hole) for c in contents]
        full = render(escaped)
        segments = self._aligned(render, full, escaped, mark, hole)
        if segments is None:
            log.debug(
                "chat template: message text could not be located by markers; using the escaped rendering"
            )
            segments = self._fallback(full, hole)
        return segments

    # -- pieces ---------------------------------------------------------------------------------

    def _sentinels(self, contents: Sequence[str]) -> tuple[str, str]:
        found: list[str] = []
        for cp in range(_SENTINEL_TOP, _SENTINEL_FLOOR, -1):
            ch = chr(cp)
            if ch in self._taken or any(ch in c for c in contents):
                continue
            found.append(ch)
            if len(found) == 2:
                return found[0], found[1]
        raise SegmentationError("no free private-use character to mark message text with")

    def _escape(self, text: str, hole: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: f"{hole}{self._index[m.group()]}{hole}", text)

    def _unescape(self, text: str, hole: str) -> str | None:
        """The original text, or None if a placeholder was damaged."""
        out = _numbered(hole).sub(lambda m: self.protected[int(m[1])], text)
        return None if hole in out else out

    def _variants(self, text: str) -> list[str]:
        """What a template may have made of a message's text, most faithful first."""
        bases = [text] + [text.split(s)[-1] for s in self.separators if s in text]
        # inside a JSON string (`tojson`: tool calls' arguments, some templates' tool results)
        bases.append(json.dumps(text, ensure_ascii=False)[1:-1])
        out: list[str] = []
        for b in bases:
            for v in (b, b.strip(), b.lstrip(), b.rstrip(), b.strip("\n"), b.lstrip("\n"), b.rstrip("\n")):
                if v not in out:
                    out.append(v)
        return out

    def _aligned(
        self, render: Callable[[Sequence[str]], str], full: str, escaped: Sequence[str], mark: str, hole: str
    ) -> list[Segment] | None:
        try:
            marked = render([f"{mark}{i}{mark}" for i in range(len(escaped))])
        except Exception:  # e.g. a template that validates message text
            log.debug("chat template: the marker rendering failed", exc_info=True)
            return None
        parts = _numbered(mark).split(marked)
        pieces, ids = parts[0::2], [int(x) for x in parts[1::2]]
        if any(mark in p or hole in p for p in pieces) or any(i >= len(escaped) for i in ids):
            return None
        if not full.startswith(pieces[0]):
            return None
        out = [Segment(pieces[0], plain=False)]
        pos = len(pieces[0])
        for i, after in zip(ids, pieces[1:], strict=True):
            for text in self._variants(escaped[i]):
                if full.startswith(text, pos) and full.startswith(after, pos + len(text)):
                    break
            else:
                return None
            original = self._unescape(text, hole)
            if original is None:
                return None
            out += [Segment(original, plain=True, message=i), Segment(after, plain=False)]
            pos += len(text) + len(after)
        if pos != len(full):
            return None
        return [s for s in out if s.plain or s.text]

    def _fallback(self, full: str, hole: str) -> list[Segment]:
        out: list[Segment] = []
        parts = _numbered(hole).split(full)
        for k, part in enumerate(parts):
            if k % 2 and int(part) < len(self.protected):
                out.append(Segment(self.protected[int(part)], plain=True))
            elif k % 2:  # not one of ours (a template cannot make these): keep the text
                out.append(Segment(f"{hole}{part}{hole}", plain=False))
            elif part:
                out.append(Segment(part, plain=False))
        return out
