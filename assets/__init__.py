"""velo-chat assets."""
