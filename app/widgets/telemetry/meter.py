"""Decode speed over a running reply, from token timestamps only (no timers, no wall clock).

The generation worker reports (tokens so far, time of the first and the latest token); messages
coalesce, so updates arrive at whatever rate the UI keeps up with. Every `interval` seconds of
token time the meter closes a window and records its rate: that is the sparkline, sampled a few
times a second, and identical for identical input (snapshot tests rely on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DecodeMeter:
    interval: float = 0.25
    history: int = 120
    samples: list[float] = field(default_factory=list)
    n_tokens: int = 0
    t_first: float | None = None
    t_last: float | None = None
    _win_t: float | None = None
    _win_n: int = 0

    def reset(self) -> None:
        self.samples.clear()
        self.n_tokens, self.t_first, self.t_last, self._win_t, self._win_n = 0, None, None, None, 0

    def update(self, n_tokens: int, t_first: float, t_last: float) -> None:
        if self._win_t is None:
            self._win_t, self._win_n = t_first, 1
        self.n_tokens, self.t_first, self.t_last = n_tokens, t_first, t_last
        span = t_last - self._win_t
        if span >= self.interval:
            self.samples.append((n_tokens - self._win_n) / span)
            del self.samples[: -self.history]
            self._win_t, self._win_n = t_last, n_tokens

    @property
    def average(self) -> float:
        """Tokens after the first over the time since it: the engine's decode_tok_s."""
        if self.t_first is None or self.t_last is None or self.t_last <= self.t_first:
            return 0.0
        return (self.n_tokens - 1) / (self.t_last - self.t_first)

    @property
    def current(self) -> float:
        return self.samples[-1] if self.samples else self.average

    @property
    def peak(self) -> float:
        return max(self.samples, default=self.average)
