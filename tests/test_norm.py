"""RMSNorm with its gradient written out: Flax's own norm, bit for bit forward and to
float64 rounding backward, for any shape, epsilon, scale and dtype."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import norm


def both_norms(epsilon):
    return norm.RMSNorm(epsilon, name="ln"), nn.RMSNorm(epsilon=epsilon, name="ln")


def normal(seed: int, shape: tuple, dtype=np.float32) -> np.ndarray:
    """Test inputs from NumPy: a JAX sampler compiles a program per shape and dtype."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def random_scale(params, seed: int):
    """A scale away from its initial ones, so that a gradient that drops it shows."""
    scale = params["params"]["scale"]
    uniform = np.random.default_rng(seed).uniform(size=scale.shape)
    return {"params": {"scale": (0.5 + uniform).astype(scale.dtype)}}


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 6)])
@pytest.mark.parametrize("epsilon", [1e-6, 0.7])
def test_values_and_parameters_are_flax_rmsnorms_bit_for_bit(shape, epsilon):
    x = 3.0 * normal(0, shape)
    ours, theirs = both_norms(epsilon)
    key = jax.random.PRNGKey(1)
    params = ours.init(key, x)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(
        jnp.shape, jax.eval_shape(theirs.init, key, x)
    )
    np.testing.assert_array_equal(params["params"]["scale"], np.ones(shape[-1], np.float32))
    params = random_scale(params, 2)
    got, want = ours.apply(params, x), theirs.apply(params, x)
    assert got.dtype == want.dtype == jnp.float32
    np.testing.assert_array_equal(got, want)


@pytest.mark.float64
@pytest.mark.parametrize("shape", [(6,), (4, 6), (2, 3, 5)])
@pytest.mark.parametrize("epsilon", [1e-6, 2.0])
def test_gradients_are_autodiff_of_flax_rmsnorm(shape, epsilon):
    """Both gradients, for a loss that weighs every output differently."""
    x = normal(3, shape, np.float64)
    weights = normal(4, shape, np.float64)
    ours, theirs = both_norms(epsilon)
    params = random_scale(jax.eval_shape(ours.init, jax.random.PRNGKey(5), x), 5)
    params = jax.tree.map(lambda a: a.astype(np.float64), params)

    def gradients(module):
        loss = lambda p, a: jnp.sum(weights * jnp.sin(module.apply(p, a)))
        return jax.jit(jax.grad(loss, (0, 1)))(params, x)  # one program, not one per op

    (got_params, got_x), (want_params, want_x) = gradients(ours), gradients(theirs)
    np.testing.assert_allclose(got_x, want_x, rtol=1e-12, atol=1e-14)
    scale_got, scale_want = got_params["params"]["scale"], want_params["params"]["scale"]
    np.testing.assert_allclose(scale_got, scale_want, rtol=1e-12, atol=1e-14)


@pytest.mark.float64
def test_input_gradient_is_orthogonal_to_the_input_without_epsilon():
    """With epsilon 0 the norm is scale-free in each row, so the input's gradient is
    orthogonal to the row (x . dL/dx = 0), whatever the scale and the upstream gradient."""
    x = normal(4, (5, 8), np.float64)
    scale = np.linspace(0.5, 2.0, 8)
    d_y = normal(5, (5, 8), np.float64)
    pulled = lambda a, d: jax.vjp(lambda b: norm.rms_norm(b, scale, 0.0), a)[1](d)[0]
    d_x = np.asarray(jax.jit(pulled)(x, d_y))  # one program, not one per op
    assert d_x.dtype == np.float64
    np.testing.assert_allclose(np.sum(x * d_x, axis=-1), 0.0, atol=1e-12)
    assert float(np.abs(d_x).max()) > 0.1


def test_low_precision_input_is_normalised_in_float32_and_gradients_keep_dtypes():
    x = normal(6, (3, 4), jnp.bfloat16)
    scale = jnp.full((4,), 1.5, jnp.float32)
    y = norm.rms_norm(x, scale, 1e-6)
    want = nn.RMSNorm(epsilon=1e-6).apply({"params": {"scale": scale}}, x)
    assert y.dtype == want.dtype == jnp.float32
    np.testing.assert_array_equal(y, want)
    loss = lambda a, s: jnp.sum(norm.rms_norm(a, s, 1e-6))
    d_x, d_scale = jax.jit(jax.grad(loss, (0, 1)))(x, scale)
    assert (d_x.dtype, d_scale.dtype) == (jnp.bfloat16, jnp.float32)


@pytest.mark.float64
def test_default_epsilon_is_flax_rmsnorms():
    """Without an epsilon the norm is Flax's default one (1e-6): rows whose mean square is
    of the order of epsilon show any other."""
    x = 1e-3 * normal(7, (4, 6), np.float64)
    # One program for the parameters and both norms, not a program per operation.
    both = lambda a, p: (norm.RMSNorm().apply(p, a), nn.RMSNorm().apply(p, a))
    got, theirs = jax.jit(lambda a, k: both(a, norm.RMSNorm().init(k, a)))(x, jax.random.PRNGKey(8))
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, theirs)
    want = x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_bad_inputs_name_the_argument_and_what_was_expected():
    x = jnp.ones((2, 4))
    with pytest.raises(TypeError, match=r"rms_norm: x must be real, got dtype complex"):
        norm.rms_norm(x.astype(jnp.complex64), jnp.ones(4), 1e-6)
    with pytest.raises(
        ValueError, match=r"scale must have shape \(4,\) \(x's last axis\), got \(\)"
    ):
        norm.rms_norm(x, jnp.float32(2.0), 1e-6)
    with pytest.raises(ValueError, match=r"got \(1,\)"):
        norm.rms_norm(x, jnp.ones(1), 1e-6)
    with pytest.raises(TypeError, match="epsilon must be a number fixed at trace time"):
        jax.jit(lambda e: norm.rms_norm(x, jnp.ones(4), e))(1e-6)


def test_jitted_values_are_flax_rmsnorms_bit_for_bit():
    x = 2.0 * normal(7, (4, 9, 16))
    scale = jnp.linspace(0.5, 1.5, 16, dtype=jnp.float32)
    ours = jax.jit(lambda a: norm.rms_norm(a, scale, 1e-5))(x)
    theirs = jax.jit(lambda a: nn.RMSNorm(epsilon=1e-5).apply({"params": {"scale": scale}}, a))(x)
    np.testing.assert_array_equal(ours, theirs)


def test_complex_input_is_refused_at_either_precision():
    for dtype in (jnp.complex64, jnp.complex128):
        x = jnp.ones((2, 4), dtype)
        with pytest.raises(TypeError, match=r"x must be real, got dtype complex"):
            norm.rms_norm(x, jnp.ones(4), 1e-6)


def test_scale_with_axes_beyond_the_features_is_refused():
    """A scale of shape (rows, features) would broadcast against x; only (features,) is a
    per-feature scale."""
    x = jnp.ones((3, 4))
    for shape in [(1, 4), (3, 4), (2, 3, 4)]:
        with pytest.raises(ValueError, match=r"scale must have shape \(4,\) \(x's last axis\)"):
            norm.rms_norm(x, jnp.ones(shape), 1e-6)
