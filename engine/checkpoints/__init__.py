"""Prefix checkpoints: where a turn resumes from and what it saves for the next one.

`manager` picks the best saved state for a turn and saves new ones, `tiers` holds them in RAM
and on disk under byte budgets, `file_format` is the verified on-disk format, and `save_points`
says at which token positions a turn's prefill saves.
"""
