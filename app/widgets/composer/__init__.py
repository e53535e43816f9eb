"""The message composer (multi-line input with history)."""
