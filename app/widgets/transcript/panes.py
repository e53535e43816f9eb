"""The side panes give way to code: while the transcript would be narrower than its widest code
line needs, the chat screen hides the live panel, then the sidebar; they come back when the
window grows enough. Code still wraps with a mark where even the whole window is too narrow
(`code.py`), so this only spares the user reading wrapped code where the window has the room.

Only panes that gave way come back, never one the user hid with its key (Ctrl+B, Ctrl+T); a pane
the user shows with its key stays shown until the next resize, whatever code comes after: the
user's choice wins. New code only ever hides panes; they come back on a resize (a session without
code does not bring them back, so switching sessions does not make them come and go).

`panes_to_show` is the decision, a pure function; `fit_side_panes` is the screen's glue. What the
fitting did is kept on the panes themselves as modifier classes, as the chat screen keeps its
other state (`-gave-way`: hidden by fitting; `-kept`: shown by the user since the last resize).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from textual.widget import Widget

from .transcript import Transcript

GAVE_WAY = "-gave-way"
KEPT = "-kept"


@dataclass(frozen=True)
class Pane:
    """A side pane as the fitting sees it."""

    name: str
    width: int  # the columns it takes when shown
    shown: bool
    gave_way: bool = False  # hidden by an earlier fitting, not by the user: may come back
    kept: bool = False  # shown by the user with its key since the last resize: stays


def panes_to_show(
    screen_width: int, panes: Sequence[Pane], widest_code: int, gutter: int, *, grow: bool
) -> frozenset[str]:
    """The names of the panes to show so that the transcript (the screen less the panes shown)
    holds `widest_code` cells of code plus the `gutter` around it, hiding panes in the order of
    `panes` (the first gives way first), as few as it takes; all of them where even that is not
    enough. `grow` (a resize): panes that gave way come back where there is room; else (new
    code) panes only give way. A pane the user hid stays hidden; one they showed, or one that
    gave way and is shown again (its key, the filter key, a saved profile), stays shown."""
    need = widest_code + gutter if widest_code else 0

    def movable(pane: Pane) -> bool:
        if pane.shown:
            return not (pane.kept or pane.gave_way)
        return pane.gave_way and grow

    shown = [p for p in panes if p.shown or movable(p)]
    room = screen_width - sum(p.width for p in shown)
    for pane in panes:
        if room >= need:
            break
        if pane in shown and movable(pane):
            shown.remove(pane)
            room += pane.width
    return frozenset(p.name for p in shown)


def pane_width(pane: Widget) -> int:
    """The columns `pane` takes when shown (from its style: a hidden pane has no size)."""
    width = pane.styles.width
    if width is None:
        return pane.outer_size.width
    return int(width.resolve(pane.app.size, pane.app.size)) + pane.styles.margin.width


def pane_keyed(pane: Widget) -> None:
    """The user showed or hid `pane` with its key: hidden, it stays hidden (it did not give way);
    shown, it stays shown until the next resize."""
    pane.remove_class(GAVE_WAY)
    pane.set_class(pane.display, KEPT)


def fit_side_panes(
    panes: Sequence[Widget], transcript: Transcript, screen_width: int, *, resized: bool
) -> bool:
    """Show and hide `panes` (the first gives way first) as `panes_to_show` says for the code
    in `transcript`. `resized`: the window changed size, so panes that gave way may come back
    and the user's choices made since the last resize no longer hold. True when panes gave way
    and none had before: the screen tells the user, once for each time they go."""
    for widget in panes:
        if widget.display and widget.has_class(GAVE_WAY):  # shown again (the filter key, a profile)
            widget.remove_class(GAVE_WAY).add_class(KEPT)
        if resized:
            widget.remove_class(KEPT)
    seen = [
        Pane(str(w.id), pane_width(w), w.display, w.has_class(GAVE_WAY), w.has_class(KEPT)) for w in panes
    ]
    show = panes_to_show(
        screen_width, seen, transcript.widest_code_line(), transcript.code_gutter(), grow=resized
    )
    already_gone = any(p.gave_way and not p.shown for p in seen)
    hidden_now = False
    for widget, pane in zip(panes, seen, strict=True):
        shown = pane.name in show
        hidden_now = hidden_now or (pane.shown and not shown)
        if shown != pane.shown:
            widget.display = shown
        widget.set_class(not shown and (pane.shown or pane.gave_way), GAVE_WAY)
        widget.set_class(shown and pane.kept, KEPT)
    return hidden_now and not already_gone
