"""Measuring: `velo-chat bench` and its sections (threads, load, resume, sessions).

Nothing here is needed to chat; it drives the engine through its public API and reports.
"""
