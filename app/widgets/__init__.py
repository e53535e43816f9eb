"""Widgets grouped by area; each posts messages up and never calls the engine or store."""
