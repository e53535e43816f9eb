"""One line for a stored tool call and what came of it, as words a person can scan: the call
("edit_file app/x.py", or the summary its result keeps), then the facts of its result ("+3 −1",
"exit 1", "48 lines", "2.1 s", "refused: not now").

The facts are plain text with a tone, so that each place that shows them styles them its own
way: the transcript's folded tool block (`app/widgets/transcript/tool_block.py`) with Textual
markup, `velo-chat sessions show` as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from velo_chat.store.models import StoredToolCall, ToolResult

from .output import count

ARGS_WIDTH = 60
"""The arguments' share of the line, and of a refusal's reason."""

NOT_RUN = {"refused", "invalid", "stopped"}
"""Decisions under which the call did not run."""


@dataclass(frozen=True)
class Fact:
    """One fact of a call's line. `tone` "error" marks what went wrong (the word, not its
    `detail`, which is what the user or the model wrote), "warning" what waits on the user,
    "quiet" a state rather than a result."""

    text: str
    tone: Literal["", "error", "warning", "quiet"] = ""
    detail: str = ""

    def plain(self) -> str:
        return f"{self.text}: {self.detail}" if self.detail else self.text


def short_arguments(arguments: Mapping[str, Any], width: int = ARGS_WIDTH) -> str:
    """The arguments in one short line: values only for one argument, `name=value` for
    several; long values cut with an ellipsis."""
    parts = []
    for name, value in arguments.items():
        text = value if isinstance(value, str) else repr(value)
        text = " ".join(text.split())
        parts.append(text if len(arguments) == 1 else f"{name}={text}")
    line = " ".join(parts)
    return line if len(line) <= width else line[: width - 1] + "…"


def diff_counts(diff: str) -> tuple[int, int]:
    """Lines added and removed by a unified diff (its file headers not counted)."""
    added = removed = 0
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def call_head(call: StoredToolCall, result: ToolResult | None, prepared_summary: str = "") -> str:
    """What the call did, in the words its result keeps (`details["summary"]`), else the
    checked call's summary (before a result exists), else its name and arguments."""
    details = result.details if result is not None else {}
    summary = str(details.get("summary") or "") or prepared_summary
    return summary or f"{call.name} {short_arguments(call.arguments)}".rstrip()


def result_facts(call: StoredToolCall, result: ToolResult) -> list[Fact]:
    """What came of a decided call."""
    details = result.details
    if result.decision in NOT_RUN:
        why = result.reason if result.decision == "refused" else call.error or ""
        if result.decision == "invalid" and not why:
            why = result.content.removeprefix("error: ")
        return [Fact(result.decision, "error", " ".join(why.split())[:ARGS_WIDTH])]
    facts: list[Fact] = []
    diff = str(details.get("diff") or "")
    if diff:
        added, removed = diff_counts(diff)
        facts.append(Fact(f"+{added} −{removed}"))
    if "exit_code" in details:
        code = details["exit_code"]
        facts.append(Fact(f"exit {code}", "" if code == 0 else "error"))
    if not diff:
        facts.append(Fact(count(len(result.content.splitlines()), "line")))
    if details.get("truncated"):
        facts.append(Fact("cut"))
    if not result.ok and "exit_code" not in details:
        facts.append(Fact("failed", "error"))
    seconds = details.get("seconds")
    if isinstance(seconds, (int, float)):
        facts.append(Fact(f"{seconds:.1f} s"))
    return facts


def plain_line(call: StoredToolCall, result: ToolResult | None) -> str:
    """The call's line as text (a call with no result was never decided: "not run")."""
    facts = result_facts(call, result) if result is not None else [Fact("not run", "quiet")]
    return " · ".join([call_head(call, result), *(f.plain() for f in facts)])
