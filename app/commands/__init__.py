"""The CLI commands, one module each (parsed in `app/cli.py`)."""
