"""A model run from one layer's input: even blocks of logits, blocked cross-entropy equal
to the whole logits', and the layer's range. (Equality with the whole forward under
every mask, in float64, is in test_coalition_loss.py.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from beyondpar import model as model_lib
from beyondpar import pretrained, pruning
from beyondpar.pruning import layer_slice
from helpers.hf_fixtures import HF

SMALL = dict(vocab_size=11, embed_dim=16, num_layers=3, mlp_dim=24, max_len=12, num_heads=4)


@pytest.fixture(scope="module")
def small():
    """Three layers: the two of a 2-layer initialisation (the program the other pruning
    tests compile) and a third, layer 0 times 0.8, so that a layer run twice, skipped or
    read from its neighbour shows."""
    module = model_lib.Transformer(model_lib.ModelConfig(**SMALL))
    two = model_lib.Transformer(model_lib.ModelConfig(**{**SMALL, "num_layers": 2}))
    params = model_lib.init_params(two, jax.random.PRNGKey(0))
    params = {**params, "layers_2": jax.tree.map(lambda p: 0.8 * p, params["layers_0"])}
    tokens = np.random.default_rng(1).integers(0, 11, (3, 12))
    return module, params, tokens


@functools.partial(jax.jit, static_argnums=0)
def _unembedded_losses(module, params, x, targets):
    """The logits of a stream and their cross-entropy in float32, as one program."""
    logits = model_lib.unembed(module, params, x)
    return logits, optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets
    )


# The whole forward's losses as one program (op by op, every operation compiles alone).
_direct = jax.jit(pruning.sequence_losses, static_argnums=0)


@pytest.mark.parametrize(
    "tokens,vocab,most,want",
    [
        (8192, 49152, 2**24, 328),  # SmolLM2's 64 windows of 128: 25 blocks, 8 pad tokens
        (36, 11, 7 * 11, 6),  # at most 7 tokens: 6 blocks of 6
        (36, 11, 2**24, 36),  # one block
        (5, 100, 10, 1),  # fewer logits than one token's: one token a block
    ],
)
def test_block_tokens_are_the_evenest_blocks_within_the_budget(tokens, vocab, most, want):
    assert layer_slice.block_tokens(tokens, vocab, most) == want
    blocks = -(-tokens // want)
    assert want * vocab <= max(most, vocab) and blocks * want - tokens < blocks


@pytest.mark.parametrize("logits_per_block", [None, 5 * 11, 11])
def test_blocked_losses_are_the_whole_logits_cross_entropy(small, logits_per_block):
    module, params, tokens = small
    targets = np.roll(tokens, -1, axis=1)
    x = layer_slice.run_from(module, params, layer_slice.stream_into(module, params, tokens, 0), 0)
    got = layer_slice.sequence_losses(module, params, x, targets, logits_per_block)
    # The whole forward (every head kept): the program the masked test's reference runs.
    want = _direct(module, params, tokens, targets, np.ones((3, 3, 4), np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("layer", [-1, 3, 1.0])
def test_a_layer_out_of_range_is_refused(small, layer):
    module, params, tokens = small
    with pytest.raises(ValueError, match=r"layer must be an integer in \[0, 3\)"):
        layer_slice.stream_into(module, params, tokens, layer)


def _llama():
    module, params, _ = pretrained.load(HF / "llama-tiny", progress=False)
    return module, params


@pytest.mark.parametrize("family", ["paper", "llama"])
@pytest.mark.parametrize("layer", [0, 1])
def test_a_layer_under_a_per_sequence_mask_is_the_whole_masked_forward(small, family, layer):
    """The stream entering `layer`, then that layer under a (B, H) mask and the later
    ones whole, in blocks of 5 tokens (the last padded): the whole forward's losses under
    the (B, L, H) mask that masks only `layer`."""
    module, params = small[:2] if family == "paper" else _llama()
    cfg = module.config
    tokens = small[2]
    targets = np.roll(tokens, -1, axis=1)
    mask = np.random.default_rng(layer).uniform(size=(3, cfg.num_heads)).astype(np.float32)
    mask[0, 1] = mask[2, :2] = 0.0
    x = layer_slice.stream_into(module, params, tokens, layer)
    out = layer_slice.run_from(module, params, x, layer, mask)
    got = layer_slice.sequence_losses(module, params, out, targets, 5 * cfg.vocab_size)
    whole = np.ones((3, cfg.num_layers, cfg.num_heads), np.float32)
    whole[:, layer] = mask
    want = _direct(module, params, tokens, targets, whole)
    assert got.shape == (3,)
    np.testing.assert_allclose(got, want, rtol=2e-6)


def test_bfloat16_logits_are_scored_in_float32(small):
    module, params, tokens = small
    params = jax.tree.map(lambda p: np.asarray(p).astype(jnp.bfloat16), params)
    targets = np.roll(tokens, -1, axis=1)
    x = layer_slice.run_from(module, params, layer_slice.stream_into(module, params, tokens, 0), 0)
    x = x.astype(jnp.bfloat16)
    got = layer_slice.sequence_losses(module, params, x, targets, 4 * 11)
    logits, want = _unembedded_losses(module, params, x, targets)
    assert logits.dtype == jnp.bfloat16 and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want.mean(-1), rtol=1e-6)
