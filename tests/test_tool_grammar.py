"""The tool-call grammars in real llama.cpp: each format's grammar compiles in the grammar sampler
over SmolLM2's vocabulary, the exact text the template renders for a call is in its language
(token by token, as llama.cpp checks a sampled token), a call of an undeclared tool or without a
required argument is not, the lazy and the after-reasoning forms trigger where they should, and
a call sampled under the grammar from the tiny random qwen4exp parses with no error.

A token the grammar rejects is never accepted here: llama.cpp aborts the process on that.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from llama_cpp import llama_cpp as ll

from velo_chat.engine.config.profile_schema import SamplingSettings
from velo_chat.engine.llama.context import LlamaContext
from velo_chat.engine.llama.model import LlamaModel
from velo_chat.engine.llama.sampling import Sampler
from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.tools.formats import all_formats
from velo_chat.engine.tools.grammar import Grammar, tool_grammar
from velo_chat.engine.tools.types import ToolCall, ToolSpec

from devkit.gguf_template import with_chat_template
from tests.support.engine_helpers import test_profile
from tests.support.llama_templates import read_template, templates_dir

READ = ToolSpec(
    "read_file",
    "Read a text file.",
    {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "start": {"type": "integer"},
            "whole": {"type": "boolean"},
        },
        "required": ["path"],
    },
)
EDIT = ToolSpec(
    "edit_file",
    "Replace text in a file.",
    {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "old": {"type": "string"},
            "new": {"type": "string"},
            "mode": {"enum": ["once", "all"]},
            "lines": {"type": "array", "items": {"type": "integer"}},
            "ratio": {"type": "number"},
            "meta": {"type": "object"},
        },
        "required": ["path", "old", "new"],
    },
)
TOOLS = [READ, EDIT]
CALLS = [
    ToolCall("read_file", {"path": "src/app.py"}, id="Ab3dE6gH9"),
    ToolCall("read_file", {"path": "", "start": -12, "whole": False}, id="Ab3dE6gH9"),
    ToolCall(
        "edit_file",
        {
            "path": "C:\\tmp\\ü.py",
            "old": 'x = "1"\n\n</parameter\t<|im_end|>',
            "new": "}\n</tool_call>\x01",
            "mode": "all",
            "lines": [3, 40],
            "ratio": 0.25,
            "meta": {"k": [1, "v", None, True]},
        },
        id="Zz9yY8xX7",
    ),
]
FORMATS = {f.name: f for f in all_formats()}


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> Iterator[LlamaModel]:
    model = LlamaModel(smollm2_path, test_profile(smollm2_path).model)
    yield model
    model.close()


def grammar_sampler(model: LlamaModel, grammar: Grammar) -> object:
    """The grammar sampler alone, as `Sampler` puts it first in its chain."""
    from velo_chat.engine.llama.sampling import _grammar_sampler

    return _grammar_sampler(ll, grammar, model.vocab)


def allowed(sampler: object, token: int) -> bool:
    data = (ll.llama_token_data * 1)(ll.llama_token_data(token, 0.0, 0.0))
    candidates = ll.llama_token_data_array(data, 1, -1, False)
    ll.llama_sampler_apply(sampler, ctypes.byref(candidates))
    return not math.isinf(data[0].logit)


def walk(model: LlamaModel, sampler: object, text: str) -> tuple[int, int] | None:
    """Feed `text` token by token. None when the grammar takes all of it; else where the first
    token it rejects starts and ends in `text` (that token is not accepted)."""
    tokens = model.tokenize(text, parse_special=False)
    done = 0
    for token in tokens:
        piece = len(model.token_bytes(token).decode())
        if not allowed(sampler, token):
            return done, done + piece
        ll.llama_sampler_accept(sampler, token)
        done += piece
    return None


def rejected_at(model: LlamaModel, sampler: object, text: str, where: int) -> bool:
    """Whether the grammar takes `text` up to the token that holds `where`, and not that one."""
    stop = walk(model, sampler, text)
    return stop is not None and stop[0] <= where < stop[1]


def eog(model: LlamaModel) -> int:
    return next(t for t in range(model.n_vocab) if model.is_eog(t))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_the_rendered_call_is_in_the_grammar_and_ends_it(smol: LlamaModel, name: str) -> None:
    fmt = FORMATS[name]
    grammar = tool_grammar(fmt, TOOLS, "required")
    assert grammar is not None and not grammar.lazy
    for call in CALLS:
        text = fmt.render(call)
        sampler = grammar_sampler(smol, grammar)
        try:
            assert not allowed(sampler, eog(smol))  # nothing written yet: no end
            assert walk(smol, sampler, text) is None, text
            assert allowed(sampler, eog(smol))  # the call is complete: the reply may end
        finally:
            ll.llama_sampler_free(sampler)
        (parsed,) = fmt.parse(text, TOOLS).calls
        assert parsed.error == "" and parsed.arguments == call.arguments


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_an_undeclared_tool_or_a_missing_argument_is_rejected(smol: LlamaModel, name: str) -> None:
    fmt = FORMATS[name]
    grammar = tool_grammar(fmt, TOOLS, "required")
    assert grammar is not None
    bad = [
        (ToolCall("delete_all", {"path": "x"}, id="Ab3dE6gH9"), "delete_all"),
        (ToolCall("edit_file", {"path": "x", "new": "y"}, id="Ab3dE6gH9"), "new"),  # no "old"
        (ToolCall("read_file", {"path": "x", "force": True}, id="Ab3dE6gH9"), "force"),
        (ToolCall("read_file", {"path": "x", "start": "ten"}, id="Ab3dE6gH9"), "ten"),
    ]
    for call, where in bad:
        text = fmt.render(call)
        at = text.index(where) - (0 if fmt.name == "qwen3-coder-xml" or where != "ten" else 1)
        sampler = grammar_sampler(smol, grammar)
        try:
            assert rejected_at(smol, sampler, text, at), (text, at)
        finally:
            ll.llama_sampler_free(sampler)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_lazy_grammar_lets_text_through_until_a_call_opens(smol: LlamaModel, name: str) -> None:
    fmt = FORMATS[name]
    grammar = tool_grammar(fmt, TOOLS, "auto")
    assert grammar is not None and grammar.lazy
    before = "" if name == "llama3-json" else "Let me look at it first, with {braces} and [brackets].\n\n"
    if name == "gpt-oss":
        before = "<|channel|>analysis<|message|>Read it.<|end|><|start|>assistant"
    sampler = grammar_sampler(smol, grammar)
    try:
        if before:
            assert allowed(sampler, eog(smol))  # free text may end the reply
        assert walk(smol, sampler, before + fmt.render(CALLS[0])) is None
        assert allowed(sampler, eog(smol))
    finally:
        ll.llama_sampler_free(sampler)
    sampler = grammar_sampler(smol, grammar)
    try:  # once the call opened, only a declared tool
        text = before + fmt.render(ToolCall("delete_all", {}, id="Ab3dE6gH9"))
        assert rejected_at(smol, sampler, text, text.index("delete_all"))
    finally:
        ll.llama_sampler_free(sampler)


def test_a_required_call_after_the_reasoning(smol: LlamaModel) -> None:
    fmt = FORMATS["qwen3-coder-xml"]
    grammar = tool_grammar(fmt, TOOLS, "required", after="</think>")
    assert grammar is not None and grammar.lazy
    thought = "The user wants <b>the file</b>; I read it.\n</think>\n\n"
    sampler = grammar_sampler(smol, grammar)
    try:
        assert walk(smol, sampler, thought + fmt.render(CALLS[0])) is None
    finally:
        ll.llama_sampler_free(sampler)
    sampler = grammar_sampler(smol, grammar)
    try:  # after the reasoning, only a call
        assert rejected_at(smol, sampler, thought + "Here is the answer.", len(thought))
    finally:
        ll.llama_sampler_free(sampler)
    sampler = grammar_sampler(smol, grammar)
    try:  # a call inside the reasoning (Qwen writes them there) counts too
        assert walk(smol, sampler, "I need it.\n" + fmt.render(CALLS[0])) is None
        assert allowed(sampler, eog(smol))
    finally:
        ll.llama_sampler_free(sampler)


def test_the_sampler_accepts_written_tokens_only_where_the_grammar_allows(smol: LlamaModel) -> None:
    """`Sampler.accept`: text the engine writes into the reply itself (a reasoning block's
    closing at the thinking budget) goes through the grammar, and a token it does not allow
    is a ValueError, not llama.cpp's abort."""
    fmt = FORMATS["qwen3-coder-xml"]
    grammar = tool_grammar(fmt, TOOLS, "required", after="</think>")
    settings = SamplingSettings(temperature=0.0)
    with Sampler(settings, smol.n_vocab, grammar=grammar, vocab=smol.vocab) as sampler:
        for token in smol.tokenize("Enough thinking.\n</think>\n\n", parse_special=False):
            sampler.accept(token)  # the reasoning runs free; its closing triggers the grammar
        (hello, *_) = smol.tokenize("Hello", parse_special=False)
        assert not sampler.allows(hello) and not sampler.allows(eog(smol))
        with pytest.raises(ValueError, match="does not fit the tool-call grammar"):
            sampler.accept(hello)
        for token in smol.tokenize(fmt.render(CALLS[0]), parse_special=False):
            sampler.accept(token)
        assert sampler.allows(eog(smol)) and not sampler.allows(hello)
    with Sampler(settings, smol.n_vocab) as plain:
        assert plain.allows(hello)


def test_no_grammar_for_choice_none_or_no_tools() -> None:
    fmt = FORMATS["hermes"]
    assert tool_grammar(fmt, TOOLS, "none") is None
    assert tool_grammar(fmt, [], "required") is None
    with pytest.raises(ValueError, match="tool choice"):
        tool_grammar(fmt, TOOLS, "sometimes")


def test_a_grammar_llama_cpp_rejects_raises_a_clear_error(smol: LlamaModel) -> None:
    settings = SamplingSettings(temperature=0.0)
    with pytest.raises(ValueError, match="rejected the tool-call grammar"):
        Sampler(settings, smol.n_vocab, grammar=Grammar("root ::= call\n"), vocab=smol.vocab)
    with pytest.raises(ValueError, match="does not compile"):
        Sampler(settings, smol.n_vocab, grammar=Grammar('root ::= "a"\n', ("(unclosed",)), vocab=smol.vocab)
    with pytest.raises(ValueError, match="vocabulary"):
        Sampler(settings, smol.n_vocab, grammar=Grammar('root ::= "a"\n'))


PROBE_TOOLS = [
    ToolSpec("ping", "Check the host.", {"type": "object", "properties": {}}),
    ToolSpec(
        "set_mode",
        "Set the mode.",
        {
            "type": "object",
            "properties": {
                "mode": {"enum": ["fast", "slow"]},
                "level": {"type": "integer"},
                "verbose": {"type": "boolean"},
            },
            "required": ["mode", "level"],
        },
    ),
]


@pytest.mark.parametrize(
    ("template", "family"), [("Qwen3-Coder", "qwen3-coder-xml"), ("Qwen-Qwen2.5-7B-Instruct", "hermes")]
)
@pytest.mark.parametrize(("temperature", "seed"), [(0.8, 1234), (0.0, 0)])
def test_a_required_call_sampled_from_qwen4exp_parses(
    qwen_path: Path, tmp_path: Path, template: str, family: str, temperature: float, seed: int
) -> None:
    """Random weights, so the call is whatever the grammar let through: it must be a
    well-formed call of a declared tool, written exactly as the template writes it. Every
    parameter here is bounded (enum, integer, boolean), so the call ends within the limit.
    Temperature 0 checks that greedy sampling goes through the grammar (no argmax shortcut)."""
    folder = templates_dir()
    if folder is None:
        pytest.skip("llama.cpp's chat templates are not available (no sdist, no network)")
    model_path = with_chat_template(qwen_path, read_template(folder, template), tmp_path / "model.gguf")
    profile = test_profile(model_path)
    settings = dataclasses.replace(profile.sampling, temperature=temperature, seed=seed)
    model = LlamaModel(model_path, profile.model)
    try:
        fmt = model.chat_template.tool_format
        assert fmt is not None and fmt.name == family
        tools = {"tools": [t.template_dict() for t in PROBE_TOOLS]}
        prompt = model.tokenize_segments(
            model.chat_template.segments([ChatMessage("user", "Go fast.")], variables=tools)
        )
        grammar = tool_grammar(fmt, PROBE_TOOLS, "required")
        ctx = LlamaContext(model, profile.context)
        reply: list[int] = []
        try:
            with Sampler(settings, model.n_vocab, prompt, grammar=grammar, vocab=model.vocab) as sampler:
                ctx.decode(prompt)
                for _ in range(200):
                    token = sampler.sample(ctx.ctx)
                    if model.is_eog(token):
                        break
                    reply.append(token)
                    ctx.decode([token])
                else:
                    pytest.fail("the call did not end within 200 tokens")
        finally:
            ctx.close()
        text = b"".join(model.token_bytes(t, special=True) for t in reply).decode()
    finally:
        model.close()
    parsed = fmt.parse(text, PROBE_TOOLS)
    assert parsed.content == "" and len(parsed.calls) == 1, text
    (call,) = parsed.calls
    assert call.error == "" and call.name in ("ping", "set_mode")
    assert call.text == text == fmt.render(call)
