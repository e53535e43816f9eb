"""Tools the model calls in a turn, acting in the session's working folder: reading, listing and
searching files, editing and writing them, running commands (docs/tools.md).

`ToolBox` offers the tools, checks a call into a `PreparedCall` and runs it into a `ToolOutcome`;
`ApprovalPolicy` says which prepared calls run without asking. No UI and no store: the loop asks
the user and records the undo data.
"""

from .approval import ApprovalPolicy, parse_approve
from .specs import EDIT_TOOLS, READ_TOOLS, SPECS, TOOL_NAMES
from .toolbox import ToolBox, parse_offered
from .types import ApprovalAnswer, Decision, PreparedCall, ToolKind, ToolOutcome
from .workspace import PathError, ResolvedPath, Workspace

__all__ = [
    "EDIT_TOOLS",
    "READ_TOOLS",
    "SPECS",
    "TOOL_NAMES",
    "ApprovalAnswer",
    "ApprovalPolicy",
    "Decision",
    "PathError",
    "PreparedCall",
    "ResolvedPath",
    "ToolBox",
    "ToolKind",
    "ToolOutcome",
    "Workspace",
    "parse_approve",
    "parse_offered",
]
