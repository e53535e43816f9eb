"""A fresh process for the resume benchmark: load the engine, run one turn, print its stats.

stdin: {"profile_toml": ..., "messages": [{"role", "content", "reasoning_content"?}, ...]};
argv: checkpoint root, model path. stdout: the turn's stats as JSON (`TurnStats.to_json`).
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

from .. import ChatMessage, TurnDone, make_engine
from ..config import build_profile


def main(argv: list[str]) -> int:
    root, model_path = Path(argv[0]), argv[1]
    request = json.loads(sys.stdin.read())
    data = tomllib.loads(request["profile_toml"])
    profile = build_profile("bench-resume", data)
    messages = [
        ChatMessage(m["role"], m["content"], m.get("reasoning_content", "")) for m in request["messages"]
    ]
    engine = make_engine(profile, model_path=model_path, checkpoint_root=root)
    try:
        engine.load()
        for event in engine.turn(messages, max_tokens=1):
            if isinstance(event, TurnDone):
                sys.stdout.write(json.dumps(event.stats.to_json()))
                return 0
    finally:
        engine.close()
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
