"""Widgets of a message that one layout of the screen places, where Textual would lay it out twice.

Textual's `Widget.virtual_size` is a reactive that asks for a layout of the screen when it
changes, and every layout ends by setting the virtual size of each widget whose size changed. So
a streamed update that grows a block is laid out twice: once for its new text, and once more
because the block, the Markdown around it and the code rows in it now have new virtual sizes.
The second layout moves nothing (the first one computed those sizes) and costs as much as the
first, plus a compositor pass, on the UI thread, whose time a small machine takes from the
decode (`app/stream_pacer.py`). A scrolling widget needs the reactive's layout no more than
these do: Textual updates its scrollbars from `_size_updated` itself, before the reactive fires.

`OneLayout` declares the reactive again without the layout, for the widgets of a message that
grow while a reply streams: the message, its Markdown, every Markdown block (`one_layout_blocks`)
and the code rows. A change of their virtual size still repaints them.
"""

from __future__ import annotations

from collections.abc import Mapping

from textual.geometry import Size
from textual.reactive import Reactive
from textual.widgets.markdown import MarkdownBlock


class OneLayout:
    """Mix in before a Textual widget class: its virtual size changes without a second layout
    (see the module's doc)."""

    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)


def one_layout_blocks(blocks: Mapping[str, type[MarkdownBlock]]) -> dict[str, type[MarkdownBlock]]:
    """A Markdown widget's `BLOCKS` with every block class made `OneLayout`: a subclass under
    the same name (so the stylesheets' type selectors, Textual's and ours, match it as before),
    one per class however many names map to it."""
    made: dict[type[MarkdownBlock], type[MarkdownBlock]] = {}
    for block in blocks.values():
        if block not in made:
            made[block] = (
                block
                if issubclass(block, OneLayout)
                else type(block.__name__, (OneLayout, block), {"__module__": __name__})
            )
    return {name: made[block] for name, block in blocks.items()}
