"""Thinking models: what a chat template offers to control reasoning, and the reply stream split
into reasoning and answer.

Templates name their controls differently (read from llama.cpp's collection): Qwen3, GLM, Gemma 4
and most others read `enable_thinking`; DeepSeek V3.1+ `thinking` (or `enable_thinking`),
Granite 3.3 `thinking`, Command A `reasoning`, MiniMax-M3 `thinking_mode` ("enabled" /
"disabled"), Ling `thinking_option` ("on" / "off"); levels come as `reasoning_effort` (gpt-oss,
Hy3, Solar, DeepSeek V4), `thinking_effort` (Kimi K3) or `reasoning_strength`.
`inspect_template` finds which of these variables the template source reads (its undeclared
Jinja names), the string levels it compares the effort variable with, and the markers its
replies put reasoning between (`<think>`/`</think>` unless the template uses another known
pair). docs/thinking.md.

`ReasoningSplitter` turns the sampled text into reasoning and answer as it streams. Reasoning is
recognised only where a reasoning block can be: at the very start of the reply (after
whitespace), or from the first token when the generation prompt ends inside one (Qwen3.5's
`<think>\\n`). It ends at the first closing marker; everything after it is the answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jinja2 import meta, nodes

from ..config.profile_schema import ReasoningSettings

SWITCHES: tuple[tuple[str, Any, Any], ...] = (
    ("enable_thinking", True, False),
    ("thinking", True, False),
    ("reasoning", True, False),
    ("thinking_mode", "enabled", "disabled"),
    ("thinking_option", "on", "off"),
)
"""Template variables that turn thinking on or off, most common first, with the values for on
and off. A template reading several (DeepSeek: `thinking`, else `enable_thinking`) gets the
first."""

EFFORTS = ("reasoning_effort", "thinking_effort", "reasoning_strength")
"""Template variables that take a thinking level."""

OFF_LEVELS = ("none", "no_think", "off", "disabled")
"""Levels that mean "do not think" (Hy3's `reasoning_effort = "no_think"`): how thinking is
turned off in a template that has levels but no switch."""

MARKERS: tuple[tuple[str, str], ...] = (
    ("<seed:think>", "</seed:think>"),
    ("<mm:think>", "</mm:think>"),
    ("<|START_THINKING|>", "<|END_THINKING|>"),
    ("[THINK]", "[/THINK]"),
    ("<thinking>", "</thinking>"),
    ("<|channel>thought", "<channel|>"),
    ("<think>", "</think>"),
)
"""Reasoning markers seen in real templates; the first pair whose two strings both occur in the
template is its pair, else `<think>`/`</think>`."""


@dataclass(frozen=True)
class ThinkingSupport:
    """What one chat template offers. `switch`/`effort`: the variable names it reads (None: it
    has no such control); `levels`: the strings it compares the effort variable with, in source
    order; `default_on`: whether it thinks when not told (None: cannot tell from a rendering);
    `markers_found`: the markers were read from the template, not assumed (a thinking budget
    needs them: it writes the closing marker itself)."""

    switch: str | None = None
    on_value: Any = True
    off_value: Any = False
    effort: str | None = None
    levels: tuple[str, ...] = ()
    open_marker: str = "<think>"
    close_marker: str = "</think>"
    default_on: bool | None = None
    markers_found: bool = False  # the template source holds its marker pair (else the default)

    @property
    def off_level(self) -> str | None:
        return next((lv for lv in self.levels if lv.lower() in OFF_LEVELS), None)

    @property
    def can_switch(self) -> bool:
        """Whether thinking can be turned on and off through template variables."""
        return self.switch is not None or (self.effort is not None and self.off_level is not None)

    def is_on(self, enabled: bool | None) -> bool:
        """Whether a turn with this setting thinks (None: the template's default; a template
        whose default cannot be told counts as thinking, as thinking templates mostly do)."""
        if enabled is not None:
            return enabled
        return self.default_on is not False

    def thinks(self, settings: ReasoningSettings) -> bool:
        """Whether a turn with these reasoning settings thinks (`is_on` of what they ask for)."""
        return self.is_on(requested(settings)[0])

    def variables(self, enabled: bool | None, effort: str | None) -> dict[str, Any]:
        """The template variables for a turn. `enabled` None and `effort` None leave the
        template's defaults; a template without the control gets nothing for it."""
        out: dict[str, Any] = {}
        if enabled is not None and self.switch is not None:
            out[self.switch] = self.on_value if enabled else self.off_value
        if self.effort is None:
            return out
        if self.switch is None and self.off_level is not None and enabled is not None:
            on_level = next((lv for lv in self.levels if lv.lower() not in OFF_LEVELS), None)
            level = self.off_level if not enabled else effort or on_level
            if level is not None:
                out[self.effort] = level
        elif effort is not None and (enabled is not False or self.switch is None):
            out[self.effort] = effort
        return out

    def opens_reasoning(self, prompt_tail: str) -> bool:
        """Whether a prompt ending in `prompt_tail` leaves the reply inside a reasoning block
        (the generation prompt ends in the opening marker, as Qwen3.5's `<think>\\n`)."""
        return prompt_tail.rstrip().endswith(self.open_marker)


def _name_of(node: nodes.Node) -> str | None:
    """The variable a comparison or assignment is about (`x`, `x | lower`, `x | string`)."""
    while isinstance(node, nodes.Filter) and node.node is not None:
        node = node.node
    return node.name if isinstance(node, nodes.Name) else None


def _strings(node: nodes.Node) -> list[str]:
    if isinstance(node, nodes.Const) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (nodes.List, nodes.Tuple)):
        return [s for item in node.items for s in _strings(item)]
    return []


def _levels(ast: nodes.Template, variable: str) -> tuple[str, ...]:
    """String values the template compares `variable` with or assigns to it, in source order."""
    found: list[str] = []
    for node in ast.find_all((nodes.Compare, nodes.Assign)):
        if isinstance(node, nodes.Assign):
            if isinstance(node.target, nodes.Name) and node.target.name == variable:
                found += _strings(node.node)
            continue
        assert isinstance(node, nodes.Compare)
        operands = [node.expr, *(op.expr for op in node.ops)]
        if any(_name_of(x) == variable for x in operands):
            found += [s for x in operands for s in _strings(x)]
    return tuple(dict.fromkeys(s for s in found if s))


def inspect_template(
    ast: nodes.Template, source: str, render: Callable[[Mapping[str, Any]], str] | None = None
) -> ThinkingSupport:
    """The thinking controls of a parsed template. `render(variables)`, when given, renders a
    one-question conversation with a generation prompt: comparing the default rendering with
    the switch on and off tells the template's default."""
    levels = {name: _levels(ast, name) for name in EFFORTS}  # before `meta`, which changes
    inputs = meta.find_undeclared_variables(ast)  # the tree as it compiles it
    switch = next(((n, on, off) for n, on, off in SWITCHES if n in inputs), None)
    effort = next((n for n in EFFORTS if n in inputs), None)
    found = next(((o, c) for o, c in MARKERS if o in source and c in source), None)
    open_marker, close_marker = found or MARKERS[-1]
    support = ThinkingSupport(
        switch=switch[0] if switch else None,
        on_value=switch[1] if switch else True,
        off_value=switch[2] if switch else False,
        effort=effort,
        levels=levels[effort] if effort else (),
        open_marker=open_marker,
        close_marker=close_marker,
        markers_found=found is not None,
    )
    if render is None or not support.can_switch:
        return support
    try:
        default = render({})
        on = render(support.variables(True, None))
        off = render(support.variables(False, None))
    except Exception:  # a template that cannot render a plain question: no default to read
        return support
    default_on = None if on == off else (True if default == on else False if default == off else None)
    return dataclasses.replace(support, default_on=default_on)


# -- the reply stream -----------------------------------------------------------------------------

_START, _REASONING, _ANSWER = "start", "reasoning", "answer"


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `marker`."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


@dataclass(frozen=True)
class Piece:
    """What one sampled token added: reasoning text, answer text (either may be "" while text
    is held back: a marker may be starting), and whether the token belongs to the reasoning."""

    reasoning: str
    answer: str
    in_reasoning: bool


class ReasoningSplitter:
    """Splits a reply, token by token, into reasoning and answer.

    The markers are not part of either. Newlines around the reasoning and before the answer are
    dropped (as the templates do when they split a reply: `strip('\\n')`, `lstrip('\\n')`), so
    the pieces concatenate to the reply's reasoning and answer (`reply.Reply` adds them up). A
    reply without a reasoning block is all answer, byte for byte. `reasoning_tokens` counts the
    tokens from the opening marker to the closing one, both included."""

    def __init__(
        self, open_marker: str = "<think>", close_marker: str = "</think>", *, inside: bool = False
    ) -> None:
        self.open_marker, self.close_marker = open_marker, close_marker
        self.had_reasoning = inside
        self._state = _REASONING if inside else _START
        self._held = ""  # text not yet given out: a marker may be starting, or trailing newlines
        self._pending = 0  # tokens held at the start (they count once the start is decided)
        self._reasoned = False  # some reasoning text was given out
        self._answered = False  # some answer text was given out
        self.reasoning_tokens = 0

    @property
    def in_reasoning(self) -> bool:
        return self._state == _REASONING

    def feed(self, text: str, *, control: str = "") -> Piece:
        """One sampled token: `text` is what it reads as, `control` the text of a control token
        (which reads as nothing), so a marker that is, or begins with, a control token is still
        recognised (Command A's `<|START_THINKING|>`, Gemma 4's `<|channel>` + `thought`)."""
        before, had = self._state, self.had_reasoning
        if control and not text:  # a control token that is (part of) the marker due next
            if (before == _START and control in self.open_marker) or (
                before == _REASONING and control in self.close_marker
            ):
                text = control
        reasoning, answer = self._take(text)
        if self._state == _START:
            self._pending += 1  # counted once the start is decided
            return Piece("", "", False)
        counted = before == _REASONING or self.had_reasoning != had  # inside, or it opened
        if before == _START:
            if counted:
                self.reasoning_tokens += self._pending
            self._pending = 0
        if counted:
            self.reasoning_tokens += 1
        return Piece(reasoning, answer, counted)

    def finish(self, text: str = "") -> Piece:
        """The reply ended (`text`: what the last token still had to say, if anything): give
        out what was held back, a partial marker as text."""
        reasoning, answer = self._take(text)
        held, self._held = self._held, ""
        if self._state == _REASONING:
            reasoning += self._add_reasoning(held.rstrip("\n"))
        else:
            answer += self._add_answer(held)
        return Piece(reasoning, answer, self._state == _REASONING)

    # -- pieces ---------------------------------------------------------------------------------

    def _take(self, text: str) -> tuple[str, str]:
        buf, self._held = self._held + text, ""
        reasoning = answer = ""
        if self._state == _START:
            head = buf.lstrip()
            if head.startswith(self.open_marker):
                self._state, self.had_reasoning = _REASONING, True
                buf = head[len(self.open_marker) :]
            elif not head or self.open_marker.startswith(head):
                self._held = buf
                return "", ""
            else:
                self._state = _ANSWER
        if self._state == _REASONING:
            end = buf.find(self.close_marker)
            if end < 0:
                keep = _partial_suffix(buf, self.close_marker)
                body = buf[: len(buf) - keep].rstrip("\n")
                self._held = buf[len(body) :]
                return self._add_reasoning(body), ""
            reasoning = self._add_reasoning(buf[:end].rstrip("\n"))
            self._state, buf = _ANSWER, buf[end + len(self.close_marker) :]
        answer = self._add_answer(buf)
        return reasoning, answer

    def _add_reasoning(self, text: str) -> str:
        if not self._reasoned:
            text = text.lstrip("\n")
        self._reasoned = self._reasoned or bool(text)
        return text

    def _add_answer(self, text: str) -> str:
        if not self._answered and self.had_reasoning:
            text = text.lstrip("\n")
        self._answered = self._answered or bool(text)
        return text


def requested(settings: ReasoningSettings) -> tuple[bool | None, str | None]:
    """A profile's `[reasoning]` as `ThinkingSupport.variables` arguments ("auto": None)."""
    enabled = {"on": True, "off": False}.get(settings.enabled)
    effort = settings.effort.strip()
    return enabled, (effort if effort and effort != "auto" else None)


# -- the thinking budget ---------------------------------------------------------------------------

PROBE_REASONING, PROBE_ANSWER = "velo-probe-reasoning", "velo-probe-answer"
"""A reply's reasoning and answer in the rendering `closing_text` reads (text no template holds)."""


@dataclass(frozen=True)
class ReasoningBudget:
    """A turn's thinking budget (`reasoning.budget_tokens`, docs/thinking.md): after `tokens`
    reasoning tokens the turn writes `message` and `closing` into the reply itself, decoded as
    if sampled, so the reasoning ends there and the answer follows. `closing` is the text the
    template writes between a reply's reasoning and its answer (`closing_text`). 0 tokens: no
    limit."""

    tokens: int = 0
    message: str = ""
    closing: str = "\n</think>\n\n"

    def written_after(self, reasoning: str) -> tuple[str, str]:
        """What the turn writes after the reasoning so far (`reasoning`: its end) when the
        budget is spent: the message on a line of its own (a settings field holds one line),
        and the closing without the newlines it opens with that the text before it already
        ends with (a model that ended its line gets no blank line a re-render would not
        have)."""
        message = self.message
        if message and reasoning and not reasoning.endswith("\n") and not message.startswith("\n"):
            message = "\n" + message
        before = reasoning + message
        lead = len(self.closing) - len(self.closing.lstrip("\n"))
        ending = len(before) - len(before.rstrip("\n"))
        return message, self.closing[min(lead, ending) :]


def closing_text(support: ThinkingSupport, render_reply: Callable[[str, str], str] | None) -> str:
    """What ends a reasoning block in this template's replies: the text a rendering of a reply
    (`render_reply(answer, reasoning)`, None: none) has between its reasoning and its answer,
    where that holds the closing marker (Qwen3.5: "\\n</think>\\n\\n", GLM-4.7: "</think>").
    A template that drops a reply's reasoning (DeepSeek R1) or cannot render one says
    nothing: the marker on a line of its own and a blank line, as thinking models write it."""
    fallback = f"\n{support.close_marker}\n\n"
    if render_reply is None:
        return fallback
    try:
        text = render_reply(PROBE_ANSWER, PROBE_REASONING)
    except Exception:  # a template that refuses the probe conversation: the common closing
        return fallback
    start, end = text.find(PROBE_REASONING), text.find(PROBE_ANSWER)
    if start < 0 or end < start:
        return fallback
    between = text[start + len(PROBE_REASONING) : end]
    return between if support.close_marker in between else fallback
