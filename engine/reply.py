"""A reply as it streams: the one place its text, token counts and times add up.

The in-process turn (`turn_runner.py`) and the remote engine each record every `TokenDelta`
they yield, and the text that never went out in one (what the reasoning splitter held back
until the end), and build their `TurnDone` or `TurnFailed` from it. A caller that iterates a
turn's events feeds it the same events (`feed`) to hold the reply so far: what streamed, then
the final text of `TurnDone`.
"""

from __future__ import annotations

from .events import EngineEvent, TokenDelta, TurnDone


class Reply:
    def __init__(self) -> None:
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self.n_tokens = 0  # tokens that made a `TokenDelta` (a remote server: pieces streamed)
        self.n_reasoning = 0  # of those, the ones marked `in_reasoning`
        self.t_first: float | None = None  # the first delta's time (`TokenDelta.t`)
        self.t_last: float | None = None  # the last one's
        self.t_first_answer: float | None = None  # when answer text first appeared

    @property
    def text(self) -> str:
        """The answer so far."""
        return _joined(self._text)

    @property
    def reasoning(self) -> str:
        """The reasoning so far."""
        return _joined(self._reasoning)

    def add(self, delta: TokenDelta) -> TokenDelta:
        """Record one delta (and return it, to be yielded)."""
        self.n_tokens += 1
        if self.t_first is None:
            self.t_first = delta.t
        self.t_last = delta.t
        self.n_reasoning += delta.in_reasoning
        self._append(delta.text, delta.reasoning, delta.t)
        return delta

    def add_held(self, answer: str, reasoning: str, t: float | None) -> None:
        """Text given out at the end that no delta carried (a partial marker, trailing
        newlines, the replacement character of an unfinished UTF-8 sequence)."""
        self._append(answer, reasoning, t)

    def feed(self, event: EngineEvent) -> None:
        """For a caller reading a turn's events: a `TokenDelta` adds to the reply, `TurnDone`
        replaces its text with the final one (held-back text included); a `TurnFailed` leaves
        what streamed."""
        if isinstance(event, TokenDelta):
            self.add(event)
        elif isinstance(event, TurnDone):
            self._text[:] = [event.text] if event.text else []
            self._reasoning[:] = [event.reasoning] if event.reasoning else []

    def _append(self, answer: str, reasoning: str, t: float | None) -> None:
        if answer:
            self._text.append(answer)
            if self.t_first_answer is None:
                self.t_first_answer = t
        if reasoning:
            self._reasoning.append(reasoning)


def _joined(parts: list[str]) -> str:
    """The parts as one string, kept joined (read once per update, not per token)."""
    if len(parts) > 1:
        parts[:] = ["".join(parts)]
    return parts[0] if parts else ""
