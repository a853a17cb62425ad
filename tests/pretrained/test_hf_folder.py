"""Hugging Face checkpoint folders: sharded weights, the local cache, missing and
damaged files named."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from beyondpar import pretrained
from helpers.hf_fixtures import (
    HF,
    copy_checkpoint,
    expected,
    logits_and_attention,
)


def test_sharded_checkpoint_equals_single_file(tmp_path):
    folder = copy_checkpoint("llama-tiny", tmp_path)
    weights = load_file(folder / "model.safetensors")
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2]}
    shards["model-00002-of-00002.safetensors"] = names[1::2]
    for file, keys in shards.items():
        save_file({k: weights[k] for k in keys}, folder / file)
    index = {"weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model.safetensors").unlink()
    logits, _ = logits_and_attention(folder)
    np.testing.assert_allclose(logits, expected("llama-tiny")["logits"], atol=1e-4)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"absent: \['model-00002-of-00002.safetensors'\]"):
        pretrained.load(folder)


def test_model_name_resolves_in_the_local_cache(tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "models--tiny-org--llama"
    snapshot = repo / "snapshots" / "abc123"
    shutil.copytree(HF / "llama-tiny", snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    module, _, _ = pretrained.load("tiny-org/llama")
    assert module.config.num_kv_heads == 2
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    with pytest.raises(
        FileNotFoundError, match=r"nor in the local .*elsewhere/models--tiny-org--llama/refs/main"
    ):
        pretrained.load("tiny-org/llama")


def test_bad_folders_name_what_is_missing(tmp_path):
    for missing, message in [
        ("config.json", "must hold config.json, got none"),
        ("tokenizer.json", "must hold tokenizer.json, got none"),
        ("model.safetensors", "must hold model.safetensors or model.safetensors.index.json"),
    ]:
        folder = copy_checkpoint("gpt2-tiny", tmp_path / missing.split(".")[0])
        (folder / missing).unlink()
        with pytest.raises(FileNotFoundError, match=message):
            pretrained.load(folder)
    with pytest.raises(
        FileNotFoundError, match="must be a checkpoint folder, a GGUF file or a model name"
    ):
        pretrained.load(tmp_path / "no" / "such" / "folder")


def test_missing_tokenizer_is_a_value_error_and_a_file_not_found_error(tmp_path):
    folder = copy_checkpoint("gpt2-tiny", tmp_path)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="must hold tokenizer.json, got none") as raised:
        pretrained.load(folder)
    assert isinstance(raised.value, FileNotFoundError)


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda f: f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2]), "weights file"),
        (lambda f: f.write_bytes(b"\x00" * 16), "weights file"),
    ],
)
def test_damaged_weights_file_is_one_error_naming_it(tmp_path, damage, message):
    folder = copy_checkpoint("llama-tiny", tmp_path)
    damage(folder / "model.safetensors")
    with pytest.raises(ValueError, match=rf"{message} {folder / 'model.safetensors'}"):
        pretrained.load(folder)


def test_damaged_index_and_tokenizer_files_are_named(tmp_path):
    folder = copy_checkpoint("llama-tiny", tmp_path)
    (folder / "model.safetensors.index.json").write_text('{"weight_map": ')
    with pytest.raises(ValueError, match="model.safetensors.index.json is not valid JSON"):
        pretrained.load(folder)
    (folder / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(ValueError, match="must map tensor names to files under 'weight_map'"):
        pretrained.load(folder)
    (folder / "model.safetensors.index.json").unlink()
    (folder / "tokenizer.json").write_text("not json")
    with pytest.raises(ValueError, match="tokenizer.json is not a valid tokenizer file"):
        pretrained.load(folder)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json must hold a JSON object, got list"):
        pretrained.load(folder)
