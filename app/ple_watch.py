"""The PLE table's page-cache residency, for the live panel: which byte range of which shard
holds the table (read once from the model's headers), and how much of it is in memory now."""

from __future__ import annotations

import logging
from pathlib import Path

from velo_chat.engine.fit import read_facts, resident

log = logging.getLogger(__name__)


class PleWatch:
    """`fraction()`: the share of the model's PLE table in the page cache, or None when the
    model has none (or its files cannot be read). Call it off the UI thread: the first call
    reads the headers, and each call maps the table's range and asks the kernel (mincore)."""

    def __init__(self, model_path: Path) -> None:
        self.model_path = Path(model_path)
        self._range: tuple[Path, int, int] | None = None
        self._resolved = False

    def fraction(self) -> float | None:
        if not self._resolved:
            self._resolved = True
            try:
                facts = read_facts(self.model_path)
            except (OSError, ValueError) as exc:  # GGUFError is a ValueError
                log.debug("no PLE residency for %s: %s", self.model_path, exc)
                return None
            if facts.ple_bytes and facts.ple_shard is not None:
                self._range = (facts.ple_shard, facts.ple_offset, facts.ple_bytes)
        if self._range is None:
            return None
        try:
            return resident(*self._range).fraction
        except OSError as exc:
            log.warning("PLE residency check failed: %s", exc)
            return None
