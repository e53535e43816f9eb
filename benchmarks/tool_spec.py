"""Speculation under the tool-call grammar: a call that copies text from the conversation (an
edit_file whose `old` is a block of a file the model read), decoded with n-gram speculation on
and off, side by side in one process.

The call is forced (`Diagnostics.turn` with `forced_call`: the grammar admits exactly that call
as the template writes it), so both runs decode the same tokens and the ratio is the grammar's
and the drafts' cost alone. Speculation stays on inside a call: a verify batch samples its
positions in order through the grammar and stops at the first mismatch, so the tokens are the
ones a one-token-at-a-time decode picks (docs/tools.md).

    .venv/bin/python benchmarks/tool_spec.py --model MODEL.gguf \
        --template .cache/test-data/llama-cpp-python-0.3.36-templates/Qwen-Qwen2.5-7B-Instruct.jinja

`--template`: a .jinja chat template with tools, for a model whose own has none. Prints one
JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from velo_chat.app.tools.toolbox import ToolBox  # noqa: E402
from velo_chat.engine import ChatMessage, ToolCall, TurnDone, make_engine  # noqa: E402
from velo_chat.engine.config import build_profile  # noqa: E402
from velo_chat.engine.diagnostics import diagnostics  # noqa: E402

SOURCE = Path(__file__).resolve().parents[1] / "app" / "tools" / "loop.py"


def _template(path: str) -> str:
    """A chat template's source from a .jinja file (llama.cpp's collection is cached by the
    test suite in .cache/test-data/llama-cpp-python-0.3.36-templates/)."""
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"--template {path}: no such file")
    return file.read_text(encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--template", default="")
    ap.add_argument("--lines", type=int, default=40, help="lines of the file the call copies")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    text = SOURCE.read_text(encoding="utf-8")
    block = "\n".join(text.splitlines()[60 : 60 + args.lines])
    call = ToolCall("edit_file", {"path": "loop.py", "old": block, "new": block.replace("step", "stage")})
    messages = [
        ChatMessage(
            "user", f"Here is loop.py:\n\n{text}\n\nRename step to stage in lines 61-{60 + args.lines}."
        ),
    ]
    out: dict[str, object] = {
        "model": args.model,
        "template": args.template or "the model's",
        "lines": args.lines,
    }
    for spec in (False, True):
        profile = build_profile(
            "toolspec",
            {
                "model": {"path": args.model},
                "context": {"n_ctx": 8192},
                "sampling": {"temperature": 0.0, "max_tokens": 2048},
                "speculation": {"enabled": spec},
            },
        )
        rates: list[float] = []
        engine = make_engine(profile)
        try:
            engine.load()
            diag = diagnostics(engine)
            specs = ToolBox(Path.cwd(), profile.tools).specs
            swap = diag.chat_template(_template(args.template)) if args.template else contextlib.nullcontext()
            with swap:
                for _ in range(args.repeats):
                    diag.reset()
                    t0 = time.perf_counter()
                    done = [
                        e
                        for e in diag.turn(messages, tools=specs, forced_call=call)
                        if isinstance(e, TurnDone)
                    ][0]
                    assert done.tool_calls and not done.tool_calls[0].error, done.tool_calls
                    rates.append(done.stats.decode_tok_s)
                    out.setdefault("decode_tokens", done.stats.decode_tokens)
                    out.setdefault("wall_s", round(time.perf_counter() - t0, 3))
        finally:
            engine.close()
        out["spec_on" if spec else "spec_off"] = {"decode_tok_s": [round(r, 1) for r in rates]}
    off = statistics.median(out["spec_off"]["decode_tok_s"])  # type: ignore[index]
    on = statistics.median(out["spec_on"]["decode_tok_s"])  # type: ignore[index]
    out["on_over_off"] = round(on / off, 3) if off else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
