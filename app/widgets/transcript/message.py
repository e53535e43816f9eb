"""One message in the transcript: a header line, an optional collapsed reasoning block and the
answer as Markdown, streamed incrementally.

A reply's reasoning and answer arrive apart (the engine splits them, the store keeps them apart).
While streaming, `stream_text(answer_so_far, reasoning_so_far)` appends only the new suffix of
each (`Markdown.append`, which parses again from the last block only), and `finish` does one
final `update` of each, so the finished message is parsed whole exactly once. The appends are
awaited inside one `batch_update` with the room held below the reply (`_reserve`): the new text
and the room land in one layout of the screen. (A `MarkdownStream`, which appends in a task of
its own, let a frame fall between the two: two layouts of the whole screen for one update, each
taken from the decode on a small machine. It also batches fragments when rendering falls behind,
which the pacer does here already: `app/stream_pacer.py`, and `TokensStreamed.can_replace`.)

A user message's attached files show above its text, each folded into one line (`files.py`); a
reply's tool calls show below its text, each folded into one line too (`tool_block.py`), and a
reply that is only calls shows only them; `o` opens and folds either. Code blocks wrap at the
transcript's width (`code.py`), and a message that shows code tells the screen
(`CodeWidthChanged`), which makes room for it (`panes.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Collapsible, Markdown, Static

from velo_chat.store.models import Message as StoredMessage
from velo_chat.store.models import StoredToolCall, ToolResult

from ... import keymap
from .code import CodeWrappingMarkdown
from .files import AttachedFile, FileBlock
from .one_layout import OneLayout
from .tool_block import Pending, ToolBlock
from .text import code_blocks, widest_code_line

STATUS_LABELS = {"interrupted": "interrupted", "error": "failed"}


class CodeWidthChanged(Message):
    """Code was shown in the transcript (a reply finished, a session opened): the screen may
    have to make room for its widest line."""


VIEW_START_TEXT = "── the model's view begins here (older messages left its view) ──"


class ViewStartMarker(Static):
    """The line before the first message the model still sees, once the oldest turns left its
    view to make room (`context.when_full = "drop_oldest"`, docs/compaction.md): the messages
    above it stay stored and shown, but the model no longer reads them."""

    def __init__(self) -> None:
        super().__init__(VIEW_START_TEXT, classes="view-start")


class MessageView(OneLayout, Vertical, can_focus=True):
    """Focusable so `c` / `y` (copy), `t` (reasoning) and `o` (files) work without a mouse."""

    BINDINGS = keymap.bindings("message")
    MIN_ROOM = 4  # no room is held in a terminal shorter than three times this

    def __init__(
        self,
        role: str,
        text: str = "",
        *,
        reasoning: str = "",
        status: str = "complete",
        message_id: int | None = None,
        streaming: bool = False,
        show_thinking: bool = True,
        attachments: Sequence[AttachedFile] = (),
        tool_calls: Sequence[StoredToolCall] = (),
        tool_results: Sequence[ToolResult] = (),
    ) -> None:
        super().__init__(classes=f"message -{role}")
        self.role = role
        self.text = text  # the answer (a user message: its text)
        self.reasoning = reasoning
        self.status = status
        self.message_id = message_id
        self.show_thinking = show_thinking
        self.streaming = streaming
        self.attachments = tuple(attachments)
        self.tool_calls = tuple(tool_calls)
        self.tool_results = tuple(tool_results)
        self._code_width: tuple[str, int] = ("", 0)  # the text it was measured on, and its width
        self.code_index = 0  # which code block `y` copies next
        self._shown_thinking = ""
        self._shown_answer = ""
        self._reserved = 0  # while streaming: the height held for the reply (0: none)
        self._used = 0  # the height its text took at the last update

    def compose(self) -> ComposeResult:
        yield Static(self._header(), classes="message-header")
        for file in self.attachments:
            yield FileBlock(file)
        with Collapsible(title="reasoning", collapsed=True, classes="thinking"):
            yield CodeWrappingMarkdown(self.reasoning if not self.streaming else "", classes="thinking-body")
        yield CodeWrappingMarkdown(self.text if not self.streaming else "", classes="answer")
        results = _by_index(self.tool_results)
        for i, call in enumerate(self.tool_calls):
            yield ToolBlock(call, results.get(i))

    def on_mount(self) -> None:
        self.set_class(self.streaming, "-streaming")
        if self.streaming:  # the room is there before the first token: it does not scroll
            self._reserve()
        self._sync_thinking_visibility(self.reasoning)
        self._sync_answer_visibility()

    def _sync_answer_visibility(self) -> None:
        """A reply that is only tool calls shows only their blocks."""
        self.query_one(".answer", Markdown).display = bool(self.text) or self.streaming or not self.tool_calls

    def _header(self) -> str:
        who = {"user": "you", "assistant": "assistant"}.get(self.role, self.role)
        label = STATUS_LABELS.get(self.status)
        if self.streaming:
            return f"[b]{who}[/b] · [i]streaming…[/i]"
        return f"[b]{who}[/b]" + (f" · [b $error]{label}[/]" if label else "")

    def set_show_thinking(self, show: bool) -> None:
        self.show_thinking = show
        if self.is_mounted:
            self._sync_thinking_visibility(self.reasoning)

    def _sync_thinking_visibility(self, thinking: str) -> None:
        box = self.query_one(".thinking", Collapsible)
        box.display = bool(thinking) and self.show_thinking

    # -- streaming ----------------------------------------------------------------------------

    async def stream_text(self, text: str, reasoning: str = "") -> None:
        """Show the reply so far (answer and reasoning); appends only what is new since the
        last call, in one layout with the room it holds."""
        shown_reasoning = self._shown_thinking
        self.text, self.reasoning = text, reasoning
        with self.app.batch_update():
            self._reserve()
            if reasoning:
                if not shown_reasoning:
                    self._sync_thinking_visibility(reasoning)
                await self._append(".thinking-body", "_shown_thinking", reasoning)
            if text:
                await self._append(".answer", "_shown_answer", text)

    def _reserve(self) -> None:
        """Hold room below the streaming reply (a minimum height) so that most updates grow
        it inside that room: the transcript's height then stays the same, it does not scroll,
        and only the new lines are drawn. When what is left of the room would not take another
        update like the last one (or a quarter of the room), it is renewed, and the transcript
        scrolls once (the view moves by the room).

        The room is a third of the terminal's height, not a share of the transcript's: the
        transcript's height changes with the composer's (tall with the message just sent, it
        shrinks in the layout that mounts this reply), and a room measured in between would
        depend on which came first."""
        room = self.app.size.height // 3
        if room < self.MIN_ROOM:
            return
        used = sum(child.outer_size.height for child in self.children if child.display)
        used += self.styles.gutter.height
        grown, self._used = used - self._used, used
        if self._reserved and used + max(room // 4, grown) <= self._reserved:
            return
        self._reserved = used + room
        self.styles.min_height = self._reserved

    async def _append(self, selector: str, attr: str, new: str) -> None:
        shown = getattr(self, attr)
        if new.startswith(shown) and len(new) > len(shown):
            await self.query_one(selector, Markdown).append(new[len(shown) :])
        setattr(self, attr, new)  # a non-append change is fixed by `finish`'s update

    async def finish(
        self, text: str, status: str, message_id: int | None = None, reasoning: str = ""
    ) -> None:
        """The reply ended (complete, interrupted or failed): one final full render."""
        if self._reserved:
            self._reserved = self._used = 0
            self.styles.min_height = None
        self.text, self.reasoning, self.status, self.streaming = text, reasoning, status, False
        if message_id is not None:
            self.message_id = message_id
        self._sync_thinking_visibility(reasoning)
        await self.query_one(".thinking-body", Markdown).update(reasoning)
        await self.query_one(".answer", Markdown).update(text)
        self.query_one(".message-header", Static).update(self._header())
        self.set_class(False, "-streaming")
        for label in STATUS_LABELS:
            self.set_class(status == label, f"-{label}")
        self._sync_answer_visibility()
        if self.code_width():
            self.post_message(CodeWidthChanged())

    # -- tool calls ---------------------------------------------------------------------------

    async def show_tools(
        self,
        calls: Sequence[StoredToolCall],
        results: Sequence[ToolResult],
        pending: Mapping[int, Pending] | None = None,
    ) -> None:
        """Show the reply's calls with their results so far (`pending`: by call index, the
        calls of the running step that wait for approval or run). Blocks already shown are
        updated in place, so one the user opened stays open."""
        self.tool_calls, self.tool_results = tuple(calls), tuple(results)
        by_index = _by_index(results)
        pending = pending or {}
        blocks = list(self.query_children(ToolBlock))
        for i, call in enumerate(self.tool_calls):
            if i < len(blocks):
                await blocks[i].show(call, by_index.get(i), pending.get(i))
            else:
                await self.mount(ToolBlock(call, by_index.get(i), pending.get(i)))
        for block in blocks[len(self.tool_calls) :]:
            await block.remove()
        self._sync_answer_visibility()

    async def show_step(self, reply: StoredMessage, pending: Mapping[int, Pending] | None = None) -> None:
        """A tool step's reply as stored (its text without the calls, the calls, the results so
        far): the stream, if it still runs, ends with that text."""
        if self.streaming or self.text != reply.content:
            status = "error" if reply.status == "error" else "complete"
            await self.finish(reply.content, status, reply.id, reply.reasoning or self.reasoning)
        await self.show_tools(reply.tool_calls, reply.tool_results, pending)

    def code_width(self) -> int:
        """The widest line of code in the text, in cells (0: no code); the reasoning's code is
        left out, it is folded by default. Measured once per text: the screen asks for every
        message each time it fits the panes."""
        if self._code_width[0] != self.text:
            self._code_width = (self.text, widest_code_line(self.text))
        return self._code_width[1]

    # -- copy helpers -------------------------------------------------------------------------

    def answer_text(self) -> str:
        return self.text

    def next_code_block(self) -> tuple[str, int, int] | None:
        """The next code block to copy (cycling), its 1-based number and the count."""
        blocks = code_blocks(self.answer_text())
        if not blocks:
            return None
        i = self.code_index % len(blocks)
        self.code_index = i + 1
        return blocks[i], i + 1, len(blocks)

    def action_toggle_thinking(self) -> None:
        box = self.query_one(".thinking", Collapsible)
        box.collapsed = not box.collapsed

    def action_toggle_files(self) -> None:
        """Open every attached file and tool call, or fold them all when all are open."""
        blocks: list[Collapsible] = [*self.query_children(FileBlock), *self.query_children(ToolBlock)]
        if not blocks:
            self.notify("This message has no attached files.", severity="warning", timeout=3)
            return
        fold = all(not block.collapsed for block in blocks)
        for block in blocks:
            block.collapsed = fold


def _by_index(results: Sequence[ToolResult]) -> dict[int, ToolResult]:
    return {r.call_index: r for r in results}
