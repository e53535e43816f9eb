"""The stream pacer's budget follows the cores the decode leaves to the UI thread.

The UI renders at up to half a core only when the decode's threads leave it two cores; with one
left over (a one-thread profile such as `cpu-speculate` on 2 cores) it keeps to the shared
budget, 1% of a core (`app/stream_pacer.py`). The core counts are set here, so the answers do
not depend on the machine the tests run on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import velo_chat.app.generation as generation
from velo_chat.app.stream_pacer import StreamPacer, ui_has_own_core
from velo_chat.engine.engine import Engine

from tests.support.engine_helpers import test_profile


@pytest.mark.parametrize(
    ("cores", "decode_threads", "own"),
    [
        (1, 1, False),
        (2, 2, False),
        (2, 1, False),  # one core left over is not the UI's
        (3, 1, True),
        (4, 3, False),
        (4, 2, True),
        (16, 1, True),  # a model on the GPU, one decode thread
        (16, 16, False),
    ],
)
def test_the_ui_has_a_core_of_its_own_only_with_two_left_over(cores, decode_threads, own):
    assert ui_has_own_core(cores, decode_threads) is own


@pytest.fixture(scope="module")
def one_thread_engine(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """SmolLM2 loaded with one decode thread, as `cpu-speculate` decodes."""
    profile = test_profile(smollm2_path, context={"n_threads": 1})
    engine = Engine(profile, checkpoint_root=tmp_path_factory.mktemp("one-thread-checkpoints"))
    engine.load()
    yield engine
    engine.close()


def test_a_one_thread_decode_on_two_cores_paces_the_ui_as_on_shared_cores(one_thread_engine, monkeypatch):
    info = one_thread_engine.info
    assert info is not None
    monkeypatch.setattr(generation, "usable_cores", lambda: 2)
    assert generation.ui_shares_cores(info)
    assert generation._pacer(info).share == StreamPacer.SHARED_CORES_SHARE
    monkeypatch.setattr(generation, "usable_cores", lambda: 16)
    assert not generation.ui_shares_cores(info)
    assert generation._pacer(info).share == StreamPacer.OWN_CORE_SHARE
