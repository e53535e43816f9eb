"""The Jinja environment chat templates are written for: HuggingFace's `apply_chat_template`.

Model makers test their templates with `transformers`, so a template that renders there must
render here, with the same text. HF compiles a template in an `ImmutableSandboxedEnvironment`
with `trim_blocks`/`lstrip_blocks`, the `loopcontrols` extension (`{% break %}`,
`{% continue %}`: Command R7B, Kimi K3, Reka Edge), its `{% generation %}` block (which marks
the assistant's text for training masks and renders its body unchanged: LFM2.5, Laguna), a
`tojson` filter that does not escape HTML and takes `indent`/`separators`/`sort_keys`, and the
globals `raise_exception` and `strftime_now`. It renders with `tools` and `documents` None when
there are none, plus the special tokens' strings.

Two additions, both for templates that cannot render a plain chat otherwise:
- a template written only for tool use (it loops over `tools` without checking for None:
  Hermes 2/3 tool_use, Command R+ tool_use) gets an empty list of tools;
- llama.cpp's own variables for Firefunction v2, `functions` (the tool definitions as JSON text:
  empty) and `datetime`, are given to a template that reads them.

Dates (`strftime_now`, `datetime`) come from `now()`, at day resolution where velo-chat picks the
format, so a date in the system prompt changes the prompt once a day, not every second.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Mapping
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import meta, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


def now() -> _dt.datetime:
    """The clock templates see (one function, so a test can fix the date)."""
    return _dt.datetime.now()


def strftime_now(fmt: str) -> str:
    return now().strftime(fmt)


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """HF's `tojson`: plain `json.dumps` (Jinja's own escapes `<`, `>`, `&` and `'` for HTML,
    which would change the tool definitions a model was trained on)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: HF uses it to find the assistant's tokens for
    training; rendering a prompt, the body is the output, unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


def environment() -> ImmutableSandboxedEnvironment:
    """HF's environment (the caller adds `raise_exception`, which raises its own error)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        loader=jinja2.BaseLoader(),
        extensions=[GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["strftime_now"] = strftime_now
    return env


def inputs(env: jinja2.Environment, source: str) -> frozenset[str]:
    """The variables a template reads without setting them (parsed afresh: `meta` changes the
    tree it walks)."""
    return frozenset(meta.find_undeclared_variables(env.parse(source)))


def defaults(names: frozenset[str]) -> dict[str, Any]:
    """What every rendering gets unless the caller says otherwise (HF's None for the absent
    tools and documents; llama.cpp's Firefunction variables for a template that reads them)."""
    out: dict[str, Any] = {"tools": None, "documents": None}
    if "functions" in names:
        out["functions"] = ""
    if "datetime" in names:
        out["datetime"] = now().strftime("%b %d %Y")
    return out


def needs_tool_list(render: Callable[[Mapping[str, Any]], str]) -> bool:
    """Whether a template renders a plain question only with a list of tools: it fails with
    `tools` None and succeeds with `[]` (a template for tool use only). Decided once per
    template, so every turn of a conversation renders the same way."""
    try:
        render({"tools": None})
        return False
    except Exception:  # any failure: try the other way
        pass
    try:
        render({"tools": []})
    except Exception:  # it fails either way: keep HF's None
        return False
    return True
