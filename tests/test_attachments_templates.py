"""Attached files on llama.cpp's real chat templates, on the real engine (the tiny hybrid
qwen4exp with each template in its GGUF): a follow-up after a turn with files samples exactly
what a cold run of the same conversation samples and reuses every token before the previous
reply, and the same file attached twice renders to the same tokens both times.

The session goes through the app's own turn path (`start_turn` + `record` into a real store),
with a real source file of this repository attached. Engines prefill one token per batch and run
one thread, as in `tests/test_template_corpus.py`, so a difference is a wrong state, never a near
tie broken differently by two batch shapes.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

import pytest

from velo_chat.app.attachments import AttachmentLimits, read_file
from velo_chat.engine import render_block
from velo_chat.app.conversation import record, start_turn, turn_messages
from velo_chat.engine.diagnostics import diagnostics
from velo_chat.engine.engine import Engine
from velo_chat.engine.prompt import template_env
from velo_chat.store import SessionStore

from devkit.gguf_template import with_chat_template
from tests.support.llama_templates import read_template, templates_dir
from tests.support.template_corpus import _profile, _tokens, kept_before_reply, renders_system

TEMPLATES = templates_dir()
NAMES = (
    "Qwen3.5-4B",
    "meta-llama-Llama-3.3-70B-Instruct",
    "Mistral-Small-3.2-24B-Instruct-2506",
    "google-gemma-4-31B-it",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "openai-gpt-oss-120b",
)
REPO = Path(__file__).resolve().parents[1]
ATTACHED = REPO / "app" / "load_rate.py"  # a real source file, with quotes and backticks


@pytest.fixture(autouse=True)
def fixed_date(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_env, "now", lambda: datetime.datetime(2026, 1, 15, 12, 0))


def occurrences(haystack: list[int], needle: list[int]) -> int:
    n = len(needle)
    return sum(1 for i in range(len(haystack) - n + 1) if haystack[i : i + n] == needle)


@pytest.mark.parametrize("name", NAMES)
def test_follow_ups_after_files_are_exact_and_warm(name, qwen_path, tmp_path):
    if TEMPLATES is None:
        pytest.skip("llama.cpp's chat templates are unavailable (see test_template_corpus.py)")
    model = with_chat_template(qwen_path, read_template(TEMPLATES, name), tmp_path / f"{name}.gguf")
    attachment = read_file(ATTACHED, REPO, AttachmentLimits()).attachment
    turns = [
        ("What does this module decide?", (attachment,)),
        ("Why?", ()),
        ("Again, briefly.", (attachment,)),
    ]
    with Engine(_profile(model, True, enabled=False)) as cold:
        cold.load()
        profile = _profile(model, renders_system(cold))
        profile = dataclasses.replace(profile, context=dataclasses.replace(profile.context, n_ctx=4096))
        with (
            SessionStore(tmp_path / "sessions.sqlite3") as store,
            Engine(profile, checkpoint_root=tmp_path / "ckpt") as engine,
        ):
            engine.load()
            session, previous = None, None
            for k, (text, files) in enumerate(turns):
                convo = turn_messages(store, session, profile, text, attachments=files).messages
                prompt = diagnostics(engine).tokens_for(convo)
                bound = kept_before_reply(engine, convo, previous) if previous else 0
                started_turn = start_turn(
                    store, engine, session=session, profile=profile, text=text, attachments=files
                )
                session = started_turn.session
                started, tokens, _ = _tokens(record(started_turn.events, started_turn.recorded))
                assert started.prompt_tokens == len(prompt)
                if k:
                    assert started.cached_tokens >= bound, f"turn {k + 1}: reused {started.cached_tokens}"
                    diagnostics(cold).reset()
                    assert tokens == _tokens(cold.turn(convo))[1], f"turn {k + 1} differs from a cold run"
                previous = prompt
            stored = store.messages(session.id)
            assert [m.attachments for m in stored if m.role == "user"] == [(attachment,), (), (attachment,)]
            assert stored[0].content == turns[0][0]  # the typed text is stored apart from the file
            # The same file renders to the same tokens in turn 1 and turn 3: the body of its block
            # (the path line and fences aside, which meet the template's text) is there twice.
            model_api = engine._require()[0]
            block = model_api.tokenize(render_block(attachment), parse_special=False)
            body = block[len(block) // 8 : -len(block) // 8]
            assert occurrences(prompt, body) == 2
