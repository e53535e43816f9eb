"""Requantizing a GGUF (`engine/setup/requantize.py`, `velo-chat requantize`, the
`default-q8_0` model path): llama.cpp's real quantizer on the real SmolLM2 file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from velo_chat.engine.llama import gguf_file
from velo_chat.engine.diagnostics import diagnostics
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import TokenDelta
from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.setup import default_model
from velo_chat.engine.setup.requantize import RequantizeError, derived_name, requantize

from tests.support.engine_helpers import run_cli, test_profile

GGML_Q4_1, GGML_Q8_0 = 3, 8


def _types(path: Path) -> dict[str, int]:
    return {t.name: t.ggml_type for t in gguf_file.read_header(path).tensors}


@pytest.mark.parametrize(
    ("name", "derived"),
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q8_0.gguf"),
        ("model-q4_k_m.gguf", "model.Q8_0.gguf"),
        ("Qwen3-IQ4_NL.gguf", "Qwen3.Q8_0.gguf"),
        ("weights-f16.gguf", "weights.Q8_0.gguf"),
        ("plain.gguf", "plain.Q8_0.gguf"),
    ],
)
def test_derived_name_says_what_the_copy_holds(name: str, derived: str) -> None:
    assert derived_name(Path(name), "q8_0") == derived


def test_requantized_copy_holds_q8_0_weights(smollm2_path: Path, smollm2_q8_path: Path) -> None:
    before, after = _types(smollm2_path), _types(smollm2_q8_path)
    assert before.keys() == after.keys()
    q4_1 = [n for n, t in before.items() if t == GGML_Q4_1]
    assert len(q4_1) > 100  # every matrix of every layer
    assert all(after[n] == GGML_Q8_0 for n in q4_1)
    assert all(after[n] == t for n, t in before.items() if t != GGML_Q4_1)  # norms stay F32
    header = gguf_file.read_header(smollm2_q8_path)
    assert header.metadata["general.architecture"] == "llama"
    assert oct(smollm2_q8_path.stat().st_mode & 0o777) == "0o600"


def test_requantized_model_answers_like_the_source(
    smollm2_path: Path, smollm2_q8_path: Path, tmp_path: Path
) -> None:
    """The same model: its greedy reply starts with the same tokens. Q8_0 holds the Q4_1
    weights to about 1/250 of each block's range, so the logits move a little, and a reply
    may part at a near-tie; weights mapped wrongly part at the first. The question is one
    whose first four tokens lead the next best by 1.6 logits or more in both files: a question
    that opens at a near-tie (0.2-0.4 apart for "What is the capital of France?") parts at
    its first token between the CPU's kernels and the GPU's, which round otherwise."""
    replies = []
    for path in (smollm2_path, smollm2_q8_path):
        with Engine(test_profile(path), checkpoint_root=tmp_path / path.stem) as engine:
            engine.load()
            messages = [ChatMessage("user", "Repeat after me: the quick brown fox jumps over the lazy dog.")]
            # past an end of generation: where it falls can differ by a token between the two
            # (and between the CPU's kernels and a GPU's)
            with diagnostics(engine).turn(messages, max_tokens=12, ignore_eos=True) as turn:
                replies.append([e.token_id for e in turn if isinstance(e, TokenDelta)])
    assert len(replies[0]) == len(replies[1]) == 12
    assert replies[1][:4] == replies[0][:4]


def test_failure_leaves_nothing_behind(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)  # a GGUF magic and nothing whole behind it
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RequantizeError) as exc:
        requantize(bad, out / "x.gguf", "q8_0")
    assert "\n" not in str(exc.value)
    assert list(out.iterdir()) == []


def test_refuses_what_it_cannot_do(smollm2_path: Path, tmp_path: Path) -> None:
    with pytest.raises(RequantizeError, match="choose one of q8_0"):
        requantize(smollm2_path, tmp_path / "x.gguf", "q2_k")
    with pytest.raises(RequantizeError, match="overwrite its source"):
        requantize(smollm2_path, smollm2_path, "q8_0")
    with pytest.raises(RequantizeError, match="no such folder"):
        requantize(smollm2_path, tmp_path / "missing" / "x.gguf", "q8_0")
    with pytest.raises(RequantizeError, match="not found"):
        requantize(tmp_path / "absent.gguf", tmp_path / "x.gguf", "q8_0")


def test_default_q8_0_is_made_once_from_the_verified_download(velo_home: Path) -> None:
    path = default_model.require_builtin("default-q8_0")
    assert path == default_model.builtin_path("default-q8_0")
    assert path.name == "SmolLM2-135M-Instruct.Q8_0.gguf"
    assert set(_types(path).values()) <= {0, GGML_Q8_0}  # F32 norms, Q8_0 matrices
    mtime = path.stat().st_mtime_ns
    assert default_model.require_builtin("default-q8_0") == path
    assert path.stat().st_mtime_ns == mtime  # kept, not made again
    # a copy that is not the one made (truncated by a crash of another program, replaced by
    # hand) is made again rather than loaded
    with path.open("r+b") as fh:
        fh.truncate(1000)
    os.utime(path, ns=(mtime, mtime + 10**9))
    assert default_model.require_builtin("default-q8_0").stat().st_size > 100 * 2**20


def test_default_q8_0_without_the_download_says_how_to_get_it(bare_home: Path) -> None:
    with pytest.raises(default_model.DefaultModelMissing, match="velo-chat fetch-model"):
        default_model.require_builtin("default-q8_0")


def test_cli_writes_the_copy_and_refuses_bad_input(smollm2_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    ok = run_cli("requantize", str(smollm2_path), "--out", str(out))
    assert ok.returncode == 0, ok.stderr
    assert str(out) in ok.stderr and _types(out)["blk.0.ffn_up.weight"] == GGML_Q8_0
    for args, words in [
        ((str(smollm2_path), "--out", str(out)), "exists; pass --overwrite"),
        ((str(tmp_path / "absent.gguf"),), "model file not found"),
        ((str(tmp_path),), "directory"),
        ((str(smollm2_path), "--out", str(tmp_path / "no" / "m.gguf")), "no such folder"),
    ]:
        r = run_cli("requantize", *args)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("velo-chat: error: ") and words in lines[0], r.stderr
    again = run_cli("requantize", str(smollm2_path), "--out", str(out), "--overwrite")
    assert again.returncode == 0, again.stderr


def test_progress_counts_every_tensor_once(smollm2_path: Path, tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    requantize(
        smollm2_path, tmp_path / "m.gguf", "q8_0", progress=lambda done, total: seen.append((done, total))
    )
    n = len(gguf_file.read_header(smollm2_path).tensors)
    assert seen == [(i, n) for i in range(1, n + 1)]


def test_a_failing_progress_callback_does_not_stop_the_copy(smollm2_path: Path, tmp_path: Path) -> None:
    calls = []

    def broken(done: int, total: int) -> None:
        calls.append(done)
        raise RuntimeError("a bug in the caller's progress display")

    out = requantize(smollm2_path, tmp_path / "m.gguf", "q8_0", progress=broken)
    assert _types(out)["blk.0.ffn_up.weight"] == GGML_Q8_0
    assert len(calls) == len(gguf_file.read_header(smollm2_path).tensors)


def test_cli_shows_progress_on_a_terminal_only(smollm2_path: Path, tmp_path: Path) -> None:
    import pty
    import subprocess
    import sys

    n = len(gguf_file.read_header(smollm2_path).tensors)
    piped = run_cli("requantize", str(smollm2_path), "--out", str(tmp_path / "piped.gguf"))
    assert piped.returncode == 0 and "tensor" not in piped.stderr, piped.stderr
    leader, follower = pty.openpty()
    cmd = [sys.executable, "-m", "velo_chat.app.cli", "requantize", str(smollm2_path)]
    child = subprocess.Popen(
        [*cmd, "--out", str(tmp_path / "tty.gguf")], stdout=subprocess.DEVNULL, stderr=follower
    )
    os.close(follower)
    shown = b""
    try:
        while True:  # read as it is written: a full terminal buffer would stop the child
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child's end is closed: everything was read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
        assert child.wait(timeout=300) == 0
    text = shown.decode()
    assert f"tensor 1/{n}" in text and f"tensor {n}/{n}" in text
    after = text.split(f"tensor {n}/{n}", 1)[1]
    assert after.startswith("\r\x1b[K") and "wrote " in after  # the progress line cleared first
