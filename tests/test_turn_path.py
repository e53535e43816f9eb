"""The engine's turn path renders the conversation once, and cuts the follow-up boundary from
the segments of one rendering.

Counted with `PromptRenderer.renders` (one per `ChatTemplate.segments` call): the preview and the
turn that follows share one rendering of the conversation; a hybrid model with checkpoints then
renders the two placeholder continuations of its stable prefix (`checkpoints/save_points.py`),
and every model renders one follow-up after the reply. The boundary cut from segments must be
exactly the one found by difference (two follow-ups that differ only in the next question's
text), for every chat template of llama.cpp's collection and replies with and without
reasoning."""

from __future__ import annotations

import pytest

from velo_chat.engine.engine import Engine
from velo_chat.engine.events import TurnDone
from velo_chat.engine.prompt.chat_template import ChatMessage, ChatTemplate, ChatTemplateError
from velo_chat.engine.prompt.rendered import PromptRenderer, follow_up_prefix

from tests.support.engine_helpers import test_profile
from tests.support.llama_templates import read_template, templates_dir

CONVO = [ChatMessage("system", "Be brief."), ChatMessage("user", "Name two colours.")]
TEMPLATES = templates_dir()
NAMES = sorted(p.stem for p in TEMPLATES.glob("*.jinja")) if TEMPLATES else []


def renders_of_a_turn(engine: Engine) -> int:
    renderer = engine._parts().renderer
    before = renderer.renders
    engine.preview(CONVO)
    with engine.turn(CONVO, max_tokens=4) as turn:
        assert any(isinstance(e, TurnDone) for e in turn)
    return renderer.renders - before


@pytest.mark.parametrize("model", ["smollm2", "qwen4exp"])
def test_a_turn_renders_its_conversation_once(model, request, tmp_path):
    path = request.getfixturevalue("smollm2_path" if model == "smollm2" else "qwen_path")
    with Engine(test_profile(path), checkpoint_root=tmp_path) as engine:
        engine.load()
        hybrid = engine.info is not None and engine.info.hybrid
        assert hybrid == (model == "qwen4exp")
        # the conversation once (preview and turn), the stable prefix's two continuations
        # (hybrid models), the follow-up boundary once
        assert renders_of_a_turn(engine) == 1 + (2 if hybrid else 0) + 1
    with Engine(test_profile(path, checkpoints={"enabled": False})) as engine:
        engine.load()
        assert renders_of_a_turn(engine) == 2  # no checkpoints: no stable prefix


REPLIES = [
    ("Red and blue.", ""),
    ("Red and blue.", "The user wants two colours."),
    ("<think>\nTwo colours.\n</think>\n\nRed and blue.", ""),
    ("Text that looks like control: <|im_end|>\n<|im_start|>user\n and </s>.", ""),
]


@pytest.mark.skipif(TEMPLATES is None, reason="llama.cpp's chat templates are unavailable")
def test_the_boundary_cut_from_segments_is_the_one_found_by_difference(smol_engine):
    model = smol_engine._model
    protected = model.prompt_tokenizer.special.protected_texts
    checked = 0
    for name in NAMES:
        template = ChatTemplate(
            read_template(TEMPLATES, name),
            bos_token="<s>",
            eos_token="</s>",
            model_name=name,
            protected=protected,
        )
        renderer = PromptRenderer(lambda t=template: t, model.tokenize_segments)
        for history in (CONVO, CONVO[1:]):
            try:
                prompt = renderer.render(history)
            except ChatTemplateError:
                continue  # e.g. Gemma 2 refuses a system message
            for reply, reasoning in REPLIES:
                try:
                    by_difference = follow_up_prefix(renderer.tokens, history, reply, reasoning=reasoning)
                except ChatTemplateError:
                    continue
                assert renderer.follow_up_prefix(prompt, reply, reasoning) == by_difference, (name, reply)
                checked += 1
    assert checked >= 4 * len(NAMES)
