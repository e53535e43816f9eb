"""A thinking budget never cuts inside a tool call, and a call a model opens inside its
reasoning parses: the tiny hybrid qwen4exp with Qwen3.5's template (its generation prompt opens
the reasoning block), a call forced from the first token (`Diagnostics.turn` with
`forced_call`: it sits inside the think block), and a budget far shorter than the call."""

from __future__ import annotations

import datetime

import pytest

from velo_chat.app.tools.toolbox import ToolBox
from velo_chat.engine import ChatMessage, ToolCall, TurnDone
from velo_chat.engine.diagnostics import diagnostics
from velo_chat.engine.engine import Engine
from velo_chat.engine.prompt import template_env

from devkit.gguf_template import with_chat_template
from tests.support.engine_helpers import test_profile
from tests.support.llama_templates import read_template, templates_dir

TEMPLATES = templates_dir()
CALL = ToolCall("edit_file", {"path": "src/app.py", "old": "return a - b", "new": "return a + b"})


@pytest.mark.skipif(TEMPLATES is None, reason="llama.cpp's chat templates are unavailable")
def test_a_budget_spent_inside_a_call_leaves_it_whole(qwen_path, tmp_path, monkeypatch):
    assert TEMPLATES is not None
    monkeypatch.setattr(template_env, "now", lambda: datetime.datetime(2026, 1, 15, 12, 0))
    model = with_chat_template(qwen_path, read_template(TEMPLATES, "Qwen3.5-4B"), tmp_path / "q35.gguf")
    profile = test_profile(
        model,
        context={"n_ctx": 4096},
        sampling={"temperature": 0.7, "seed": 2, "max_tokens": 400},
        reasoning={"enabled": "on", "budget_tokens": 4},
    )
    specs = ToolBox(tmp_path, profile.tools).specs
    with Engine(profile) as engine:
        engine.load()
        events = list(
            diagnostics(engine).turn([ChatMessage("user", "Fix add.")], tools=specs, forced_call=CALL)
        )
    done = events[-1]
    assert isinstance(done, TurnDone), done
    assert done.stats.finish_reason == "stop"  # the call closed, then the reply ended
    assert not done.stats.reasoning_budget_hit  # the budget came inside the call: no cut
    assert done.stats.reasoning_tokens > profile.reasoning.budget_tokens
    (call,) = done.tool_calls  # found inside the unclosed think block
    assert (call.name, dict(call.arguments), call.error) == (CALL.name, dict(CALL.arguments), "")
    assert "<tool_call>" not in done.reasoning  # taken out of the reasoning kept for the history
