"""The transcript: streamed Markdown messages, thinking blocks, copy helpers."""
