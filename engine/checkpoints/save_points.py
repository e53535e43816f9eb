"""Where a turn's prefill saves the state that later turns can resume from.

A hybrid model (recurrent layers) resumes only from a state saved after an exact prefix of the
new prompt. The state at the end of this turn's prompt is such a prefix for a regenerate, but
often not for a follow-up: thinking-model templates rewrite the reply once the conversation moves
on. Qwen3.5 opens the reply with `<think>\\n` in the generation prompt and shows earlier replies
without their reasoning; QwQ, DeepSeek-R1 and GLM drop the reasoning of earlier replies too. The
follow-up's tokens then leave this turn's prompt a few tokens before its end, and a checkpoint
saved at the end of the prompt lies past that point: nothing of the conversation is reused.

`stable_prefix` finds, before the prefill, how much of this turn's prompt every continuation of
the conversation keeps: it renders the conversation followed by a placeholder reply and a
placeholder next question (a reply with and one without reasoning) and takes the common prefix
with this turn's tokens. The generation prompt and whatever the template rewrites later fall
outside it. The prefill saves the state there; after the reply, `close_boundary` restores it and
prefills the reply as the next turn will render it.

`shared_point` is where every *new* session of a profile agrees: the system prompt (with the
tools the template renders into it) up to where the first question's text begins
(`PromptRenderer.shared_prefix`). A hybrid model reuses it only from a state saved exactly
there, so the prefill saves one there the first time it passes it; then the first turn of every
later session, in this process or after a restart, prefills only its own question.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ..prompt.chat_template import ChatMessage, ChatTemplateError
from ..live_sequence import RESTORE_MIN_GAIN, common_prefix

log = logging.getLogger(__name__)

TokensFor = Callable[[list[ChatMessage]], list[int]]

PLACEHOLDER_REPLIES = ("A", "<think>\nB\n</think>\n\nC")
"""Replies the continuations are rendered with: a plain answer, and one with its reasoning
inline (a template that treats a reply with reasoning differently shows it here)."""
PLACEHOLDER_QUESTION = "D"


def stable_prefix(tokens_for: TokensFor, messages: Sequence[ChatMessage], tokens: Sequence[int]) -> int:
    """The number of leading tokens of `tokens` (this turn's prompt for `messages`) that the
    conversation keeps whatever the reply and the next question are. 0 when a continuation
    cannot be rendered (a template that refuses our placeholder messages)."""
    n = len(tokens)
    for reply in PLACEHOLDER_REPLIES:
        convo = [*messages, ChatMessage("assistant", reply), ChatMessage("user", PLACEHOLDER_QUESTION)]
        try:
            after = tokens_for(convo)
        except ChatTemplateError as exc:
            log.debug("no stable prefix: a continuation does not render (%s)", exc)
            return 0
        n = min(n, common_prefix(tokens, after))
    return n


def shared_point(shared: int, start: int, end: int, min_tokens: int) -> int | None:
    """Where this turn's prefill (from `start` to `end`) saves the state of the shared prefix
    (`shared` tokens of its prompt, `PromptRenderer.shared_prefix`), or None.

    None when the turn starts at or past it (it was restored, or the live context holds it),
    when it is not inside the prefill, or when it is shorter than `min_tokens` (the profile's
    `min_prefill_tokens`) or `RESTORE_MIN_GAIN`: a conversation without a system prompt shares
    only the template's opening, cheaper to prefill than a state is to copy. A state that is
    saved already is not saved twice (`Checkpoints.save` skips its key)."""
    if shared < max(min_tokens, RESTORE_MIN_GAIN) or not start < shared < end:
        return None
    return shared
