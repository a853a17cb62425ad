"""Test helper: the tiny Hugging Face fixtures under data/hf, their expected outputs, and
copies of them with config fields or tensors changed."""

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from beyondpar import pretrained
from helpers.paths import DATA

HF = DATA / "hf"
# Fixtures for the reading of one config field each (the families' own fixtures check
# the rest, sharding included): an untied GPT-2 head (`lm_head.weight`); GPT-NeoX with no
# rotary share given (transformers' 0.25); Llama's default rope with a partial factor
# (ignored: every feature turns) and with `layer_types` naming a sliding layer (Llama has
# no window); Qwen2 with `use_sliding_window` and no `max_window_layers` (28: no layer of
# two slides), and Qwen2 itself (q/k/v biases, windows from layer 1); llama3 rope with a
# top-level `original_max_position_embeddings` (it wins over the rope dict's), and with
# frequencies in its blended band (blended in float32); Llama with `head_dim` 12, whose
# rotation rates NumPy's float32 power puts a bit off transformers' in two of six; Qwen2
# with `yarn` rope (factor 4 from 32 tokens, `beta_fast` 16: a rate on the ramp, and the
# attention factor 0.1 ln 4 + 1 on cos and sin).
CONFIG_VARIANTS = (
    "rope-rates-hd12",
    "qwen2-yarn",
    "gpt2-untied",
    "neox-rotary-default",
    "llama-partial-rotary",
    "llama-layer-types",
    "qwen2-window-layers-default",
    "qwen2-tiny",
    "llama3-top-original",
    "llama3-smooth",
)
# One fixture per family and per layout of it (see tests/README.md).
FAMILIES = (
    "gpt2-tiny",
    "llama-tiny",
    "llama3-rope",
    "neox-tiny",
    "qwen3-tiny",
    "mistral-window",
    "gemma2-tiny",
    "gemma3-tiny",
    "phi3-tiny",
    "gemma2-pattern",
    "gemma3-legacy",
    "gemma3-multimodal",
    "phi3-longrope",
)


# Six layers of peaked attention: transformers' own float32 forward is 1.6e-5 away from
# this fixture's float64 attention (its float64 forward 7.5e-6), so float32 gets 2e-5.
# Phi-3's long rope factors rotate by large angles, where float32 sine and cosine differ
# between CPUs: 2 of 147,456 probabilities 1.4e-5 away on one (AMD EPYC), under 1e-5 on
# another.
ATTENTION_ATOL = {"gemma3-tiny": 2e-5, "phi3-longrope": 2e-5}


def expected(name: str) -> dict:
    return dict(np.load(HF / name / "expected.npz"))


def copy_checkpoint(name, tmp_path, config=None, tensors=None) -> Path:
    """A copy of a fixture folder with config fields and tensors changed."""
    folder = tmp_path / name
    shutil.copytree(HF / name, folder)
    if config is not None:
        data = json.loads((folder / "config.json").read_text())
        data.update(config)
        (folder / "config.json").write_text(json.dumps(data))
    if tensors is not None:
        weights = load_file(folder / "model.safetensors")
        save_file(tensors(weights), folder / "model.safetensors")
    return folder


def copy_without(name, tmp_path, key):
    """A copy of a fixture folder whose config.json leaves `key` out."""
    folder = tmp_path / name
    shutil.copytree(HF / name, folder)
    config = json.loads((folder / "config.json").read_text())
    del config[key]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def logits_and_attention(folder, tokens=None, dtype=None):
    module, params, _ = pretrained.load(folder, dtype)
    tokens = expected("llama-tiny")["tokens"] if tokens is None else tokens
    return pretrained.apply_with_attention(module, params, tokens)


def config_of(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())
