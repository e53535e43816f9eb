"""velo-chat's engine: a chat model run in this process by llama.cpp (or by a remote server),
one turn at a time, as a stream of plain events.

This package root is the engine's public surface; the app and the CLI import nothing else of
the engine but its service packages (`velo_chat.engine.config`, `.fit`, `.setup`, `.bench`):

    engine = make_engine(profile)         # an EngineAPI, not loaded yet
    engine.check()                        # DoesNotFit, GGUFError, ... before anything is loaded
    info = engine.load()                  # ModelLoaded
    with engine.turn(messages) as turn:   # a TurnHandle: iterate its events, cancel(), close()
        for event in turn: ...
    engine.close()

Importing it loads no llama.cpp (the in-process engine imports it when one is made).
"""

from .api import EngineAPI, TurnHandle
from .backends import make_engine
from .errors import (
    CgroupError,
    ChatTemplateError,
    ContextCreateError,
    DefaultModelMissing,
    DoesNotFit,
    GGUFError,
    ModelLoadError,
    ProfileError,
    PromptTooLong,
    RemoteError,
    RequantizeError,
    SpecSourceError,
)
from .events import (
    CheckpointSaved,
    CheckpointStats,
    EngineEvent,
    EngineWarning,
    LlamaTimings,
    LocalModel,
    ModelLoaded,
    ModelLoading,
    PleInfo,
    PrefillProgress,
    ResumePreview,
    SavedCheckpoint,
    ServerStats,
    SpeculationInfo,
    SpeculationStats,
    ThreadsInfo,
    TokenDelta,
    TurnDone,
    TurnFailed,
    TurnStarted,
    TurnStats,
)
from .prompt.chat_template import ChatMessage
from .tools import ParsedReply, ToolCall, ToolSpec
from .prompt.files import FileText, render_block, render_user_content
from .reply import Reply
from .prompt.thinking import ThinkingSupport
from .scheduling.threads import preview_plan as preview_thread_plan
from .scheduling.threads import usable_cores

__all__ = [
    # the engine
    "EngineAPI",
    "TurnHandle",
    "make_engine",
    "ChatMessage",
    "ParsedReply",
    "ToolCall",
    "ToolSpec",
    "FileText",
    "render_block",
    "render_user_content",
    "Reply",
    "ThinkingSupport",
    "preview_thread_plan",
    "usable_cores",
    # events
    "CheckpointSaved",
    "CheckpointStats",
    "EngineEvent",
    "EngineWarning",
    "LlamaTimings",
    "LocalModel",
    "ModelLoaded",
    "ModelLoading",
    "PleInfo",
    "PrefillProgress",
    "ResumePreview",
    "SavedCheckpoint",
    "ServerStats",
    "SpeculationInfo",
    "SpeculationStats",
    "ThreadsInfo",
    "TokenDelta",
    "TurnDone",
    "TurnFailed",
    "TurnStarted",
    "TurnStats",
    # errors
    "CgroupError",
    "ChatTemplateError",
    "ContextCreateError",
    "DefaultModelMissing",
    "DoesNotFit",
    "GGUFError",
    "ModelLoadError",
    "ProfileError",
    "PromptTooLong",
    "RemoteError",
    "RequantizeError",
    "SpecSourceError",
]
