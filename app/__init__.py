"""velo-chat app."""
