"""Which tool calls run without asking (app/tools/approval.py): `tools.approve`, `--yes`, tools
allowed for the session, and the rule that anything outside the working folder asks."""

from __future__ import annotations

import pytest

from velo_chat.app.tools import TOOL_NAMES, ApprovalPolicy, PreparedCall
from velo_chat.app.tools.specs import KINDS
from velo_chat.engine import ToolCall
from velo_chat.engine.config import ToolSettings


def prepared(tool: str, *, outside: bool = False, error: str = "") -> PreparedCall:
    return PreparedCall(ToolCall(tool, {}), KINDS[tool], tool, outside=outside, error=error)


def policy(approve: str, assume_yes: bool = False) -> ApprovalPolicy:
    return ApprovalPolicy(ToolSettings(approve=approve), assume_yes=assume_yes)


def automatic_tools(approve: str, assume_yes: bool = False) -> list[str]:
    chosen = policy(approve, assume_yes)
    return [tool for tool in TOOL_NAMES if chosen.automatic(prepared(tool)) == "auto"]


@pytest.mark.parametrize(
    ("approve", "assume_yes", "expected"),
    [
        ("read", False, ["read_file", "list_files", "search"]),
        ("read,edit", False, ["read_file", "list_files", "search", "edit_file", "write_file"]),
        ("all", False, list(TOOL_NAMES)),
        ("none", False, []),
        ("search, run_command", False, ["search", "run_command"]),
        ("command", False, ["run_command"]),
        ("read", True, list(TOOL_NAMES)),
        ("none", True, list(TOOL_NAMES)),
    ],
)
def test_what_runs_without_asking(approve: str, assume_yes: bool, expected: list[str]) -> None:
    assert automatic_tools(approve, assume_yes) == expected


def test_the_default_asks_for_edits_and_commands() -> None:
    default = ApprovalPolicy(ToolSettings())
    assert [default.automatic(prepared(tool)) for tool in TOOL_NAMES] == ["auto"] * 3 + [None] * 3


@pytest.mark.parametrize("assume_yes", [False, True])
@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_outside_the_working_folder_always_asks(tool: str, assume_yes: bool) -> None:
    chosen = policy("all", assume_yes)
    chosen.allow_for_session(tool)
    assert chosen.automatic(prepared(tool, outside=True)) is None


def test_a_tool_allowed_for_the_session_runs_without_asking_except_outside() -> None:
    chosen = policy("read")
    assert chosen.automatic(prepared("edit_file")) is None
    chosen.allow_for_session("edit_file")
    assert chosen.automatic(prepared("edit_file")) == "allowed_session"
    assert chosen.automatic(prepared("write_file")) is None  # only the tool that was allowed
    assert chosen.automatic(prepared("edit_file", outside=True)) is None
    assert chosen.allowed_for_session == frozenset({"edit_file"})


def test_a_call_that_cannot_run_needs_nobody() -> None:
    assert policy("none").automatic(prepared("run_command", error="the command is empty")) == "invalid"


@pytest.mark.parametrize(
    ("approve", "named"),
    [("read,delete", "'delete'"), ("none,read", '"none" with other words'), ("read,", "an empty word")],
)
def test_a_bad_setting_is_one_line_naming_it(approve: str, named: str) -> None:
    with pytest.raises(ValueError) as raised:
        policy(approve)
    message = str(raised.value)
    assert message.startswith(f"tools.approve: cannot use {named};") and "\n" not in message
    assert "read_file" in message
