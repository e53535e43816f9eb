"""Exact n-gram speculation: drafts from text already in the session, verified in one batch.

`draft` finds what followed the current n-gram last time, `cost` decides whether a draft of a
given length pays on this backend, `stepper` runs the decode steps that verify drafts, and
`measure` holds the instruments `velo-chat bench --spec` uses.
"""
