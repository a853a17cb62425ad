"""Path arguments that are not what a call reads: nothing there is a `MissingPathError`
(a ValueError, like every bad argument, and a FileNotFoundError); something of the wrong
kind there is a plain ValueError."""

import json

import pytest

from beyondpar import checkpoints, pretrained
from beyondpar.analysis import windowing
from beyondpar.base import checks
from beyondpar.pretrained import gguf_file, hf_folder
from beyondpar.study import config_lib, evaluate, workdir


def _folder_with_config(path):
    path.mkdir()
    (path / hf_folder.CONFIG).write_text("{}")
    return path


def _index_of_an_absent_shard(path):
    _folder_with_config(path)
    weight_map = {"weight_map": {"w": "model-00002-of-00002.safetensors"}}
    (path / hf_folder.INDEX).write_text(json.dumps(weight_map))
    return path


MISSING = [
    (lambda p: checkpoints.load(p), "directory must hold orbax checkpoints, got none in"),
    (lambda p: checkpoints.import_reference(p / "4_heads_copy.npz", 4), "existing checkpoint"),
    (
        lambda p: pretrained.load(p / "model"),
        "must be a checkpoint folder, a GGUF file or a model name",
    ),
    (lambda p: pretrained.load("tiny-org/absent"), "neither a folder nor in the local"),
    (lambda p: pretrained.load(p), "checkpoint folder must hold config.json, got none"),
    (lambda p: hf_folder.shard_files(_folder_with_config(p / "m")), "must hold model.safetensors"),
    (lambda p: hf_folder.shard_files(_index_of_an_absent_shard(p / "m")), "shards that are absent"),
    (lambda p: hf_folder.read_tokenizer(p), "must hold tokenizer.json, got none"),
    (lambda p: evaluate.reference_files(p / "reference"), "reference folder must be an existing"),
    (lambda p: evaluate.reference_files(p), r"no <H>_heads_<task>.npz or .pt files"),
    (lambda p: evaluate.evaluate_tree(p / "runs"), "runs directory must be an existing"),
    (lambda p: evaluate.evaluate_tree(p, progress=False), "no runs under"),
    (lambda p: config_lib.load_config_file(p / "cpu.py"), "base config must be an existing file"),
    (lambda p: windowing.read_documents(p / "c.txt"), "--corpus .* is neither a file nor a folder"),
    (lambda p: windowing.fingerprint(p / "c.jsonl"), "--corpus .* is neither a file nor a folder"),
    (lambda p: pretrained.load_gguf(p / "m.gguf"), "must be a GGUF file or a folder holding one"),
    (lambda p: workdir.read_config(p), "a run folder must hold config.json, got none"),
    (lambda p: gguf_file.GgufFile(p / "m.gguf"), "path must be an existing GGUF file, got"),
]


@pytest.mark.parametrize("call, message", MISSING)
def test_a_path_that_names_nothing_is_a_value_error_and_a_file_not_found_error(
    tmp_path, monkeypatch, call, message
):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(checks.MissingPathError, match=message) as raised:
        call(tmp_path)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, FileNotFoundError)


WRONG_KIND = [
    (lambda p: checkpoints.import_reference(p, 4), "must be an existing checkpoint file"),
    (
        lambda p: pretrained.load(p / "notes.txt"),
        "must be a checkpoint folder, a GGUF file or a model name",
    ),
    (
        lambda p: evaluate.reference_files(p / "notes.txt"),
        "reference folder must be an existing folder",
    ),
    (
        lambda p: evaluate.evaluate_tree(p / "notes.txt"),
        "runs directory must be an existing folder",
    ),
    (lambda p: config_lib.load_config_file(p), "base config must be an existing file"),
    (lambda p: gguf_file.GgufFile(p), "path must be an existing GGUF file, got"),
]


@pytest.mark.parametrize("call, message", WRONG_KIND)
def test_a_path_of_the_wrong_kind_is_a_value_error_only(tmp_path, call, message):
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match=message) as raised:
        call(tmp_path)
    assert not isinstance(raised.value, FileNotFoundError)
