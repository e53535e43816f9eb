"""Modal screens that return typed values: confirm, text prompt, error, pickers."""
