"""A Flax `Dense` whose kernel gradient XLA's CPU backend runs as a plain matrix product.

A kernel's gradient is x^T dy, contracted over every batch and token axis. Left to
itself, XLA folds the transpose that turns the product's (out, in) result into the
kernel's (in, out) shape back into the product, and runs the result as a dot with both
operands transposed: on the CPU an Eigen dot behind a transposing copy, a few times slower
than the XNNPACK product it otherwise picks. A data-parallel step hides this (the
gradient all-reduce sits between the product and the transpose), a step that reduces
its gradients itself does not. The forward product is `lax.dot_general`'s own, bit for
bit.

Projections of one input (a layer's query, key and value) can share one product
(`DenseWeights`, `dense_together`): small products run below the matmul rate on the
CPU, and three products of 2,500 x 64 by 64 x 64 take 1.2x-1.4x as long as one against
the three kernels side by side; the backward also gets one input gradient, not three to
sum.
"""

from __future__ import annotations

import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import dtypes
from jax import lax


@jax.custom_vjp
def dense_product(x, kernel):
    """x (..., in) times kernel (in, out): `nn.Dense`'s product."""
    return lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


def _forward(x, kernel):
    return dense_product(x, kernel), (x, kernel)


def _backward(residuals, d_y):
    x, kernel = residuals
    d_x = lax.dot_general(d_y, kernel, (((d_y.ndim - 1,), (1,)), ((), ())))
    rows = tuple(range(x.ndim - 1))
    d_kernel_transposed = lax.dot_general(d_y, x, ((rows, rows), ((), ())))  # (out, in)
    # The barrier keeps the transpose out of the product (see the module's docstring).
    d_kernel = lax.optimization_barrier(d_kernel_transposed).T
    return d_x.astype(x.dtype), d_kernel.astype(kernel.dtype)


dense_product.defvjp(_forward, _backward)


def dense_dot_general(x, kernel, dimension_numbers, precision=None, preferred_element_type=None):
    """`lax.dot_general` as `nn.Dense` calls it, through `dense_product` when the call is
    Dense's own (last axis of x against the kernel's first, default precision)."""
    plain = precision is None and preferred_element_type is None
    dense_call = (((x.ndim - 1,), (0,)), ((), ()))
    if plain and kernel.ndim == 2 and dimension_numbers == dense_call:
        return dense_product(x, kernel)
    return lax.dot_general(
        x, kernel, dimension_numbers, precision, preferred_element_type=preferred_element_type
    )


Dense = functools.partial(nn.Dense, dot_general=dense_dot_general)


class DenseWeights(nn.Module):
    """`nn.Dense`'s kernel and bias (same names, shapes, initialisers and rng path),
    returned rather than applied: projections of one input made by `dense_together`."""

    features: int
    param_dtype: jnp.dtype = jnp.float32  # nn.Dense's default

    @nn.compact
    def __call__(self, x) -> tuple[jax.Array, jax.Array]:
        """The parameters of `nn.Dense(features)` applied to x (sized by x's last axis)."""
        shape = (jnp.shape(x)[-1], self.features)
        kernel = self.param("kernel", nn.initializers.lecun_normal(), shape, self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), self.param_dtype)
        return kernel, bias


def dense_together(x, weights) -> list[jax.Array]:
    """[nn.Dense(kernel, bias)(x) for each (kernel, bias) of `weights`], as one product
    against the kernels side by side and one bias pass (see the module's docstring) when
    they share a dtype, one product each otherwise."""
    if not weights:
        raise ValueError("dense_together: weights must hold at least one (kernel, bias), got none")
    kernels, biases = zip(*weights, strict=True)
    if len({jnp.result_type(a) for a in kernels + biases}) > 1:
        # Side by side they would share one promoted dtype, where Denses keep their own.
        return [_dense(x, kernel, bias) for kernel, bias in weights]
    joined = _dense(x, jnp.concatenate(kernels, axis=1), jnp.concatenate(biases))
    ends = list(itertools.accumulate(k.shape[1] for k in kernels))
    return jnp.split(joined, ends[:-1], axis=-1)


def _dense(x, kernel, bias):
    x, kernel, bias = dtypes.promote_dtype(x, kernel, bias)
    return dense_product(x, kernel) + bias
