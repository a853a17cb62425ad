"""GPT-NeoX: legacy rotary fields, parallel and sequential residual, projection biases
as transformers defaults them."""

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar import pretrained
from helpers.hf_fixtures import (
    config_of,
    copy_checkpoint,
    copy_without,
    expected,
    logits_and_attention,
)


def test_neox_legacy_rotary_fields_and_sequential_residual(tmp_path):
    """Before transformers 5 GPT-NeoX configs named the rotary share `rotary_pct` and the
    base `rotary_emb_base`: same model. Sequential residual differs from parallel, and
    equals it when the attention output is zero (then both add only the MLP of ln2(x))."""
    legacy = {"rope_parameters": None, "rotary_pct": 0.25, "rotary_emb_base": 10000.0}
    folder = copy_checkpoint("neox-tiny", tmp_path, legacy)
    tokens = expected("neox-tiny")["tokens"]
    logits, _ = logits_and_attention(folder, tokens)
    np.testing.assert_allclose(logits, expected("neox-tiny")["logits"], atol=1e-4)

    def silence_attention(weights):
        return {k: (0 * v if ".attention.dense." in k else v) for k, v in weights.items()}

    runs = {}
    for parallel in (True, False):
        for silent in (True, False):
            sub = tmp_path / f"{parallel}-{silent}"
            sub.mkdir()
            change = {"use_parallel_residual": parallel}
            f = copy_checkpoint("neox-tiny", sub, change, silence_attention if silent else None)
            runs[parallel, silent] = np.asarray(logits_and_attention(f, tokens)[0])
    np.testing.assert_allclose(runs[True, True], runs[False, True], atol=1e-6)
    assert np.abs(runs[True, False] - runs[False, False]).max() > 1e-2


def test_neox_residual_is_parallel_when_the_config_does_not_say(tmp_path):
    """transformers' GPT-NeoX defaults `use_parallel_residual` to true: a config that
    leaves it out is the parallel model of the fixture (sequential differs by > 1e-2)."""
    folder = copy_without("neox-tiny", tmp_path, "use_parallel_residual")
    logits, _ = logits_and_attention(folder, expected("neox-tiny")["tokens"])
    np.testing.assert_allclose(logits, expected("neox-tiny")["logits"], atol=1e-4)


def test_neox_projections_have_biases_when_the_config_does_not_say(tmp_path):
    """transformers' GPT-NeoX defaults `attention_bias` to true: a config that leaves it
    out reads the checkpoint's query_key_value and dense biases and is the fixture's
    model; false builds both projections without them."""
    name = "neox-tiny"
    folder = copy_without(name, tmp_path, "attention_bias")
    module, params, _ = pretrained.load(folder)
    assert "bias" in params["layers_0"]["query_key_value"]
    assert "bias" in params["layers_1"]["dense"]
    logits, _ = pretrained.apply_with_attention(module, params, expected(name)["tokens"])
    np.testing.assert_allclose(logits, expected(name)["logits"], atol=1e-4)
    off = pretrained.build({**config_of(name), "attention_bias": False})
    shapes = jax.eval_shape(off.init, jax.random.PRNGKey(0), jnp.zeros((1, 3), jnp.int32))
    block = shapes["params"]["layers_0"]
    assert "bias" not in block["query_key_value"] and "bias" not in block["dense"]
