"""A model run from one layer's input: even blocks of logits, blocked cross-entropy equal
to the whole logits', and the layer's range. (Equality with the whole forward under
every mask, in float64, is in test_coalition_loss.py.)"""

import jax
import numpy as np
import optax
import pytest

from beyondpar import model as model_lib
from beyondpar.pruning import layer_slice

SMALL = dict(vocab_size=11, embed_dim=16, num_layers=3, mlp_dim=24, max_len=12, num_heads=4)


@pytest.fixture(scope="module")
def small():
    module = model_lib.Transformer(model_lib.ModelConfig(**SMALL))
    params = model_lib.init_params(module, jax.random.PRNGKey(0))
    tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(1), (3, 12), 0, 11))
    return module, params, tokens


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
    logits = module.apply({"params": params}, tokens)
    want = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean(-1)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("layer", [-1, 3, 1.0])
def test_a_layer_out_of_range_is_refused(small, layer):
    module, params, tokens = small
    with pytest.raises(ValueError, match=r"layer must be an integer in \[0, 3\)"):
        layer_slice.stream_into(module, params, tokens, layer)
