"""Prompt rendering: a conversation through the model's own chat template, cut into the
template's scaffolding and the messages' text, tokenized so that message text never becomes
control tokens, and the reply stream split into reasoning and answer for thinking templates.
"""
