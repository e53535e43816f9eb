"""Every chat template of llama.cpp's collection, on the real engine: follow-ups are exact, reuse
the conversation, and the preview says what the turn reuses.

For each template (`tests/support/template_corpus.py`): the tiny hybrid qwen4exp with that
template in its GGUF runs a three-turn session through the app's own turn path, once with the
replies as generated and once with each reply rewritten in the store to hold `<think>...</think>`
before its answer. Every follow-up must

- sample exactly the tokens a cold run of the same conversation samples;
- reuse at least the tokens before the previous reply's assistant header (`kept_before_reply`:
  as far as the template keeps them; Mistral Nemo, which moves the system prompt to the last
  question, keeps almost nothing by design);
- and the preview before each turn must say exactly what the turn then reuses.

A hybrid model resumes only from exact prefixes, so this holds only because the state is saved
where every continuation agrees (`engine/checkpoints/save_points.py`) and the boundary after a reply is
rebuilt from there (`close_boundary`). The templates come from the llama-cpp-python sdist
(`tests/support/llama_templates.py`); none is copied into the repository.
"""

from __future__ import annotations

import datetime

import pytest

from velo_chat.engine.prompt import template_env

from tests.support.llama_templates import read_template, templates_dir
from tests.support.template_corpus import run_template

NO_SYSTEM_PROMPT = {
    "google-gemma-2-2b-it": "raises 'System role not supported' for a system message",
}
"""Templates that cannot render our messages with a system prompt, and why: their sessions run
without one. Every other template renders plain system/user/assistant messages."""

TEMPLATES = templates_dir()
NAMES = sorted(p.stem for p in TEMPLATES.glob("*.jinja")) if TEMPLATES else []


@pytest.fixture(autouse=True)
def fixed_date(monkeypatch: pytest.MonkeyPatch) -> None:
    """Templates that print today's date (Llama 3.2, Mistral Small, gpt-oss...) must not see it
    change between the turns and the cold run."""
    monkeypatch.setattr(template_env, "now", lambda: datetime.datetime(2026, 1, 15, 12, 0))


def test_the_collection_is_there():
    if TEMPLATES is None:
        pytest.skip(
            "llama.cpp's chat templates are unavailable: no llama-cpp-python sdist in "
            "pip's cache and `pip download` failed (set VELO_TEST_LLAMA_TEMPLATES)"
        )
    assert len(NAMES) >= 60
    assert set(NO_SYSTEM_PROMPT) <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_follow_ups_are_exact_and_reuse_the_history(name, qwen_path, tmp_path):
    run = run_template(name, read_template(TEMPLATES, name), qwen_path, tmp_path)
    assert run.system == (name not in NO_SYSTEM_PROMPT)
    for variant, turns in run.turns.items():
        for k, turn in enumerate(turns):
            where = f"{variant} turn {k + 1}"
            assert turn.preview == turn.cached, where
            if k == 0:
                continue
            assert turn.tokens == turn.cold, where
            assert turn.cached >= turn.bound, f"{where}: reused {turn.cached} of {turn.prompt}"
