"""velo-chat session store: SQLite, plain dataclasses, never imports the engine."""
