"""Every key-bound action in one catalogue: the bindings, the help screen and the command palette
all read it, so a key is documented and reachable from the palette by construction.

Each entry has a stable binding id (`session.new`); the user's `keymap` table in settings.toml
maps ids to other keys and the app applies it with `App.set_keymap`.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType


@dataclass(frozen=True)
class KeyAction:
    id: str
    key: str
    action: str  # a Textual action string, run on the widget that holds the binding
    description: str
    scope: str  # "app", "chat", "sessions", "message", "approval", "composer", "queue", "chips", "settings"
    show: bool = True  # in the footer
    priority: bool = False
    palette_action: str | None = None  # screen-level action the palette runs (None: `action`)


ACTIONS: tuple[KeyAction, ...] = (
    KeyAction("app.quit", "ctrl+q", "quit", "Quit", "app", priority=True),
    KeyAction("app.help", "f1", "help", "Help: every key", "app"),
    KeyAction("app.settings", "f2", "settings", "Settings: profiles", "app"),
    KeyAction("chat.cancel", "escape", "cancel_turn", "Stop the reply", "chat"),
    KeyAction("chat.toggle_sidebar", "ctrl+b", "toggle_sidebar", "Sessions sidebar", "chat"),
    KeyAction("chat.toggle_panel", "ctrl+t", "toggle_panel", "Live panel", "chat"),
    KeyAction("chat.focus_input", "ctrl+l", "focus_input", "Focus the input", "chat", show=False),
    KeyAction(
        "chat.focus_filter", "ctrl+f", "focus_filter", "Filter sessions", "chat", show=False, priority=True
    ),
    KeyAction("session.new", "ctrl+n", "new_session", "New session", "chat"),
    KeyAction(
        "chat.regenerate",
        "ctrl+r",
        "regenerate",
        "Answer the last question again (in a fork)",
        "chat",
        show=False,
    ),
    KeyAction("chat.send_queue", "ctrl+s", "send_queue", "Send the queued messages", "chat", show=False),
    KeyAction(
        "chat.toggle_thinking",
        "ctrl+g",
        "toggle_thinking",
        "Thinking on/off for the next turns",
        "chat",
        show=False,
    ),
    KeyAction(
        "session.switch_profile",
        "ctrl+o",
        "switch_profile",
        "Switch this session's profile",
        "chat",
        show=False,
    ),
    KeyAction(
        "session.rename",
        "r",
        "screen.rename_session",
        "Rename session",
        "sessions",
        palette_action="rename_session",
    ),
    KeyAction(
        "session.delete",
        "d,delete",
        "screen.delete_session",
        "Delete session",
        "sessions",
        palette_action="delete_session",
    ),
    KeyAction(
        "session.fork", "f", "screen.fork_session", "Fork session", "sessions", palette_action="fork_session"
    ),
    KeyAction(
        "session.export",
        "e",
        "screen.export_session",
        "Export session (Markdown)",
        "sessions",
        palette_action="export_session",
    ),
    KeyAction(
        "message.copy",
        "c",
        "screen.copy_message",
        "Copy the message",
        "message",
        palette_action="copy_message",
    ),
    KeyAction(
        "message.copy_code",
        "y",
        "screen.copy_code",
        "Copy a code block (again: next)",
        "message",
        palette_action="copy_code",
    ),
    KeyAction(
        "message.toggle_thinking",
        "t",
        "toggle_thinking",
        "Show/hide reasoning",
        "message",
        palette_action=None,
    ),
    KeyAction(
        "message.toggle_files", "o", "toggle_files", "Show/hide attached files and tool calls", "message"
    ),
    KeyAction(
        "message.revise",
        "e",
        "screen.revise_message",
        "Revise this message of yours (sent in a fork)",
        "message",
        palette_action="revise_message",
    ),
    KeyAction(
        "message.regenerate",
        "r",
        "screen.regenerate_message",
        "Answer this again (in a fork)",
        "message",
        palette_action="regenerate_message",
    ),
    KeyAction("approval.allow", "y", "allow", "Allow the tool call, once", "approval"),
    KeyAction("approval.allow_session", "a", "allow_session", "Allow this tool for the session", "approval"),
    KeyAction("approval.refuse", "n", "refuse", "Refuse it (a reason may follow; Enter sends)", "approval"),
    KeyAction("approval.stop", "escape", "stop", "Stop the tool loop (the turn ends)", "approval"),
    KeyAction("queue.edit", "e,enter", "edit", "Edit the queued message", "queue"),
    KeyAction("queue.remove", "d,delete", "remove", "Remove the queued message", "queue"),
    KeyAction("chips.remove", "delete,backspace", "remove", "Detach the file", "chips"),
    KeyAction("chips.previous", "left", "previous_chip", "Previous attached file", "chips", show=False),
    KeyAction("chips.next", "right", "next_chip", "Next attached file", "chips", show=False),
    KeyAction("composer.send", "enter", "submit", "Send", "composer", priority=True),
    KeyAction("composer.newline", "ctrl+j,alt+enter,shift+enter", "newline", "New line", "composer"),
    KeyAction("settings.save", "ctrl+s", "save", "Save profile", "settings", priority=True),
    KeyAction("settings.save_as", "f3", "save_as", "Save as new profile", "settings"),
    KeyAction("settings.revert", "f4", "revert", "Revert edits", "settings"),
    KeyAction("settings.diff", "f5", "diff", "Diff vs shipped", "settings"),
    KeyAction("settings.activate", "f6", "activate", "Activate profile", "settings"),
    KeyAction("settings.close", "escape", "close", "Back to chat", "settings"),
)

BY_ID = {a.id: a for a in ACTIONS}
SCOPE_TITLES = {
    "app": "Anywhere",
    "chat": "Chat screen",
    "sessions": "Session list (focused)",
    "message": "A message (focused)",
    "approval": "A tool call asking for approval (dialog)",
    "composer": "Input",
    "queue": "A queued message (focused)",
    "chips": "An attached file (focused)",
    "settings": "Settings screen",
}


def bindings(scope: str) -> list[BindingType]:
    """The Textual bindings of one scope, with ids so a keymap can rebind them."""
    return [
        Binding(a.key, a.action, a.description, show=a.show, priority=a.priority, id=a.id)
        for a in ACTIONS
        if a.scope == scope
    ]


def effective_key(action: KeyAction, keymap: dict[str, str]) -> str:
    """The key(s) an action is on once the user's keymap is applied."""
    return keymap.get(action.id, action.key)


def key_label(keys: str) -> str:
    """How a hint names a binding's first key: "ctrl+s" -> "Ctrl+S", "escape" -> "Esc"."""
    first = keys.split(",")[0].strip()
    names = {"escape": "Esc", "enter": "Enter", "delete": "Delete", "backspace": "Backspace"}
    return "+".join(
        names.get(part, part.capitalize() if len(part) > 1 else part.upper()) for part in first.split("+")
    )
