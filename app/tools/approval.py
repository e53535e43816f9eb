"""Which calls run without asking: the profile's `tools.approve`, `--yes`, and the tools a person
allowed for the rest of the session.

The rule that no setting overrides: a call that touches anything outside the working folder
always asks, whatever `tools.approve` says, whatever was allowed for the session, and even under
`--yes` (a script's blanket yes was given for the project, not for the user's home).
"""

from __future__ import annotations

from typing import Final

from velo_chat.engine.config import ToolSettings

from .specs import KINDS, TOOL_NAMES
from .types import Decision, PreparedCall

KIND_WORDS: Final = ("read", "edit", "command")
"""Words of `tools.approve` that name every tool of a kind."""


def parse_approve(value: str) -> frozenset[str]:
    """The tool names `tools.approve` lets run without asking. Raises ValueError, one line
    naming the setting, for a word it does not know."""
    tokens = [t.strip() for t in value.split(",")]
    if tokens == ["none"]:
        return frozenset()
    names: set[str] = set()
    for token in tokens:
        if token == "all":
            names.update(TOOL_NAMES)
        elif token in KIND_WORDS:
            names.update(name for name, kind in KINDS.items() if kind == token)
        elif token in TOOL_NAMES:
            names.add(token)
        else:
            what = (
                '"none" with other words' if token == "none" else (f"{token!r}" if token else "an empty word")
            )
            raise ValueError(
                f'tools.approve: cannot use {what}; use "read", "read,edit", "all", "none" or tool names: '
                f"{', '.join(TOOL_NAMES)}"
            )
    return frozenset(names)


class ApprovalPolicy:
    """Decides, for a prepared call, whether it runs without asking; a person answers the rest."""

    def __init__(self, settings: ToolSettings, *, assume_yes: bool = False) -> None:
        self.automatic_tools = parse_approve(settings.approve)
        self.assume_yes = assume_yes
        self._session: set[str] = set()

    def allow_for_session(self, tool: str) -> None:
        """The user said "allow for this session" to a call of `tool`: its later calls run
        without asking (except outside the working folder)."""
        self._session.add(tool)

    @property
    def allowed_for_session(self) -> frozenset[str]:
        return frozenset(self._session)

    def automatic(self, prepared: PreparedCall) -> Decision | None:
        """The decision taken without asking, or None when a person must answer.

        "invalid" for a call that cannot run (nobody needs to approve it: the model is told its
        error); None for anything outside the working folder; "auto" for what `tools.approve`
        covers or `--yes` answered; "allowed_session" for a tool the user allowed earlier in the
        session (recorded as theirs, so an export shows who allowed it)."""
        if prepared.error:
            return "invalid"
        if prepared.outside:
            return None
        tool = prepared.call.name
        if tool in self.automatic_tools:
            return "auto"
        if tool in self._session:
            return "allowed_session"
        if self.assume_yes:
            return "auto"
        return None
