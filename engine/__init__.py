"""velo-chat engine."""
