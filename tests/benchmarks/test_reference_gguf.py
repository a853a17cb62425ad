"""The reference GGUF reader's own conventions, checked against llama.cpp's converter as
the tests' exporter writes it: tensor names, the Llama q/k row order, what it refuses."""

import gguf
import numpy as np
import pytest

from beyondpar.benchmarks import reference_gguf
from helpers.gguf_export import export, permute
from helpers.paths import DATA


def test_row_order_pairs_each_heads_halves():
    """Two heads of 4 rows: Hugging Face's rows 0, 1 (first half) and 2, 3 (second) of
    a head are stored as the pairs (0, 2), (1, 3), i.e. at rows 0, 2, 1, 3."""
    np.testing.assert_array_equal(reference_gguf.hf_row_order(8, 2), [0, 2, 1, 3, 4, 6, 5, 7])


@pytest.mark.parametrize("heads", [1, 2, 3])
def test_row_order_undoes_the_converters_permute(heads):
    hf = np.random.default_rng(heads).normal(size=(heads * 6, 5))
    stored = permute(hf, heads)
    assert not np.array_equal(stored, hf)
    order = reference_gguf.hf_row_order(len(hf), heads)
    np.testing.assert_array_equal(stored[order], hf)
    np.testing.assert_array_equal(permute(hf[:, 0], heads)[order], hf[:, 0])  # a bias


@pytest.mark.parametrize(
    "hf,stored",
    [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
        ("model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"),
        ("model.layers.11.self_attn.q_proj.bias", "blk.11.attn_q.bias"),
        ("model.layers.2.self_attn.o_proj.weight", "blk.2.attn_output.weight"),
        ("model.layers.2.self_attn.k_norm.weight", "blk.2.attn_k_norm.weight"),
        ("model.layers.3.post_attention_layernorm.weight", "blk.3.ffn_norm.weight"),
        ("model.layers.3.mlp.down_proj.weight", "blk.3.ffn_down.weight"),
    ],
)
def test_gguf_names_of_llama_tensors(hf, stored):
    assert reference_gguf.gguf_name(hf) == stored


def test_a_tensor_outside_the_llama_family_has_no_name():
    with pytest.raises(ValueError, match="'h.0.attn.c_attn.weight' must be a Llama-family"):
        reference_gguf.gguf_name("h.0.attn.c_attn.weight")


def test_files_it_does_not_fully_read_are_refused(tmp_path):
    gpt2 = export(DATA / "hf" / "gpt2-tiny", tmp_path / "gpt2.gguf")
    with pytest.raises(ValueError, match=r"general.architecture must be one of .*got 'gpt2'"):
        reference_gguf.ReferenceGguf(gpt2)
    window = export(DATA / "hf" / "mistral-window", tmp_path / "mistral.gguf")
    with pytest.raises(ValueError, match=r"must hold none of \['attention.sliding_window'\]"):
        reference_gguf.ReferenceGguf(window)


@pytest.mark.parametrize(
    "name,extra,unread",
    [
        ("llama-tiny", lambda w: w.add_rope_scaling_factor(2.0), "rope.scaling.factor"),
        (
            "llama-tiny",
            lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR),
            "rope.scaling.type",
        ),
        ("llama3-rope", None, "rope_freqs.weight"),
    ],
)
def test_files_with_a_scaled_rope_are_refused(tmp_path, name, extra, unread):
    """A scaled rope or Llama 3's rope divisors would change the model; this reader does
    not read them, so it must not give a model without them."""
    path = export(DATA / "hf" / name, tmp_path / "model.gguf", extra=extra)
    with pytest.raises(ValueError, match=rf"must hold none of \['{unread}'\]"):
        reference_gguf.ReferenceGguf(path)
