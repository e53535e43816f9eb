"""The tools as the model is told about them: names, descriptions, JSON schemas, and the check of
a call's arguments against them.

The descriptions are the model's only manual, so they say what each tool returns, its limits and
what to do next ("read with start_line"). The argument check is deliberately plain (required,
unknown, JSON types): a mistake becomes one line the model can act on, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from velo_chat.engine import ToolSpec

from .types import ToolKind

READ_TOOLS: Final = ("read_file", "list_files", "search")
"""What `tools.offered = "read-only"` offers and `tools.approve = "read"` runs without asking."""

EDIT_TOOLS: Final = ("edit_file", "write_file")
COMMAND_TOOLS: Final = ("run_command",)
TOOL_NAMES: Final = READ_TOOLS + EDIT_TOOLS + COMMAND_TOOLS

KINDS: Final[Mapping[str, ToolKind]] = {
    **{name: "read" for name in READ_TOOLS},
    **{name: "edit" for name in EDIT_TOOLS},
    **{name: "command" for name in COMMAND_TOOLS},
}

_PATH_NOTE = (
    "relative to the working folder, or absolute (anything outside the folder needs the user's approval)"
)


def _schema(properties: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


SPECS: Final[Mapping[str, ToolSpec]] = {
    "read_file": ToolSpec(
        "read_file",
        "Read a text file. The first line of the result says which lines are shown and how many the "
        "file has; the text follows as it is, without line numbers. Long files are cut, and the cut "
        "says which start_line reads on. Binary files are refused.",
        _schema(
            {
                "path": {"type": "string", "description": f"The file, {_PATH_NOTE}."},
                "start_line": {"type": "integer", "description": "First line to read, 1-based (default 1)."},
                "end_line": {
                    "type": "integer",
                    "description": "Last line to read, inclusive (default: the end of the file).",
                },
            },
            ("path",),
        ),
    ),
    "list_files": ToolSpec(
        "list_files",
        "List files (not folders) under a folder, sorted, as paths relative to the working folder. "
        "In a git repository it lists what git tracks plus untracked files that are not ignored; "
        "elsewhere it skips hidden folders, __pycache__ and node_modules. Long lists are cut.",
        _schema(
            {
                "pattern": {
                    "type": "string",
                    "description": 'A glob on the path below `path`: "**/*" (default) for everything, '
                    '"src/**/*.py"; a pattern without "/" such as "*.py" matches file names at any depth.',
                },
                "path": {"type": "string", "description": f'The folder to list (default "."), {_PATH_NOTE}.'},
            },
            (),
        ),
    ),
    "search": ToolSpec(
        "search",
        'Search file contents for a regular expression (Python syntax; "(?i)" for case-insensitive). '
        'Returns one "path:line: text" per matching line, sorted by path and line, over the same files '
        "list_files lists, skipping binary files. Many matches are cut: narrow the pattern, path or glob.",
        _schema(
            {
                "pattern": {
                    "type": "string",
                    "description": "The regular expression, matched within one line.",
                },
                "path": {
                    "type": "string",
                    "description": f'The folder (or file) to search (default "."), {_PATH_NOTE}.',
                },
                "glob": {
                    "type": "string",
                    "description": 'Only files whose path matches this glob, e.g. "*.py" or "src/**/*.ts".',
                },
            },
            ("pattern",),
        ),
    ),
    "edit_file": ToolSpec(
        "edit_file",
        "Replace one exact piece of text in a file. `old` must match the file's text exactly once, "
        "whitespace and indentation included (copy it from read_file); include enough surrounding "
        "lines to make it unique. The file keeps its line endings and permissions.",
        _schema(
            {
                "path": {"type": "string", "description": f"The file to change, {_PATH_NOTE}."},
                "old": {"type": "string", "description": "The exact text to replace (not empty)."},
                "new": {"type": "string", "description": "The text to put in its place."},
            },
            ("path", "old", "new"),
        ),
    ),
    "write_file": ToolSpec(
        "write_file",
        "Create a file, or replace a whole file's content; missing parent folders are created. "
        "To change part of an existing file, prefer edit_file.",
        _schema(
            {
                "path": {"type": "string", "description": f"The file to write, {_PATH_NOTE}."},
                "content": {"type": "string", "description": "The file's complete new content."},
            },
            ("path", "content"),
        ),
    ),
    "run_command": ToolSpec(
        "run_command",
        "Run a shell command (bash) in the working folder, with no input; returns its output "
        "(stdout and stderr together, long output cut in the middle) and a last line "
        '"exit code N". The command and everything it starts are stopped at the time limit; '
        "processes it leaves running in the background are stopped when it ends.",
        _schema(
            {
                "command": {"type": "string", "description": "The command line, as typed in a terminal."},
                "timeout_s": {
                    "type": "number",
                    "description": "Seconds before it is stopped (the profile's limit is the most).",
                },
            },
            ("command",),
        ),
    ),
}

_JSON_TYPES: Final[Mapping[str, str]] = {"string": "a string", "integer": "an integer", "number": "a number"}


def check_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The arguments with JSON types checked (a null optional argument counts as absent; an
    integral float is an integer), or an error line naming what is wrong: `(checked, "")` or
    `({}, error)`."""
    properties: Mapping[str, Any] = spec.parameters.get("properties", {})
    required = tuple(spec.parameters.get("required", ()))
    if not isinstance(arguments, Mapping):
        return {}, f"{spec.name}: the arguments must be a JSON object"
    unknown = sorted(str(k) for k in arguments if k not in properties)
    if unknown:
        accepted = ", ".join(properties) or "none"
        return {}, f"{spec.name}: unknown argument {', '.join(unknown)} (it takes: {accepted})"
    checked: dict[str, Any] = {}
    for name, schema in properties.items():
        value = arguments.get(name)
        if value is None:
            if name in required:
                return {}, f"{spec.name}: the argument `{name}` is required"
            continue
        typed = _typed(value, schema["type"])
        if typed is None:
            expected = _JSON_TYPES[schema["type"]]
            return {}, f"{spec.name}: `{name}` must be {expected}, not {type(value).__name__} {value!r:.60}"
        checked[name] = typed
    return checked, ""


def _typed(value: object, json_type: str) -> object | None:
    if isinstance(value, bool):
        return None  # JSON true/false is never a string or a number here
    if json_type == "string":
        return value if isinstance(value, str) else None
    if json_type == "integer":
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return None
    if isinstance(value, int | float):
        return float(value)
    return None
