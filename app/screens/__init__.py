"""Full screens of the TUI, one per file: chat, settings, help."""
