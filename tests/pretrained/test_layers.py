"""The shared layers against NumPy closed forms: soft-capped windowed attention, Gemma's
RMSNorm, rotary tables."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar.pretrained import layers


class Attention(nn.Module):
    """causal_attention as a module, so it can sow."""

    scale: float
    window: int | None = None
    cap: float | None = None

    @nn.compact
    def __call__(self, q, k, v):
        return layers.causal_attention(self, q, k, v, self.scale, self.window, None, self.cap)


def reference_probs(q, k, scale, window, cap):
    """softmax(cap * tanh(q k^T scale / cap)) over the keys a query may read, in float64;
    query head h reads kv head h // (H / K)."""
    t, h, _ = q.shape
    k = np.repeat(k, h // k.shape[1], axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) * scale
    if cap is not None:
        scores = cap * np.tanh(scores / cap)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    allowed = (j <= i) & (i - j < (window or t + 1))
    scores = np.where(allowed, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    return probs / probs.sum(-1, keepdims=True)


@pytest.mark.parametrize("window,cap", [(None, None), (None, 2.0), (3, 2.0), (4, None)])
def test_soft_capped_windowed_attention_matches_numpy(window, cap):
    """The cap bounds the scaled scores before the mask: masked keys stay exactly 0
    (a cap after the mask would turn -inf into -cap and leak weight to future keys)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 10, 4, 8)).astype(np.float32) * 3
    k = rng.standard_normal((1, 10, 2, 8)).astype(np.float32) * 3
    v = rng.standard_normal((1, 10, 2, 8)).astype(np.float32)
    module = Attention(scale=0.5, window=window, cap=cap)
    _, state = module.apply({}, q, k, v, mutable=["intermediates"])
    probs = np.asarray(state["intermediates"]["attention"][0][0])
    want = reference_probs(q[0].astype(np.float64), k[0].astype(np.float64), 0.5, window, cap)
    np.testing.assert_allclose(probs, want, atol=1e-6)
    assert np.all(probs[:, np.triu_indices(10, 1)[0], np.triu_indices(10, 1)[1]] == 0)
    if cap is not None:  # the cap changes these scores (up to 40 before capping)
        assert np.abs(want - reference_probs(q[0], k[0], 0.5, window, None)).max() > 0.05


@pytest.mark.float64
def test_softcap_is_cap_tanh_and_none_is_identity():
    x = jnp.asarray([-100.0, -1.0, 0.0, 0.5, 30.0])
    np.testing.assert_allclose(layers.softcap(x, 5.0), 5.0 * np.tanh(np.asarray(x) / 5.0))
    assert layers.softcap(x, None) is x


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_unit_offset_rmsnorm_scales_by_one_plus_weight_in_float32(dtype):
    """x / rms(x) * (1 + w) in float32, rounded to the input's dtype once at the end (as
    transformers' Gemma RMSNorm; Llama's rounds before the scale)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 16)).astype(np.float32) * 4
    w = rng.uniform(-0.5, 0.5, 16).astype(np.float32)
    norm = layers.UnitOffsetRMSNorm(1e-6)
    out = norm.apply({"params": {"scale": jnp.asarray(w)}}, jnp.asarray(x, dtype))
    x32 = np.asarray(jnp.asarray(x, dtype), np.float32)
    want = x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6) * (1 + w)
    assert out.dtype == dtype
    if dtype == jnp.float32:
        np.testing.assert_allclose(out, want, rtol=1e-6)
    else:  # one rounding of the float32 result (seeded: no value sits on a bf16 tie)
        np.testing.assert_array_equal(
            np.asarray(out, np.float32), np.asarray(jnp.asarray(want, dtype), np.float32)
        )
    zeros = norm.init(jax.random.PRNGKey(0), jnp.asarray(x))["params"]["scale"]
    assert np.all(np.asarray(zeros) == 0)  # initialised as the identity scale


def test_rotary_tables_are_cos_and_sin_of_float32_angles_times_scale():
    inv = np.asarray([1.0, 0.1, 0.01], np.float32)
    cos, sin = layers.rotary_tables(50, inv, 1.25)
    angles = np.arange(50, dtype=np.float32)[:, None] * inv
    assert cos.shape == (50, 6) and cos.dtype == np.float32
    np.testing.assert_allclose(cos[:, :3], 1.25 * np.cos(angles), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(cos[:, 3:], cos[:, :3])
    np.testing.assert_allclose(sin[:, 3:], 1.25 * np.sin(angles), rtol=1e-6, atol=1e-7)


def test_inverse_frequencies_in_float32_with_divisors():
    got = layers.inverse_frequencies(10000.0, 8, factors=[1.0, 2.0, 4.0, 8.0])
    assert got.dtype == np.float32
    want = 1 / (np.asarray([1, 2, 4, 8]) * 10000.0 ** (np.arange(0, 8, 2) / 8))
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("theta,dim", [(1e4, 12), (1e4, 64), (5e5, 128), (1e6, 24), (100.0, 8)])
def test_rotary_powers_are_float64_powers_rounded_once(theta, dim):
    """theta^(2i / dim) from float32 exponents, each power rounded once from float64, bit
    for bit (NumPy's own float32 power differs in the last bit of some of them)."""
    exponents = (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)).astype(np.float64)
    want = (np.float64(np.float32(theta)) ** exponents).astype(np.float32)
    got = layers.rotary_powers(theta, dim)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("eps", [1e-6, 0.25])
def test_rmsnorm_normalises_in_float32_and_rounds_before_the_scale(eps):
    """Llama's RMSNorm: x / sqrt(mean(x^2) + eps) computed in float32 whatever the input
    dtype, rounded to that dtype, then times the weight. A bfloat16 input normalised in
    bfloat16 would differ in the last bits; the large epsilon (inputs of rms ~0.4) shows
    that the module's own epsilon is the one added."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 64)) * 0.4).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 64).astype(np.float32)
    norm = layers.RMSNorm(eps)
    for dtype in (jnp.float32, jnp.bfloat16):
        xin = jnp.asarray(x, dtype)
        x32 = np.asarray(xin, np.float32).astype(np.float64)
        normed = x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + eps)
        rounded = np.asarray(jnp.asarray(normed.astype(np.float32), dtype), np.float32)
        out = np.asarray(norm.apply({"params": {"scale": jnp.asarray(w)}}, xin), np.float32)
        np.testing.assert_allclose(out, w * rounded, rtol=2e-6, atol=1e-7)
    # the epsilon matters at this scale: eps 0.25 shrinks every output by over a quarter
    plain = x / np.sqrt((x * x).mean(-1, keepdims=True))
    if eps > 0.1:
        assert np.all(np.abs(out) < 0.8 * np.abs(w * plain) + 1e-6)
