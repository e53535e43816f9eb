"""One message in the transcript: a header line, an optional collapsed reasoning block and the
answer as Markdown, streamed incrementally (CONVENTIONS.md #7).

While streaming, `stream_text(full_so_far)` writes only the new suffix into a `MarkdownStream`
(`Markdown.get_stream`), which batches fragments when rendering falls behind; `finish` stops the
stream and does one final `update(full_text)` so the finished message is parsed exactly once.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownStream


from ... import keymap
from .text import code_blocks, split_thinking

STATUS_LABELS = {"interrupted": "interrupted", "error": "failed"}


class MessageView(Vertical, can_focus=True):
    """Focusable so `c` / `y` (copy) and `t` (reasoning) work without a mouse."""

    BINDINGS = keymap.bindings("message")

    def __init__(self, role: str, text: str = "", *, status: str = "complete",
                 message_id: int | None = None, streaming: bool = False,
                 show_thinking: bool = True) -> None:
        super().__init__(classes=f"message -{role}")
        self.role = role
        self.text = text
        self.status = status
        self.message_id = message_id
        self.show_thinking = show_thinking
        self.streaming = streaming
        self.code_index = 0  # which code block `y` copies next
        self._shown_thinking = ""
        self._shown_answer = ""
        self._stream: MarkdownStream | None = None
        self._thinking_stream: MarkdownStream | None = None

    def compose(self) -> ComposeResult:
        yield Static(self._header(), classes="message-header")
        split = split_thinking(self.text) if self.role == "assistant" else None
        thinking = split.thinking if split else None
        with Collapsible(title="reasoning", collapsed=True, classes="thinking"):
            yield Markdown(thinking or "", classes="thinking-body")
        answer = split.answer if split else self.text
        yield Markdown(answer if not self.streaming else "", classes="answer")

    def on_mount(self) -> None:
        self.set_class(self.streaming, "-streaming")
        self._sync_thinking_visibility(split_thinking(self.text).thinking
                                       if self.role == "assistant" else None)

    def _header(self) -> str:
        who = {"user": "you", "assistant": "assistant"}.get(self.role, self.role)
        label = STATUS_LABELS.get(self.status)
        if self.streaming:
            return f"[b]{who}[/b] · [i]streaming…[/i]"
        return f"[b]{who}[/b]" + (f" · [b $error]{label}[/]" if label else "")

    def _sync_thinking_visibility(self, thinking: str | None) -> None:
        box = self.query_one(".thinking", Collapsible)
        box.display = bool(thinking) and self.show_thinking

    # -- streaming ----------------------------------------------------------------------------

    async def stream_text(self, text: str) -> None:
        """Show the reply so far; writes only what is new since the last call."""
        self.text = text
        split = split_thinking(text)
        if split.thinking is not None:
            if self._thinking_stream is None:
                self._sync_thinking_visibility(split.thinking or " ")
                self._thinking_stream = Markdown.get_stream(
                    self.query_one(".thinking-body", Markdown))
            await self._write(self._thinking_stream, "_shown_thinking", split.thinking)
        if split.answer:
            if self._stream is None:
                self._stream = Markdown.get_stream(self.query_one(".answer", Markdown))
            await self._write(self._stream, "_shown_answer", split.answer)

    async def _write(self, stream: MarkdownStream, attr: str, new: str) -> None:
        shown = getattr(self, attr)
        if new.startswith(shown):
            await stream.write(new[len(shown):])
        setattr(self, attr, new)  # a non-append change is fixed by `finish`'s update

    async def finish(self, text: str, status: str, message_id: int | None = None) -> None:
        """The reply ended (complete, interrupted or failed): one final full render."""
        for stream in (self._thinking_stream, self._stream):
            if stream is not None:
                await stream.stop()
        self._stream = self._thinking_stream = None
        self.text, self.status, self.streaming = text, status, False
        if message_id is not None:
            self.message_id = message_id
        split = split_thinking(text)
        self._sync_thinking_visibility(split.thinking)
        await self.query_one(".thinking-body", Markdown).update(split.thinking or "")
        await self.query_one(".answer", Markdown).update(split.answer)
        self.query_one(".message-header", Static).update(self._header())
        self.set_class(False, "-streaming")
        self.set_class(status in STATUS_LABELS, f"-{status}")

    # -- copy helpers -------------------------------------------------------------------------

    def answer_text(self) -> str:
        return split_thinking(self.text).answer if self.role == "assistant" else self.text

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
