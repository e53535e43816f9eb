"""The message input: multi-line, Enter sends, Ctrl+J (or Alt+Enter) inserts a new line, and
Up/Down on the first/last line walk the prompt history (like a shell).

Never lose a keystroke. Enter is a *priority* binding (TextArea would otherwise take it as a new
line), and priority bindings run in the App's message loop as soon as the App reads the key,
while the characters typed before it are still queued on this widget. Reading `self.text` in the
action itself would send a prefix of what was typed, and clearing the input afterwards would
drop the rest (seen with `tmux send-keys` on a busy machine). So the action only schedules the
send on this widget's own queue, behind every key already delivered; the send then takes the
whole text and clears exactly that text in the same step. While the screen says sending is not
possible (`accepting` False: no model yet, a reply streaming), the text stays where it is.

`@` completes file paths once the screen gives a folder (`set_file_root`). An `@` at the start
of a line or after whitespace, followed by non-space characters up to the cursor, opens a list
of the matching files (`completion.py`, ranked by `app/file_finder.py`) just above the
composer; the files are listed on the first `@`, on a worker thread, and the list says
"listing files…" until then. While it is open: Down and Tab move down (Tab accepts when only
one file matches), Up and Shift+Tab move up, Enter accepts (with nothing to accept, still
listing or no match, it closes the list: Enter never sends while the list is open), Escape
closes it for that `@`. A space, moving the cursor out of the token, deleting the `@` or leaving
the composer closes it. Accepting removes the `@token` (through the end of its word; Ctrl+Z
brings it back) and posts `FilesChosen`. The list's state is worked out
again from the text and the cursor before each of these keys is acted on, and before a queued
Enter decides between accepting and sending, so keys still queued behind the list's updates
act on what the user typed, not on what the list showed a moment before. With the list closed
every key does what it did before; Escape reaches the screen (it stops a reply).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

from textual import events, on
from textual.message import Message
from textual.widget import Widget
from textual.widgets import TextArea

from ... import keymap
from ...file_finder import FileFinder
from .completion import PathCompletion

log = logging.getLogger(__name__)

MATCH_LIMIT = 20  # files in the `@` list (it shows a few rows and scrolls)
LISTING_FAILED = "cannot list the files here"


class AtToken(NamedTuple):
    """An `@path` being typed: the row and column of its `@`, and what follows it up to the
    cursor."""

    row: int
    column: int
    query: str


def at_token(line: str, row: int, column: int) -> AtToken | None:
    """The `@token` that ends at `column` of `line`: an `@` at the start or after whitespace,
    then non-space characters up to the cursor (an e-mail address is not one)."""
    before = line[:column]
    at = before.rfind("@")
    if at < 0 or (at > 0 and not before[at - 1].isspace()):
        return None
    query = before[at + 1 :]
    if any(ch.isspace() for ch in query):
        return None
    return AtToken(row, at, query)


class _FilesListed(Message, bubble=False):
    """The worker listed `finder`'s files (or failed to): the open list can show matches."""

    def __init__(self, finder: FileFinder, failed: bool) -> None:
        super().__init__()
        self.finder = finder
        self.failed = failed


class Composer(TextArea):
    BINDINGS = keymap.bindings("composer")

    @dataclass
    class Submitted(Message):
        """The input was taken (and cleared): the screen must send `text` or give it back."""

        composer: Composer
        text: str

    @dataclass
    class Held(Message):
        """Enter was pressed while sending is not possible; the text stays in the input."""

        composer: Composer

    @dataclass
    class FilesChosen(Message):
        """The user picked files with `@` (paths relative to the file root): the screen attaches
        them."""

        composer: Composer
        paths: tuple[str, ...]

    def __init__(
        self, *, history: list[str] | None = None, cursor_blink: bool = True, id: str | None = None
    ) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
        self.cursor_blink = cursor_blink
        self.prompt_history: list[str] = list(history or [])
        self._history_pos: int | None = None  # index into history while browsing
        self._draft = ""
        self.accepting = True  # set by the screen: can a message be sent right now?
        self._finder: FileFinder | None = None  # None: `@` is plain text
        self._listing: FileFinder | None = None  # the finder a worker is listing now
        self._listing_failed: FileFinder | None = None  # not tried again until a new root
        self._completion: PathCompletion | None = None  # mounted on the first `@`
        self._token: AtToken | None = None  # what the open list shows matches for (None: closed)
        self._dismissed: tuple[int, int] | None = None  # the `@` whose list Escape closed

    def action_submit(self) -> None:
        # Runs from the App's loop, possibly ahead of keys still queued here: see the docstring.
        self.call_later(self._submit_queued)

    def _submit_queued(self) -> None:
        if self._completion_takes_enter():
            return
        text = self.text
        if not text.strip():
            return
        if not self.accepting:
            self.post_message(self.Held(self))
            return
        if not self.prompt_history or self.prompt_history[-1] != text:
            self.prompt_history.append(text)
        self._history_pos = None
        self.clear()
        self.post_message(self.Submitted(self, text))

    def give_back(self, text: str) -> None:
        """Put a message that was not sent back in front of whatever was typed since."""
        rest = self.text
        joined = text if not rest.strip() else f"{text}\n\n{rest}"
        self.load_text(joined)
        self.move_cursor(self.document.end)

    def action_newline(self) -> None:
        self.insert("\n")

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] == 0 and self.prompt_history:
            if self._history_pos is None:
                self._draft, self._history_pos = self.text, len(self.prompt_history)
            if self._history_pos > 0:
                self._history_pos -= 1
                self._show(self.prompt_history[self._history_pos])
            return
        super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        last_row = self.document.line_count - 1
        if not select and self._history_pos is not None and self.cursor_location[0] == last_row:
            self._history_pos += 1
            if self._history_pos >= len(self.prompt_history):
                self._history_pos = None
                self._show(self._draft)
            else:
                self._show(self.prompt_history[self._history_pos])
            return
        super().action_cursor_down(select)

    def _show(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    # -- `@` file completion ------------------------------------------------------------------

    def set_file_root(self, root: Path | None) -> None:
        """Where `@` finds files (None: `@` is plain text). The files are listed at the first
        `@` after this, off the UI thread; the same root again keeps the list."""
        if root is not None and self._finder is not None and self._finder.root == root:
            return
        self._finder = FileFinder(root) if root is not None else None
        self._listing_failed = None
        self._close_completion()

    def refresh_files(self) -> None:
        """List the files again at the next `@` (files were added or removed since)."""
        if self._finder is not None:
            self._finder.refresh()
        self._listing_failed = None

    @property
    def path_completion(self) -> PathCompletion | None:
        """The `@` list (None until the first `@`); shown only while completing."""
        return self._completion

    @on(TextArea.Changed)
    @on(TextArea.SelectionChanged)
    def _follow_the_cursor(self) -> None:
        self._sync_completion()

    @on(events.Blur)
    def _close_on_blur(self) -> None:
        """A list left open over the transcript would answer keys the composer no longer gets;
        it comes back with the next key typed in the token."""
        self._close_completion()

    async def _on_key(self, event: events.Key) -> None:
        # TextArea's own `_on_key` still runs after this one (Textual calls each class's
        # handler) unless this one prevents it: only the list's keys are taken, only while open.
        if self._finder is None:
            return
        act = self._completion_keys().get(event.key)
        if act is None:
            return
        self._sync_completion()
        if self._token is None:
            return  # closed: the key does what it always does (Escape stops a reply)
        event.stop()
        event.prevent_default()
        act()

    def _completion_keys(self) -> dict[str, Callable[[], None]]:
        return {
            "tab": self._tab,
            "down": partial(self._move_highlight, 1),
            "shift+tab": partial(self._move_highlight, -1),
            "up": partial(self._move_highlight, -1),
            "escape": self._dismiss_completion,
        }

    def _tab(self) -> None:
        """Next file; with a single match, nothing to move through: take it."""
        completion = self._completion
        if completion is not None and len(completion.matches) == 1:
            self._accept(completion.matches[0])
        else:
            self._move_highlight(1)

    def _move_highlight(self, step: int) -> None:
        if self._completion is not None:
            self._completion.move(step)

    def _completion_takes_enter(self) -> bool:
        """While the list is open Enter takes its highlighted file, or closes the list when it
        has none (still listing, nothing matches): Enter never sends then."""
        self._sync_completion()
        if self._token is None:
            return False
        path = self._completion.highlighted_path if self._completion is not None else None
        if path is None:
            self._dismiss_completion()
        else:
            self._accept(path)
        return True

    @on(PathCompletion.Picked)
    def _picked(self, message: PathCompletion.Picked) -> None:
        self._sync_completion()
        if self._token is not None:
            self._accept(message.path)
        self.focus()

    def _accept(self, path: str) -> None:
        """Remove the `@token` (through the end of its word) and hand the file to the screen."""
        token = self._token
        if token is None:
            return
        line = self.document.get_line(token.row)
        end = token.column + 1 + len(token.query)
        while end < len(line) and not line[end].isspace():
            end += 1
        self._close_completion()
        self.replace("", (token.row, token.column), (token.row, end), maintain_selection_offset=False)
        self.post_message(self.FilesChosen(self, (path,)))

    def _dismiss_completion(self) -> None:
        if self._token is not None:
            self._dismissed = (self._token.row, self._token.column)
        self._close_completion()

    def _close_completion(self) -> None:
        self._token = None
        if self._completion is not None and self._completion.display:
            self._completion.display = False

    def _sync_completion(self) -> None:
        """Open, narrow or close the list to follow the `@token` before the cursor."""
        token = self._current_token()
        if token is None:
            self._dismissed = None
            self._close_completion()
        elif (token.row, token.column) == self._dismissed:
            self._close_completion()
        elif token != self._token:
            self._open_completion(token)

    def _current_token(self) -> AtToken | None:
        if self._finder is None:
            return None
        start, end = self.selection
        if start != end:
            return None
        row, column = end
        return at_token(self.document.get_line(row), row, column)

    def _open_completion(self, token: AtToken) -> None:
        completion = self._mounted_completion()
        finder = self._finder
        if completion is None or finder is None:
            return
        self._token = token
        completion.display = True
        if finder.listed:
            completion.show_matches(finder.match(token.query, MATCH_LIMIT))
        elif finder is self._listing_failed:
            completion.show_note(LISTING_FAILED)
        else:
            completion.show_listing()
            self._start_listing(finder)

    def _mounted_completion(self) -> PathCompletion | None:
        """The list, mounted in this composer's container just before it (the `@ completion`
        block of chat.tcss lifts it over whatever is above)."""
        if self._completion is None:
            container = self.parent
            if not isinstance(container, Widget):
                return None
            self._completion = PathCompletion(self)
            container.mount(self._completion, before=self)
        return self._completion

    def _start_listing(self, finder: FileFinder) -> None:
        if self._listing is finder:
            return
        self._listing = finder
        self.run_worker(
            partial(self._list_files, finder),
            name="list files",
            group="file-listing",
            thread=True,
            exit_on_error=False,
        )

    def _list_files(self, finder: FileFinder) -> None:
        """On the worker thread: list once, then tell the composer on its own queue."""
        failed = False
        try:
            finder.files()
        except Exception:  # a bug here must cost the `@` list, not the typed text
            log.exception("listing the files under %s failed", finder.root)
            failed = True
        self.post_message(_FilesListed(finder, failed))

    @on(_FilesListed)
    def _files_listed(self, message: _FilesListed) -> None:
        if message.finder is self._listing:
            self._listing = None
        if message.failed:
            self._listing_failed = message.finder
        token = self._token
        if message.finder is not self._finder or token is None:
            return
        self._token = None  # show it again, now with matches
        self._open_completion(token)
