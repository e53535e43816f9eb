"""The `@` file list the composer shows while the user types a path.

It never takes focus: the user keeps typing in the composer, which moves the highlight and
accepts for it (`Composer`), so no keystroke goes anywhere the user did not look. The composer
mounts it in its own container, just before itself; `assets/styles/chat.tcss` (the `@
completion` block) draws it as a screen overlay moved up by its own height, so it sits right
above the composer, over the end of the transcript, and opening, narrowing or closing it never
moves the transcript or the composer.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.message import Message
from textual.widget import Widget
from textual.widgets import OptionList
from textual.widgets.option_list import Option

LISTING = "listing files…"
NO_MATCH = "no matching files"


class PathCompletion(OptionList, can_focus=False):
    @dataclass
    class Picked(Message, bubble=False):
        """The user clicked a file: sent to the owning composer, which accepts it."""

        path: str

    def __init__(self, owner: Widget, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._owner = owner
        self._paths: tuple[str, ...] = ()
        self.display = False

    @property
    def matches(self) -> tuple[str, ...]:
        """The files shown, best first (empty while listing or when nothing matches)."""
        return self._paths

    @property
    def highlighted_path(self) -> str | None:
        if self.highlighted is None or not self._paths:
            return None
        return self._paths[self.highlighted]

    def show_listing(self) -> None:
        """The files are being listed: one line that says so instead of matches."""
        self.show_note(LISTING)

    def show_matches(self, paths: list[str]) -> None:
        """Show `paths`, the first highlighted; a note instead when there are none."""
        if not paths:
            self.show_note(NO_MATCH)
            return
        self._paths = tuple(paths)
        self.set_options(Option(_label(p)) for p in paths)
        self.highlighted = 0

    def move(self, step: int) -> None:
        """Move the highlight by `step` rows, wrapping around the ends."""
        if self._paths:
            current = self.highlighted or 0
            self.highlighted = (current + step) % len(self._paths)

    def show_note(self, note: str) -> None:
        """One line that is not a file (nothing to highlight or accept)."""
        self._paths = ()
        self.set_options([Option(Text(note), disabled=True)])

    def _on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()  # the composer moves the highlight: nobody else needs to hear of it

    def _on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_index < len(self._paths):
            self._owner.post_message(self.Picked(self._paths[event.option_index]))


def _label(path: str) -> Text:
    """The directory dimmed, the file name plain: names are what the eye looks for."""
    folder, _, name = path.rpartition("/")
    label = Text(no_wrap=True, overflow="ellipsis")
    if folder:
        label.append(f"{folder}/", style="dim")
    label.append(name)
    return label
