"""The model fingerprint that keys checkpoints: it must change whenever the weights llama.cpp
loads change (any shard of a split model, tensor data under an unchanged header) and stay the
same for the same bytes (a copy elsewhere keeps its checkpoints). Real GGUF files: the
SmolLM2 GGUF, a copy with other tensor data, and SmolLM2 split into shards that llama.cpp loads.
"""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest

from velo_chat.engine.llama import gguf_file
from velo_chat.engine.llama.model import LlamaModel
from velo_chat.engine.config.profile_schema import ModelSettings

from devkit.gguf_split import copy_with_other_data, split_gguf


def fingerprint(path: Path) -> str:
    """What the engine keys checkpoints by: the fingerprint of the loaded model."""
    model = LlamaModel(path, ModelSettings(path=str(path)))
    try:
        return model.fingerprint
    finally:
        model.close()


@pytest.fixture(scope="module")
def split_model(smollm2_path, tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("split") / "smol.gguf"
    return split_gguf(smollm2_path, out, max_tensors=100)


def test_a_copy_elsewhere_keeps_the_fingerprint(smollm2_path, tmp_path):
    copy = tmp_path / "elsewhere.gguf"
    shutil.copyfile(smollm2_path, copy)
    assert fingerprint(copy) == fingerprint(smollm2_path)


def test_same_header_other_tensor_data_is_another_model(smollm2_path, tmp_path):
    other = copy_with_other_data(smollm2_path, tmp_path / "reupload.gguf")
    assert (
        gguf_file.read_header(other).header_sha256 == gguf_file.read_header(smollm2_path).header_sha256
    )  # the header did not change
    assert fingerprint(other) != fingerprint(smollm2_path)


def test_split_models_load_and_their_shards_are_named_as_llama_cpp_names_them(split_model):
    from llama_cpp import llama_cpp as ll

    first = split_model[0]
    header = gguf_file.read_header(first)
    assert gguf_file.shard_paths(header) == split_model
    count = len(split_model)
    for i, path in enumerate(split_model):
        buf = ctypes.create_string_buffer(4096)
        prefix = str(first.parent / "smol").encode()
        ll.llama_split_path(buf, len(buf), prefix, i, count)
        assert buf.value.decode() == str(path)
    assert fingerprint(first)  # llama.cpp loads the split model from its first shard


def test_a_later_shard_changing_changes_the_fingerprint(split_model, tmp_path):
    copies = []
    for path in split_model:
        copies.append(tmp_path / path.name)
        shutil.copyfile(path, copies[-1])
    before = fingerprint(copies[0])
    assert before == fingerprint(split_model[0])  # the same bytes elsewhere: the same model
    copy_with_other_data(split_model[-1], copies[-1])
    assert fingerprint(copies[0]) != before


def test_a_missing_or_foreign_shard_is_a_clear_error(split_model, tmp_path):
    copies = [tmp_path / p.name for p in split_model]
    for src, dst in zip(split_model, copies, strict=True):
        shutil.copyfile(src, dst)
    copies[1].unlink()
    with pytest.raises(gguf_file.GGUFError, match=f"shard 2 of {len(copies)} is missing"):
        fingerprint(copies[0])
    with pytest.raises(gguf_file.GGUFError, match="first shard"):
        fingerprint(copies[-1])
    shutil.copyfile(split_model[2], copies[1])  # shard 3's file under shard 2's name
    with pytest.raises(gguf_file.GGUFError, match="is shard 3"):
        fingerprint(copies[0])


def test_fingerprinting_reads_a_bounded_part_of_the_data(smollm2_path, monkeypatch):
    """A 100 GB model must not be read whole at each start: the sampled data is a fixed
    amount per shard and per tensor, whatever the file size."""
    header = gguf_file.read_header(smollm2_path)
    read = []
    real_pread = gguf_file.os.pread

    def counting_pread(fd, n, offset):
        read.append(n)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(gguf_file.os, "pread", counting_pread)
    gguf_file.model_fingerprint(header)
    assert (
        0
        < sum(read)
        <= gguf_file.SAMPLE_BLOCKS * gguf_file.SAMPLE_BYTES
        + len(header.tensors) * gguf_file.TENSOR_SAMPLE_BYTES
    )
    assert sum(read) < header.file_size // 10
