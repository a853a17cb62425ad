"""The Dense product with its kernel gradient written out: the same values and gradients
as `lax.dot_general` and JAX's own differentiation, and the plain product for every call
that is not Dense's own."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from beyondpar import linear


def plain_product(x, kernel):
    return lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


def normal(seed: int, shape: tuple, dtype=np.float32) -> np.ndarray:
    """Test inputs from NumPy: a JAX sampler compiles a program per shape and dtype."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@jax.jit
def products_and_pullbacks(x, kernel, d_y):
    """Dense's product and its pullback of `d_y`, and the plain product's: one program."""
    y, pullback = jax.vjp(linear.dense_product, x, kernel)
    plain_y, plain_pullback = jax.vjp(plain_product, x, kernel)
    return y, plain_y, pullback(d_y), plain_pullback(d_y)


@pytest.mark.float64
@pytest.mark.parametrize("x_shape", [(7, 5), (3, 4, 5), (2, 3, 4, 5)])
def test_dense_product_and_its_gradients_are_the_plain_products(x_shape):
    x = normal(0, x_shape, np.float64)
    kernel = normal(1, (5, 6), np.float64)
    d_y = normal(2, x_shape[:-1] + (6,), np.float64)
    y, plain_y, grads, plain_grads = products_and_pullbacks(x, kernel, d_y)
    assert y.dtype == jnp.float64
    np.testing.assert_array_equal(y, plain_y)
    for got, want in zip(grads, plain_grads, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # The kernel gradient, written as sums: x's rows times d_y's rows.
    rows_x, rows_dy = x.reshape(-1, 5), d_y.reshape(-1, 6)
    np.testing.assert_allclose(grads[1], rows_x.T @ rows_dy, rtol=1e-12)


def test_gradients_keep_their_inputs_dtypes():
    x = jnp.ones((3, 4), jnp.bfloat16)
    kernel = jnp.ones((4, 2), jnp.float32)
    loss = lambda a, b: linear.dense_product(a, b).sum()
    d_x, d_kernel = jax.jit(jax.grad(loss, (0, 1)))(x, kernel)
    assert (d_x.dtype, d_kernel.dtype) == (jnp.bfloat16, jnp.float32)
    np.testing.assert_array_equal(d_kernel, np.full((4, 2), 3.0))


def applied_and_differentiated(module, params, x):
    """`module`'s output and the gradient of a sine-weighted sum in its parameters."""
    loss = lambda p: jnp.sum(jnp.sin(module.apply(p, x)))
    return module.apply(params, x), jax.grad(loss)(params)


def test_dense_is_flax_dense_with_the_same_parameters_and_values():
    x = normal(1, (2, 3, 4))
    ours, theirs = linear.Dense(5, name="proj"), nn.Dense(5, name="proj")
    key = jax.random.PRNGKey(2)
    # Each module's calls as one program, not op by op: a program per op costs more.
    params, (got, got_grad) = jax.jit(
        lambda k: (p := ours.init(k, x), applied_and_differentiated(ours, p, x))
    )(key)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(
        jnp.shape, jax.eval_shape(theirs.init, key, x)
    )
    want, want_grad = jax.jit(lambda p: applied_and_differentiated(theirs, p, x))(params)
    np.testing.assert_array_equal(got, want)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got_grad, want_grad)


def test_other_products_go_to_lax_dot_general(monkeypatch):
    """Only Dense's own call (last axis against the kernel's first, no precision or output
    type) takes the written-out gradient; any other is `lax.dot_general` as asked."""
    calls = []
    monkeypatch.setattr(linear, "dense_product", lambda x, k: calls.append(1) or x @ k)
    x, kernel = jnp.ones((3, 4)), jnp.ones((4, 2))
    own = (((1,), (0,)), ((), ()))
    linear.dense_dot_general(x, kernel, own)
    assert calls == [1]
    other = (((0,), (1,)), ((), ()))  # x's first axis against the kernel's last
    got = linear.dense_dot_general(jnp.ones((2, 3)), kernel, other)
    np.testing.assert_array_equal(got, lax.dot_general(jnp.ones((2, 3)), kernel, other))
    got = linear.dense_dot_general(x, kernel, own, preferred_element_type=jnp.float32)
    linear.dense_dot_general(x, kernel, own, precision=lax.Precision.HIGHEST)
    # DenseGeneral's kernel of several output axes: Dense's contraction, not Dense's call.
    wide = jnp.ones((4, 2, 3))
    got_wide = linear.dense_dot_general(x, wide, own)
    np.testing.assert_array_equal(got_wide, lax.dot_general(x, wide, own))
    assert calls == [1] and got.dtype == jnp.float32


class ThreeDense(nn.Module):
    """Flax's Dense three times (unequal widths), or the same weights applied together."""

    widths: tuple
    together: bool

    @nn.compact
    def __call__(self, x):
        names = ("first", "second", "third")
        if not self.together:
            return [nn.Dense(w, name=n)(x) for w, n in zip(self.widths, names, strict=True)]
        weights = [
            linear.DenseWeights(w, name=n)(x) for w, n in zip(self.widths, names, strict=True)
        ]
        return linear.dense_together(x, weights)


@pytest.mark.float64
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_projections_together_are_flax_denses_with_the_same_parameters(dtype):
    """DenseWeights makes nn.Dense's parameters (names, shapes, initial values); applied
    together they give each Dense's output and gradients, split at unequal widths."""
    x = normal(3, (2, 3, 4), dtype)
    ours, theirs = ThreeDense((3, 5, 2), True), ThreeDense((3, 5, 2), False)
    # Both modules' calls as one program, not op by op: a program per op costs more.
    both = lambda k: (_three_dense_calls(ours, k, x), _three_dense_calls(theirs, k, x))
    key = jax.random.PRNGKey(4)
    (params, got, got_grads), (want_params, want, want_grads) = jax.jit(both)(key)
    jax.tree.map(np.testing.assert_array_equal, params, want_params)
    assert [g.shape for g in got] == [(2, 3, 3), (2, 3, 5), (2, 3, 2)]
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _three_dense_calls(module, key, x):
    """`module`'s initial parameters, its outputs with every bias moved off zero (each
    column by its own amount), and the gradients of a weighted sum of sines of them in
    those parameters and in `x`."""
    params = module.init(key, x)
    biased = jax.tree.map(lambda a: a + 0.25 * jnp.arange(a.shape[-1], dtype=a.dtype), params)
    loss = lambda p, a: sum(jnp.sum(jnp.sin(y) * (i + 1)) for i, y in enumerate(module.apply(p, a)))
    return params, module.apply(biased, x), jax.grad(loss, (0, 1))(biased, x)


@pytest.mark.float64
@pytest.mark.parametrize(
    "x_dtype, param_dtype",
    [(jnp.bfloat16, jnp.float32), (jnp.float16, jnp.bfloat16), (jnp.bfloat16, jnp.float16)],
)
def test_projections_together_promote_input_and_parameters_as_flax_dense(x_dtype, param_dtype):
    """Mixed dtypes give nn.Dense's result type (float16 with bfloat16 is float32) and its
    values and kernel gradient."""
    x = (3.0 * normal(5, (2, 3, 4))).astype(x_dtype)
    kernel = normal(6, (4, 3)).astype(param_dtype)
    bias = np.arange(3.0).astype(param_dtype)
    dense = lambda k, a: nn.Dense(3).apply({"params": {"kernel": k, "bias": bias}}, a)
    together = lambda k, a: linear.dense_together(a, [(k, bias)])[0]
    grad = lambda f, k: jax.grad(lambda k: jnp.sum(f(k, x).astype(jnp.float32)))(k)
    # Both calls and their gradients as one program, not op by op.
    calls = lambda k: (together(k, x), dense(k, x), grad(together, k), grad(dense, k))
    got, want, got_grad, want_grad = jax.jit(calls)(kernel)
    assert got.dtype == want.dtype == jnp.promote_types(x_dtype, param_dtype)
    np.testing.assert_allclose(got.astype(jnp.float64), want.astype(jnp.float64), rtol=1e-6)
    assert got_grad.dtype == want_grad.dtype == param_dtype
    np.testing.assert_allclose(
        got_grad.astype(jnp.float64), want_grad.astype(jnp.float64), rtol=1e-6
    )


@pytest.mark.float64
def test_projections_together_of_mixed_dtypes_keep_each_denses_dtype():
    """Side by side, weights of two dtypes would share one promoted dtype: each projection
    is then its own product, as separate Denses give; no weights at all is refused."""
    x = normal(8, (2, 3))
    weights = [(jnp.full((3, 2), 0.5, jnp.float32), jnp.arange(2.0, dtype=jnp.float32))]
    weights.append((jnp.full((3, 4), 0.25, jnp.float64), jnp.ones(4, jnp.float64)))
    got = linear.dense_together(x, weights)
    for y, (kernel, bias) in zip(got, weights, strict=True):
        want = nn.Dense(kernel.shape[1]).apply({"params": {"kernel": kernel, "bias": bias}}, x)
        assert y.dtype == want.dtype == kernel.dtype
        np.testing.assert_allclose(y, want, rtol=1e-6)
    with pytest.raises(ValueError, match="weights must hold at least one"):
        linear.dense_together(x, [])


@pytest.mark.float64
def test_projections_together_with_biases_of_mixed_dtypes_keep_each_denses_dtype():
    """Kernels of one dtype, biases of two: a float64 bias makes its own Dense float64 and
    leaves the other float32."""
    x = normal(9, (2, 3))
    weights = [
        (jnp.full((3, 2), 0.5, jnp.float32), jnp.arange(2.0, dtype=jnp.float32)),
        (jnp.full((3, 4), 0.25, jnp.float32), jnp.ones(4, jnp.float64)),
    ]
    got = linear.dense_together(x, weights)
    assert [y.dtype for y in got] == [jnp.float32, jnp.float64]
    for y, (kernel, bias) in zip(got, weights, strict=True):
        want = nn.Dense(kernel.shape[1]).apply({"params": {"kernel": kernel, "bias": bias}}, x)
        assert y.dtype == want.dtype
        np.testing.assert_allclose(y, want, rtol=1e-6)


@pytest.mark.float64
@pytest.mark.parametrize("param_dtype", [jnp.bfloat16, jnp.float16, jnp.float64])
def test_dense_weights_take_param_dtype_for_kernel_and_bias(param_dtype):
    x = jnp.ones((2, 4), jnp.float32)
    # Traced, not run: the dtypes are the initialiser's, and nothing is compiled.
    key = jax.random.PRNGKey(10)
    params = jax.eval_shape(linear.DenseWeights(3, param_dtype=param_dtype).init, key, x)
    want = jax.eval_shape(nn.Dense(3, param_dtype=param_dtype).init, key, x)
    got_dtypes = jax.tree.map(lambda a: a.dtype, params)
    assert got_dtypes == jax.tree.map(lambda a: a.dtype, want)
    assert got_dtypes == {"params": {"kernel": param_dtype, "bias": param_dtype}}
