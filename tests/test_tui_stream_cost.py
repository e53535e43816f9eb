"""A code block that grows while a reply streams costs each update what it appended, not the
block's length (the UI thread's time is taken from the decode on a small machine): its lines are
lexed again only from a few lines before the first changed one, only the changed lines are cut
into rows, and only the changed rows are drawn. What the transcript shows does not change: at
every step the rows are the ones Textual's whole re-render would show, colours included, and a
wrapped block still copies as its original text. The work is counted, never timed."""

from __future__ import annotations

from pathlib import Path

import pygments.lexers
from textual.app import App
from textual.screen import Screen
from textual.highlight import HighlightTheme, highlight

from velo_chat.app.screens import chat
from velo_chat.app.widgets.transcript.code import WRAP_MARK, CodeWrappingMarkdown, WrappedCode
from velo_chat.app.widgets.transcript.highlight import GrowingHighlight
from velo_chat.app.widgets.transcript.lists import ItemRow
from velo_chat.app.widgets.transcript.message import MessageView
from velo_chat.app.widgets.transcript.transcript import Transcript

METHOD = '''    def method_{i}(self, amount):
        """Move {i} units of `amount` between the two accounts of this bank, both ways at once."""
        if amount <= {i}:
            raise ValueError("amount {i} is too small for this transfer")
        self.balance += amount * {i}  # a comment long enough to wrap at the transcript's width

'''
DOCSTRING = '''"""A module docstring over
several lines, closed
only after a few more
lines than the check looks back,
so the lines it opened
turn into a docstring
when it closes.
"""
'''


def module(methods: int) -> str:
    return "class Bank:\n" + "".join(METHOD.format(i=i) for i in range(methods))


def lines_of(contents) -> list[tuple[str, list]]:
    return [(line.plain, list(line.spans)) for line in contents]


def full(code: str) -> list[tuple[str, list]]:
    """What Textual's fence shows: the whole code highlighted at once, cut into lines."""
    return lines_of(highlight("\n".join(code.splitlines()), language="python").split("\n"))


def test_growing_highlight_matches_a_whole_highlight_at_every_step_and_lexes_only_the_tail():
    code = DOCSTRING + module(12)
    growing = GrowingHighlight("python", HighlightTheme)
    lexed: list[tuple[int, int]] = []  # (lines in the block, lines lexed for that update)
    for end in range(7, len(code) + 7, 7):
        before = growing.lines_lexed
        lines, kept = growing.lines(code[:end].rstrip())
        assert lines_of(lines) == full(code[:end].rstrip())
        assert kept <= len(lines)
        lexed.append((len(lines), growing.lines_lexed - before))
    # Past the docstring (which the check must look back over), an update lexes the line that
    # grew, the new ones and the few it checks, however long the block is.
    past_docstring = [
        n - (size - before) for (before, _), (size, n) in zip(lexed, lexed[1:], strict=False) if before > 30
    ]
    assert past_docstring and max(past_docstring) <= GrowingHighlight.OVERLAP + 1
    assert growing.lines_lexed < sum(size for size, _ in lexed) / 4  # lexing it all every time


def test_growing_highlight_starts_again_when_the_code_is_not_an_append():
    growing = GrowingHighlight("python", HighlightTheme)
    growing.lines(module(3))
    edited = module(3).replace("method_0", "renamed")
    lines, kept = growing.lines(edited)
    assert kept == 0
    assert lines_of(lines) == full(edited)


class Host(App):
    CSS_PATH = Path(chat.__file__).parent / chat.ChatScreen.CSS_PATH  # the messages' real styles

    def compose(self):
        yield Transcript(id="transcript")


def reply(code: str, language: str = "python") -> str:
    return f"Here it is:\n\n```{language}\n{code}"


def code_rows(view: MessageView) -> list[WrappedCode]:
    return list(view.query(WrappedCode))


async def shown_whole(pilot, text: str) -> list[tuple[str, list]]:
    """The code lines a message that is not streamed shows for `text` (Textual's whole render)."""
    transcript = pilot.app.query_one(Transcript)
    view = await transcript.add_message(MessageView("assistant", text))
    await pilot.pause()
    (rows,) = code_rows(view)
    shown = lines_of(rows.lines)
    await view.remove()
    return shown


async def test_a_growing_block_cuts_and_draws_only_its_new_lines_and_shows_what_a_whole_render_shows():
    code = module(14)
    lines = code.splitlines(keepends=True)
    async with Host().run_test(size=(70, 40)) as pilot:
        transcript = pilot.app.query_one(Transcript)
        view = await transcript.add_message(MessageView("assistant", streaming=True))
        transcript.follow()
        await pilot.pause()
        costs: list[tuple[int, int, int]] = []  # after each update: width, lines cut, rows drawn
        streamed: dict[str, list[tuple[str, list]]] = {}  # what some updates showed
        for n in range(1, len(lines) + 1):
            await view.stream_text(reply("".join(lines[:n])))
            await pilot.pause()
            (rows,) = code_rows(view)
            cut, drawn = rows.lines_cut, rows.rows_drawn
            await pilot.pause()  # the layout's second pass, if any, cuts and draws nothing new
            assert (rows.lines_cut, rows.rows_drawn) == (cut, drawn)
            costs.append((rows.content_size.width, cut, drawn))
            plain = [row.plain for row in rows.rows(rows.content_size.width)]
            assert unwrapped(plain) == "".join(lines[:n]).rstrip().split("\n")
            if n % 9 == 0 or n == len(lines):
                streamed[reply("".join(lines[:n]))] = lines_of(rows.lines)
        assert len(code_rows(view)) == 1  # one block, updated in place
        steps = [
            (c1 - c0, d1 - d0)
            for (w0, c0, d0), (w1, c1, d1) in zip(costs, costs[1:], strict=False)
            if w0 == w1  # a new width (the transcript's scrollbar came) cuts them all again
        ]
        assert len(steps) >= len(lines) - 3
        # The line that grew (or the blank one it follows) and the new one, and their rows (one
        # line wraps into three), however long the block is.
        assert max(cut for cut, _ in steps) <= 3
        assert max(drawn for _, drawn in steps) <= 2 * 3
        assert sum(drawn for _, drawn in steps[-10:]) > 0  # the view follows the new rows
        assert any(row.startswith(WRAP_MARK) for row in plain)
        text = reply(code)
        await view.finish(text, "complete")
        await pilot.pause()
        assert view.next_code_block() == (code, 1, 1)  # copies as written, without marks or cuts
        for text, shown in streamed.items():  # what Textual's whole render shows, colours included
            assert shown == await shown_whole(pilot, text)


def unwrapped(rows: list[str]) -> list[str]:
    """The code lines the rows show: each row that opens with the mark continues the one before."""
    lines: list[str] = []
    for row in rows:
        if row.startswith(WRAP_MARK) and lines:
            lines[-1] += row[len(WRAP_MARK) :]
        else:
            lines.append(row)
    return lines


async def test_an_unnamed_block_streams_plain_without_guessing_its_language(monkeypatch):
    guesses: list[str] = []
    real_guess = pygments.lexers.guess_lexer

    def guess(code: str, **options):
        guesses.append(code)
        return real_guess(code, **options)

    monkeypatch.setattr(pygments.lexers, "guess_lexer", guess)
    code = module(3)
    async with Host().run_test(size=(70, 40)) as pilot:
        view = await pilot.app.query_one(Transcript).add_message(MessageView("assistant", streaming=True))
        await pilot.pause()
        for end in range(40, len(code) + 40, 40):
            await view.stream_text(reply(code[:end], language=""))
            await pilot.pause()
        (rows,) = code_rows(view)
        assert not guesses
        shown = rows.rows(rows.content_size.width)
        assert {span.style for row in shown for span in row.spans} <= {"$text", "$text-muted"}  # the mark's
        await view.finish(reply(code, language=""), "complete")
        await pilot.pause()
        await pilot.pause()
        assert guesses  # the final render is Textual's, as a message not streamed


async def test_a_fence_just_opened_looks_up_no_lexer(monkeypatch):
    looked_up: list[str] = []
    real = pygments.lexers.get_lexer_by_name

    def get_lexer_by_name(alias, **options):
        looked_up.append(alias)
        return real(alias, **options)

    monkeypatch.setattr(pygments.lexers, "get_lexer_by_name", get_lexer_by_name)
    async with Host().run_test(size=(70, 40)) as pilot:
        view = await pilot.app.query_one(Transcript).add_message(MessageView("assistant", streaming=True))
        await pilot.pause()
        for text in ("Here it is:\n\n```", "Here it is:\n\n```pyt", "Here it is:\n\n```python\n"):
            await view.stream_text(text)
            await pilot.pause()
        assert looked_up == []
        markdown = view.query_one(".answer", CodeWrappingMarkdown)
        assert markdown.appending
        await view.finish("Here it is:\n\n```python\nx = 1\n```", "complete")
        assert not markdown.appending


PROSE = " ".join(["The keeper walked along the rocky coast every evening while storms gathered."] * 12)


async def streamed_layouts(text: str, monkeypatch, *, step: int = 40) -> tuple[list[int], MessageView]:
    """Stream `text` into a reply `step` characters an update; the layouts of the screen each
    update took (counted, not timed)."""
    layouts = [0]
    real = Screen._refresh_layout

    def counted(self, *args, **kwargs):
        layouts[0] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Screen, "_refresh_layout", counted)
    per_update: list[int] = []
    async with Host().run_test(size=(70, 40)) as pilot:
        transcript = pilot.app.query_one(Transcript)
        view = await transcript.add_message(MessageView("assistant", streaming=True))
        transcript.follow()
        await pilot.pause()
        for end in range(step, len(text) + step, step):
            before = layouts[0]
            await view.stream_text(text[:end])
            await pilot.pause()
            await pilot.pause()  # a second layout, if one was asked for, has run
            per_update.append(layouts[0] - before)
        answer = view.query_one(".answer", CodeWrappingMarkdown)
        assert answer.virtual_size == answer.size  # the sizes kept up without the second layout
        for block in answer.children:
            assert block.virtual_size.height == block.size.height
    return per_update, view


async def test_a_streamed_update_of_prose_or_code_is_one_layout_of_the_screen(monkeypatch):
    """Textual lays the screen out again when a widget's virtual size changes, which every
    update that grows a block does: a second layout that moves nothing (one_layout.py)."""
    for text in (PROSE, reply(module(6))):
        per_update, _ = await streamed_layouts(text, monkeypatch)
        assert len(per_update) >= 15, per_update
        # The first overflow of the transcript (its scrollbar comes) and each renewal of the
        # room held below the reply are a layout more: a few updates, never most of them.
        assert sum(n > 1 for n in per_update) <= len(per_update) // 3, per_update
        assert sum(per_update) <= len(per_update) * 4 // 3, per_update


LISTS = (
    """Steps to follow:

- Walk along the rocky coast every evening, while the storms gather over the grey water.
- Check the lamp:
  1. trim the wick
  2. fill the oil
- Write it down:

  ```python
  log.write("lamp lit at dusk, the wind from the north-west")
  ```
- Sleep.

Then count:

"""
    + "".join(f"{i}. item number {i} of a numbered list that grows past nine\n" for i in range(1, 13))
    + """
A loose list:

- one

- two
"""
)


def shape(widget) -> list[tuple]:
    """What a message's answer shows, as its widgets in order: each as the Textual class it is
    or extends, with its text (a paragraph's, a bullet's, a code block's lines)."""
    out = []
    for node in widget.walk_children():
        if not node.display:
            continue
        kind = next(c.__name__ for c in type(node).__mro__ if c.__module__.startswith("textual."))
        text = ""
        if hasattr(node, "symbol"):
            text = node.symbol
        elif isinstance(node, WrappedCode):
            text = "\n".join(line.plain for line in node.lines)
        elif hasattr(node, "_content") and hasattr(node._content, "plain") and kind != "MarkdownFence":
            text = node._content.plain  # a fence shows its code in its WrappedCode, above
        out.append((kind, text))
    return out


async def test_a_streamed_list_grows_by_its_last_item_and_shows_what_a_whole_render_shows():
    async with Host().run_test(size=(90, 40)) as pilot:
        transcript = pilot.app.query_one(Transcript)
        view = await transcript.add_message(MessageView("assistant", streaming=True))
        await pilot.pause()
        rebuilt: list[int] = []  # rows of the growing lists mounted at each update
        for end in range(23, len(LISTS) + 23, 23):
            rows_before = set(view.query(ItemRow))
            await view.stream_text(LISTS[:end])
            await pilot.pause()
            rebuilt.append(len(set(view.query(ItemRow)) - rows_before))
            whole = await transcript.add_message(MessageView("assistant", LISTS[:end]))
            await pilot.pause()
            assert shape(view.query_one(".answer")) == shape(whole.query_one(".answer")), LISTS[:end]
            await whole.remove()
        # An update mounts the row of an item that began, and at times a few more (a numbered
        # list whose numbers got wider, a nested list), never the whole list again each time.
        assert sum(rebuilt) < 3 * len(list(view.query(ItemRow)))
        assert rebuilt.count(0) > len(rebuilt) // 3
