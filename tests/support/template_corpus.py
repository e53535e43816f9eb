"""Three-turn sessions on the tiny hybrid qwen4exp with a given chat template, for the corpus test
(`tests/test_template_corpus.py`) and its reuse table.

Each template gets its own copy of the model with that template in its GGUF metadata
(`devkit/gguf_template.py`), so the engine runs exactly as it would on a model that ships it.
Turns go through the app's own path (`start_turn` + `record` into a real session store), once
with the replies as generated and once with every reply rewritten in the store to hold its
reasoning inline (`<think>...</think>` before the answer), as a thinking model's replies do.
Each follow-up is compared with a cold run of the same conversation in a second engine (no
checkpoints, nothing live), token by token.

The engines prefill one token per batch and run one thread: every path then runs the same float
arithmetic, so a difference is a wrong state, never a near tie that two batch shapes broke
differently (tests/test_resume.py says more). One thread also keeps a loaded machine from
stalling ggml's thread barrier.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from velo_chat.app.conversation import record, start_turn, turn_messages
from velo_chat.engine.prompt.chat_template import ChatMessage, ChatTemplateError
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import TokenDelta, TurnDone, TurnFailed, TurnStarted
from velo_chat.engine.live_sequence import common_prefix
from velo_chat.store import SessionStore
from velo_chat.engine.diagnostics import diagnostics

from .engine_helpers import test_profile
from devkit.gguf_template import with_chat_template

REPLY_TOKENS = 8
SYSTEM = "You are a careful assistant. Answer briefly and cite the numbers you use."
QUESTIONS = (
    "Here are the notes from the last review. "
    + " ".join(
        f"Item {i}: the parser drops line {i * 7} when the input ends without a newline." for i in range(8)
    )
    + " Which items matter most?",
    "Why item 3?",
    "And what should we fix first?",
)
VARIANTS = ("plain", "think")


def reasoning_reply(turn: int, text: str) -> str:
    """A stored reply that holds its reasoning inline, as thinking models write them."""
    return f"<think>\nThe user asks about turn {turn}; weigh the items.\n</think>\n\n{text}"


@dataclass
class TurnResult:
    prompt: int  # prompt tokens
    cached: int  # tokens reused (the turn's TurnStarted)
    preview: int  # what the preview said it would reuse
    bound: int  # what a follow-up must reuse at least (`kept_before_reply`; 0 on the first turn)
    tokens: list[int]  # sampled token ids
    cold: list[int] | None = None  # the cold run's token ids (follow-ups)


@dataclass
class TemplateRun:
    name: str
    system: bool  # the conversation has a system prompt (some templates refuse one)
    turns: dict[str, list[TurnResult]] = field(default_factory=dict)


def renders_system(engine: Engine) -> bool:
    """Whether the template renders a system prompt at all (Gemma 2 refuses one)."""
    try:
        diagnostics(engine).tokens_for([ChatMessage("system", SYSTEM), ChatMessage("user", "Hi")])
    except ChatTemplateError:
        return False
    return True


def _profile(model: Path, system: bool, **checkpoints):
    profile = test_profile(
        model,
        context={"n_batch": 1, "n_ubatch": 1, "n_threads": 1},
        sampling={"max_tokens": REPLY_TOKENS},
        checkpoints={"interval_tokens": 0, "min_prefill_tokens": 0, "disk_budget_gib": 0.0, **checkpoints},
    )
    return dataclasses.replace(profile, system_prompt=SYSTEM if system else "")


def _tokens(events) -> tuple[TurnStarted, list[int], TurnDone]:
    started, tokens, done = None, [], None
    for event in events:
        if isinstance(event, TurnStarted):
            started = event
        elif isinstance(event, TokenDelta):
            tokens.append(event.token_id)
        elif isinstance(event, TurnFailed):
            raise AssertionError(f"turn failed: {event.reason}")
        elif isinstance(event, TurnDone):
            done = event
    assert started is not None and done is not None
    return started, tokens, done


def run_template(name: str, source: str, base_model: Path, workdir: Path) -> TemplateRun:
    """Both variants of the three-turn session on a copy of `base_model` with `source`."""
    model = with_chat_template(base_model, source, workdir / f"{name}.gguf")
    try:
        with Engine(_profile(model, True, enabled=False)) as cold:
            cold.load()
            system = renders_system(cold)
            profile = _profile(model, system)
            result = TemplateRun(name, system)
            with (
                SessionStore(workdir / "sessions.sqlite3") as store,
                Engine(profile, checkpoint_root=workdir / "ckpt") as engine,
            ):
                engine.load()
                for variant in VARIANTS:
                    result.turns[variant] = _session(engine, cold, store, profile, variant)
            return result
    finally:
        model.unlink(missing_ok=True)


def _session(engine: Engine, cold: Engine, store: SessionStore, profile, variant: str) -> list[TurnResult]:
    session, out, previous = None, [], None
    for k, question in enumerate(QUESTIONS):
        convo = turn_messages(store, session, profile, question).messages
        prompt = diagnostics(engine).tokens_for(convo)
        preview = engine.preview(convo).cached_tokens
        started_turn = start_turn(store, engine, session=session, profile=profile, text=question)
        session = started_turn.session
        started, tokens, _ = _tokens(record(started_turn.events, started_turn.recorded))
        assert started.prompt_tokens == len(prompt)
        turn = TurnResult(
            len(prompt),
            started.cached_tokens,
            preview,
            kept_before_reply(engine, convo, previous) if previous else 0,
            tokens,
        )
        if k:
            diagnostics(cold).reset()
            turn.cold = _tokens(cold.turn(convo))[1]
        if variant == "think":
            reply = store.messages(session.id)[-1]
            store.update_message(reply.id, content=reasoning_reply(k, reply.content))
        out.append(turn)
        previous = prompt
    return out


def kept_before_reply(engine: Engine, convo: list[ChatMessage], previous: list[int]) -> int:
    """What a follow-up must reuse at least: its tokens before the previous reply's assistant
    header that the previous turn's prompt had too (the conversation up to the previous question
    rendered without a generation prompt, as far as both prompts keep it), and never the
    previous prompt's last token. That one is the exception for templates without an assistant
    header (Mistral's reply follows `[/INST]` directly): the state before a reply is saved one
    token before the end of the prompt, because a restored state has no logits to sample from."""
    model = engine._require()[0]
    before = model.tokenize_segments(model.chat_template.segments(convo[:-2], add_generation_prompt=False))
    prompt = diagnostics(engine).tokens_for(convo)
    return min(common_prefix(prompt, before), common_prefix(prompt, previous), len(previous) - 1)


def reuse_row(run: TemplateRun) -> str:
    """One line of the reuse table: per variant, follow-up 1 and 2 as cached/prompt, with the
    previous prompt's kept tokens (the bound) in brackets."""
    cells = []
    for variant in VARIANTS:
        turns = run.turns.get(variant, [])[1:]
        cells.append(" ".join(f"{t.cached}/{t.prompt} [{t.bound}]" for t in turns))
    return f"| {run.name}{'' if run.system else ' (no system prompt)'} | " + " | ".join(cells) + " |"
