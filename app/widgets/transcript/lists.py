"""Lists in a streamed reply grow by their last item instead of being built again whole.

A streamed update parses the reply's last block again (`Markdown.append`) and hands the new block
to the one shown. Textual's lists take it by removing themselves and mounting the new list: every
item's row, bullet and paragraphs are made, styled, laid out and drawn again at each update, so
an update of a long list costs what the whole list costs (several times a paragraph's update;
`benchmarks/tui_update_cost.py`). These lists keep their rows and replace only the rows from the
first item that changed, and always the last one they showed, which the new text may have
grown. Earlier items cannot have changed unless their lines did: text is only appended, and
once a later item begins an earlier one is closed. An item is compared by its lines in the
source, its bullet and, for each block in it, its kind, lines and whether the list is tight
(`_signature`); a list that renumbered (an ordered list whose numbers got wider) or turned loose
is built again whole, as Textual would.

Their rows are `OneLayout` containers, like the message's other blocks (`one_layout.py`). A list
that is not streamed is composed as Textual composes it, with these rows in place of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets._markdown import (  # the list classes are not in Textual's public module
    MarkdownBullet,
    MarkdownBulletList,
    MarkdownListItem,
    MarkdownOrderedList,
)
from textual.widgets.markdown import MarkdownBlock

from .one_layout import OneLayout

Signature = tuple[object, ...]


class ItemRow(OneLayout, Horizontal):
    """One item of a list: its bullet, then its blocks (Textual's `Horizontal`, for the lists'
    stylesheets)."""


class ItemBody(OneLayout, Vertical):
    """The blocks of one item (Textual's `Vertical`, likewise)."""


class Bullet(OneLayout, MarkdownBullet):
    """An item's bullet or number."""


def _signature(block: MarkdownBlock) -> Signature:
    """What decides how a block that was not composed yet shows: its kind, its lines in the
    source, whether it is hidden (a tight list's paragraphs are), and the same for its blocks."""
    token = block._token
    lines = tuple(token.map) if token is not None and token.map else None
    hidden = token.hidden if token is not None else None
    return (type(block).__name__, lines, hidden, tuple(_signature(b) for b in block._blocks))


class GrowingList:
    """Mixed into a Markdown list class before it: rows kept across streamed updates (see the
    module's doc). `_symbols` gives each item's bullet as the list class draws it."""

    _shown: list[Signature]

    def _symbols(self, items: Sequence[MarkdownListItem]) -> list[str]:
        raise NotImplementedError

    def _items_and_signatures(self) -> tuple[list[MarkdownListItem], list[Signature]]:
        blocks: list[MarkdownBlock] = self._blocks  # type: ignore[attr-defined]
        items = [b for b in blocks if isinstance(b, MarkdownListItem)]
        symbols = self._symbols(items)
        return items, [(symbol, *_signature(item)) for item, symbol in zip(items, symbols, strict=True)]

    def compose(self) -> ComposeResult:
        items, self._shown = self._items_and_signatures()
        yield from _rows(items, self._shown)
        self._blocks.clear()  # type: ignore[attr-defined]

    async def _update_from_block(self, block: MarkdownBlock) -> None:
        """Take a streamed update's list: the rows from the first item that differs are
        replaced, except the last one shown, which grows in place when the new text only added
        to it (its blocks updated as the Markdown updates its last block, new blocks mounted)."""
        rows = list(self.query_children(ItemRow))  # type: ignore[attr-defined]
        shown = getattr(self, "_shown", None)
        same_kind = isinstance(block, GrowingList) and type(block) is type(self)
        if not same_kind or not shown or len(rows) != len(shown):
            await super()._update_from_block(block)  # type: ignore[misc]
            return
        items, signatures = block._items_and_signatures()  # type: ignore[attr-defined]
        last = len(shown) - 1
        keep = 0
        while keep < min(last, len(signatures)) and shown[keep] == signatures[keep]:
            keep += 1
        self._copy_context(block)  # type: ignore[attr-defined]
        block._blocks.clear()
        with self.app.batch_update():  # type: ignore[attr-defined]
            if keep == last < len(items) and await _grow_item(
                rows[last], shown[last], items[last], signatures[last]
            ):
                keep += 1
            if rows[keep:]:
                await self.remove_children(rows[keep:])  # type: ignore[attr-defined]
            new_rows = _rows(items[keep:], signatures[keep:])
            if new_rows:
                await self.mount_all(new_rows)  # type: ignore[attr-defined]
        self._shown = signatures


async def _grow_item(row: ItemRow, shown: Signature, item: MarkdownListItem, signature: Signature) -> bool:
    """Update a shown item's row from the same item parsed again with more text, in place,
    when the new item starts as the shown one did (same bullet, same kinds of block, the same
    tightness); whether it could."""
    old_blocks: tuple[Signature, ...] = shown[4]  # type: ignore[assignment]
    new_blocks: tuple[Signature, ...] = signature[4]  # type: ignore[assignment]
    body = row.query_one(ItemBody)
    children = [child for child in body.children if isinstance(child, MarkdownBlock)]
    if (
        shown[0] != signature[0]
        or len(children) != len(old_blocks)
        or not old_blocks
        or [(b[0], b[2]) for b in new_blocks[: len(old_blocks)]] != [(b[0], b[2]) for b in old_blocks]
    ):
        return False
    new = list(item._blocks)
    item._blocks.clear()
    for i, (child, old_signature) in enumerate(zip(children, old_blocks, strict=True)):
        if i < len(old_blocks) - 1 and old_signature == new_blocks[i]:
            continue  # an earlier block of the item, unchanged
        await child._update_from_block(new[i])
    if new[len(children) :]:
        await body.mount_all(new[len(children) :])
    return True


def _rows(items: Sequence[MarkdownListItem], signatures: Sequence[Signature]) -> list[ItemRow]:
    rows = []
    for item, signature in zip(items, signatures, strict=True):
        bullet = Bullet()
        bullet.symbol = str(signature[0])
        rows.append(ItemRow(bullet, ItemBody(*item._blocks)))
    return rows


class GrowingBulletList(OneLayout, GrowingList, MarkdownBulletList):
    """A bullet list that grows by its last item while streamed."""

    def _symbols(self, items: Sequence[MarkdownListItem]) -> list[str]:
        return [item.bullet for item in items]


class GrowingOrderedList(OneLayout, GrowingList, MarkdownOrderedList):
    """A numbered list that grows by its last item while streamed (numbered as Textual
    numbers it: from the first item's number, right-aligned to the widest)."""

    SUFFIX = ". "

    def _symbols(self, items: Sequence[MarkdownListItem]) -> list[str]:
        if not items:
            return []
        try:
            start = int(items[0].bullet)
        except ValueError:
            start = 1
        numbers = [f"{n}{self.SUFFIX}" for n in range(start, start + len(items))]
        width = max(len(n) for n in numbers)
        return [n.rjust(width + 1) for n in numbers]
