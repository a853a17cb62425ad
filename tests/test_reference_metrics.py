"""The paper's released checkpoints: head weights and metrics equal the paper's outputs."""

import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import graphs, metrics

TOLERANCE = {jnp.float64: 1e-6, jnp.float32: 1e-4}


def layer_kernels(state, layers=4):
    """Flax Dense kernels (in x out) of each layer's attention output projection."""
    return [state[f"layers.{i}.attn.out_proj.weight"].T for i in range(layers)]


def test_head_importance_equals_head_weights(fixture):
    _, state, expected = fixture
    num_heads = expected["attention"].shape[2]
    got = np.stack([graphs.head_importance(k, num_heads) for k in layer_kernels(state)])
    np.testing.assert_allclose(got, expected["head_weights"], rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_fidelity_equals_reference(fixture, dtype):
    _, _, expected = fixture
    attn = jnp.asarray(expected["attention"], dtype)
    rtol = TOLERANCE[dtype]
    learned = graphs.combine_heads(attn, expected["head_weights"])
    np.testing.assert_allclose(
        metrics.minimax_fidelity(learned), expected["fidelity_learned"] / 100, rtol=rtol
    )
    uniform = graphs.combine_heads(attn)
    np.testing.assert_allclose(
        metrics.minimax_fidelity(uniform), expected["fidelity_uniform"] / 100, rtol=rtol
    )
    np.testing.assert_allclose(
        metrics.minimax_fidelity(attn), expected["fidelity_per_head"] / 100, rtol=rtol
    )


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("walk", metrics.WALKS)
def test_hitting_time_equals_reference(fixture, dtype, walk):
    _, _, expected = fixture
    attn = jnp.asarray(expected["attention"], dtype)
    learned = graphs.combine_heads(attn, expected["head_weights"])
    got = metrics.hitting_time(learned, 100, walk)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, expected[f"hitting_time_{walk}"], rtol=TOLERANCE[dtype])


def test_fused_metrics_equal_single_kernels(fixture):
    _, _, expected = fixture
    attn = jnp.asarray(expected["attention"], jnp.float64)
    c = graphs.combine_heads(attn, expected["head_weights"])
    fused = metrics.operator_metrics(c, walk="normalized")
    np.testing.assert_allclose(
        fused.minimax_fidelity, expected["fidelity_learned"] / 100, rtol=1e-6
    )
    np.testing.assert_allclose(fused.hitting_time, expected["hitting_time_normalized"], rtol=1e-6)
    np.testing.assert_array_equal(
        fused.tv_mixing_time, metrics.tv_mixing_time(c, walk="normalized")
    )
