"""`tests/support/failure_log.py`: the GPU machine's shards write each failure's traceback as it
happens, so that a run the end of a lease cuts off still says why a test failed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.engine_helpers import pythonpath

REPO = Path(__file__).resolve().parent.parent


def test_a_failure_is_written_with_its_traceback_before_the_run_ends(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        "def test_passes():\n    assert True\n\n\n"
        "def test_fails():\n    wanted = 'forty-two'\n    assert wanted == 'forty-three'\n",
        encoding="utf-8",
    )
    failures = tmp_path / "failures.txt"
    env = {**os.environ, "PYTHONPATH": pythonpath(REPO), "VELO_TEST_FAILURES": str(failures)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.support.failure_log",
            str(tmp_path / "test_sample.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    text = failures.read_text(encoding="utf-8")
    assert "test_sample.py::test_fails (call)" in text and "forty-three" in text
    assert "test_passes" not in text
