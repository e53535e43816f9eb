"""A reply's tool calls in the transcript: one folded line per call, the work behind it on `o`.

A step of a tool loop is a reply whose calls follow its text. Each call is a `ToolBlock`, folded
into one line a person can scan ("▸ edit_file app/x.py · +3 −1 · 0.2 s", "▸ run_command `pytest
-q` · exit 1 · 48 lines · 2.1 s", "▸ write_file notes.md · refused: not now") so a long loop reads
as a list of what was done; opening it shows the evidence: an edit's diff coloured, a command's
line and folder with its output folded under its exit code, a read's result (capped: the model
got it whole, the transcript only needs to show what it was). While a call waits for the
user's approval or runs, its line says so.

The body is built the first time the block opens (as attached files are, `files.py`): a session
with hundreds of calls costs nothing for the ones never opened. What a block shows comes from the
stored call and its result (`StoredToolCall`, `ToolResult.details`); before the result exists, the
checked call (`PreparedCall`) gives the diff or the command that is being asked about.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.content import Content
from textual.markup import escape
from textual.widgets import Collapsible, Static

from velo_chat.store.models import StoredToolCall, ToolResult

from ...tools.call_line import NOT_RUN, Fact, call_head, result_facts
from ...tools.output import count
from ...tools.types import PreparedCall

READ_CAP_LINES = 40  # a read's result shown in the transcript (the model got all of it)
OUTPUT_CAP_LINES = 200  # a command's output shown when its fold opens
CAP_CHARS = 20_000


@dataclass(frozen=True)
class Pending:
    """A call of the running step with no result yet: waiting for the user's approval, or
    running. `prepared` is the checked call when the screen has it (its diff or command shows
    in the opened block before the result does)."""

    waiting: bool
    prepared: PreparedCall | None = None


def diff_content(diff: str) -> Content:
    """A unified diff coloured by line: additions green, removals red, hunk headers accented,
    file headers bold. The text is shown as it is (no markup is read in it)."""
    rows: list[Content] = []
    for line in diff.rstrip("\n").split("\n"):
        if line.startswith(("+++", "---")):
            style = "bold"
        elif line.startswith("+"):
            style = "$text-success"
        elif line.startswith("-"):
            style = "$text-error"
        elif line.startswith("@@"):
            style = "$text-accent"
        else:
            style = ""
        rows.append(Content.styled(line, style) if style else Content(line))
    return Content("\n").join(rows)


def capped(text: str, max_lines: int, max_chars: int = CAP_CHARS) -> str:
    """`text` cut to its first `max_lines` lines and `max_chars` characters, saying how much
    was left out."""
    lines = text.splitlines()
    shown = "\n".join(lines[:max_lines])
    cut = len(shown) > max_chars
    shown = shown[:max_chars]
    left = len(lines) - max_lines
    if left > 0:
        shown += f"\n… {left:,} more line{'' if left == 1 else 's'}"
    elif cut:
        shown += f"\n… {len(text) - max_chars:,} more characters"
    return shown


def _markup(fact: Fact) -> str:
    text = escape(fact.text)
    if fact.tone in ("error", "warning"):
        text = f"[b ${fact.tone}]{text}[/]"
    elif fact.tone == "quiet":
        text = f"[i]{text}[/i]"
    return text + (f": {escape(fact.detail)}" if fact.detail else "")


def tool_title(call: StoredToolCall, result: ToolResult | None, pending: Pending | None = None) -> str:
    """The folded line (Content markup; what the model or a file wrote is escaped): the call,
    then what came of it (`call_line.py`), or that it waits or runs."""
    prepared = pending.prepared.summary if pending is not None and pending.prepared is not None else ""
    head = call_head(call, result, prepared)
    if result is not None:
        facts = result_facts(call, result)
    elif pending is None:
        facts = [Fact("not run", "quiet")]
    elif pending.waiting:
        facts = [Fact("waiting for your approval", "warning")]
    else:
        facts = [Fact("running…", "quiet")]
    return " · ".join([escape(head), *map(_markup, facts)])


class ToolBlock(Collapsible):
    """One call of a reply: its line while folded, the diff, output or result once opened."""

    def __init__(
        self, call: StoredToolCall, result: ToolResult | None, pending: Pending | None = None
    ) -> None:
        super().__init__(
            title=tool_title(call, result, pending),
            collapsed=True,
            collapsed_symbol="▸",
            expanded_symbol="▾",
            classes="tool-block",
        )
        self.call, self.result, self.pending = call, result, pending
        self._set_state_classes()

    async def show(self, call: StoredToolCall, result: ToolResult | None, pending: Pending | None) -> None:
        """The call's newer state (its result came, it runs now): the line, and the body if open."""
        if (call, result, pending) == (self.call, self.result, self.pending):
            return
        self.call, self.result, self.pending = call, result, pending
        self.title = tool_title(call, result, pending)
        self._set_state_classes()
        if self.is_mounted:
            contents = self.query_children(Collapsible.Contents).first()
            await contents.remove_children()
            if not self.collapsed:
                await contents.mount_all(self._body())

    def _set_state_classes(self) -> None:
        decision = self.result.decision if self.result is not None else ""
        self.set_class(self.result is None and self.pending is not None and self.pending.waiting, "-waiting")
        self.set_class(
            self.result is None and self.pending is not None and not self.pending.waiting, "-running"
        )
        self.set_class(decision in NOT_RUN or (self.result is not None and not self.result.ok), "-failed")

    def watch_collapsed(self, collapsed: bool) -> None:
        """The first time the block opens, its body is put in it."""
        if not collapsed and self.is_mounted:
            contents = self.query_children(Collapsible.Contents).first()
            if not contents.children:
                contents.mount_all(self._body())

    # -- the body -----------------------------------------------------------------------------

    def _facts(self) -> dict[str, Any]:
        """The diff, command and folder: from the result, else from the call being asked about."""
        if self.result is not None:
            return dict(self.result.details)
        prepared = self.pending.prepared if self.pending is not None else None
        if prepared is None:
            return {}
        return {"diff": prepared.diff, "command": prepared.command, "cwd": prepared.cwd}

    def _body(self) -> list[Static | Collapsible]:
        facts = self._facts()
        parts: list[Static | Collapsible] = []
        result = self.result
        if result is not None and result.decision in NOT_RUN:
            told = f"Not run ({result.decision})."
            if result.reason:
                told += f" Your reason: {result.reason}"
            parts.append(Static(Content(told), classes="tool-note"))
        diff = str(facts.get("diff") or "")
        command = str(facts.get("command") or "")
        if command:
            line = Content.styled("$ ", "bold") + Content(command)
            parts.append(Static(line, classes="tool-command"))
            if facts.get("cwd"):
                parts.append(Static(Content(f"in {facts['cwd']}"), classes="tool-cwd"))
        if diff:
            parts.append(Static(diff_content(diff), classes="tool-diff"))
        if result is None:
            return parts or [Static(Content(self.call.text or self.call.name), classes="tool-note")]
        if command and result.decision not in NOT_RUN:
            parts.append(self._output(result))
        elif not diff or not result.ok:
            limit = READ_CAP_LINES if result.ok else OUTPUT_CAP_LINES
            parts.append(Static(Content(capped(result.content, limit)), classes="tool-result"))
        return parts

    def _output(self, result: ToolResult) -> Collapsible:
        """A command's output, folded under its exit code."""
        code = result.details.get("exit_code")
        n = len(result.content.splitlines())
        title = " · ".join(
            p
            for p in (
                "output",
                f"exit {code}" if code is not None else "",
                count(n, "line"),
                "cut" if result.details.get("truncated") else "",
            )
            if p
        )
        body = Static(Content(capped(result.content, OUTPUT_CAP_LINES)), classes="tool-output")
        return Collapsible(
            body,
            title=title,
            collapsed=True,
            collapsed_symbol="▸",
            expanded_symbol="▾",
            classes="tool-output-fold",
        )
