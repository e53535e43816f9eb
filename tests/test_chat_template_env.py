"""Templates render as HuggingFace's `apply_chat_template` renders them (`engine/prompt/template_env.py`),
checked on real templates from llama.cpp's collection: the `loopcontrols` extension, the
`{% generation %}` block, `tools` for tool-use-only templates and for those that check for None,
Firefunction's `functions`/`datetime`, and HF's `tojson`."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from velo_chat.engine.prompt import template_env
from velo_chat.engine.prompt.chat_template import ChatMessage, ChatTemplate

from tests.support.llama_templates import read_template, templates_dir

CHAT = [
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "Hi there"),
    ChatMessage("assistant", "Hello, how can I help?"),
    ChatMessage("user", "Count to 3"),
]


@pytest.fixture(scope="module")
def folder() -> Path:
    found = templates_dir()
    if found is None:
        pytest.skip("llama.cpp's chat templates are unavailable (set VELO_TEST_LLAMA_TEMPLATES)")
    return found


@pytest.fixture(autouse=True)
def fixed_date(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_env, "now", lambda: datetime.datetime(2026, 1, 15, 12, 0))


def render(folder: Path, name: str, messages=CHAT) -> str:
    template = ChatTemplate(read_template(folder, name), bos_token="<s>", eos_token="</s>")
    text = template.render(messages)
    assert "".join(s.text for s in template.segments(messages)) == text
    return text


@pytest.mark.parametrize(
    "name", ["Cohere2MoE", "CohereForAI-c4ai-command-r7b-12-2024-tool_use", "Kimi-K3", "Reka-Edge"]
)
def test_break_and_continue_parse(folder, name):
    """HF enables Jinja's `loopcontrols`; without it these stop at "unknown tag 'break'"."""
    assert "Count to 3" in render(folder, name)


@pytest.mark.parametrize("name", ["LFM2.5-8B-A1B", "poolside-Laguna-XS.2"])
def test_the_generation_block_renders_its_body(folder, name):
    text = render(folder, name)
    assert "Hello, how can I help?" in text


def test_a_tool_use_template_gets_an_empty_tool_list(folder):
    """Hermes' tool_use template loops over `tools` unguarded: with HF's None it fails."""
    text = render(folder, "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use")
    assert "Here are the available tools: <tools>  </tools>" in text and "Count to 3" in text


def test_a_template_that_checks_for_none_keeps_none(folder):
    """Llama 3.1 describes its tool environment when `tools is not none`: a plain chat must
    render as in HF, without it."""
    text = render(folder, "meta-llama-Llama-3.1-8B-Instruct")
    assert "Environment: ipython" not in text and "Count to 3" in text


def test_firefunction_gets_llama_cpp_variables(folder):
    text = render(folder, "fireworks-ai-llama-3-firefunction-v2")
    assert "Available functions as JSON spec:\n\nToday is Jan 15 2026." in text


def test_tojson_is_hf_s():
    """Not HTML-escaped, and with HF's keyword arguments."""
    value = {"b": "<a & 'c'>", "a": [1, 2]}
    assert template_env.tojson(value) == json.dumps(value, ensure_ascii=False)
    assert template_env.tojson(value, indent=2, sort_keys=True) == json.dumps(value, indent=2, sort_keys=True)
