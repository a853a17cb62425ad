"""The jitted dequantisers give the `gguf` package's values for every type they cover, on
blocks holding every bit pattern and the edge values of their scales; layouts, row
orders and dtypes; the types they leave to the package."""

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES

from beyondpar.pretrained.gguf import quants as gguf_quants

Q = gguf.GGMLQuantizationType
QUANTISED = [q for q in gguf_quants.KERNELS if q in gguf_quants.FLOAT16_FIELDS]
# float16 scales at the edges: zero, -0, the smallest subnormal and normal, one, the
# largest finite, negatives, and values whose products round.
EDGE_SCALES = np.array(
    [0.0, -0.0, 2**-24, 2**-14, 1.0, 65504.0, -65504.0, -1.5, 3.14, 1e-3, -7e-5, 0.333],
    np.float16,
)


def edge_blocks(qtype, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Raw rows of `qtype` with random bits everywhere (every nibble, bit and 6-bit
    scale pattern occurs) and each float16 field cycling through EDGE_SCALES."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    for k, offset in enumerate(gguf_quants.FLOAT16_FIELDS[qtype]):
        scales = np.roll(EDGE_SCALES, 5 * k)[np.arange(len(raw)) % len(EDGE_SCALES)]
        raw[:, offset : offset + 2] = scales[:, None].view(np.uint8)
    return raw.reshape(rows, -1)


def reference(raw, qtype, rows, cols):
    return gguf.quants.dequantize(np.ascontiguousarray(raw), qtype).reshape(rows, cols)


def cols_of(qtype) -> int:
    return 4 * GGML_QUANT_SIZES[qtype][0]


@pytest.mark.parametrize("qtype", QUANTISED, ids=lambda q: q.name)
def test_each_type_gives_the_packages_values_bit_for_bit(qtype):
    rows, cols = 24, cols_of(qtype)
    raw = edge_blocks(qtype, rows, cols)
    want = reference(raw, qtype, rows, cols)
    got = np.asarray(gguf_quants.decode(raw, qtype, cols))
    assert got.dtype == np.float32 and got.shape == (rows, cols)
    np.testing.assert_array_equal(got, want)  # NaN where the package gives NaN
    assert np.isfinite(want).mean() > 0.9 and np.abs(want).max() > 1e3  # edges were hit


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16], ids=lambda q: q.name)
def test_float_types_keep_every_bit(qtype):
    rng = np.random.default_rng(1)
    itemsize = 4 if qtype == Q.F32 else 2
    raw = rng.integers(0, 256, (8, 16 * itemsize), dtype=np.uint8)
    got = np.asarray(gguf_quants.decode(raw, qtype, 16))
    want = reference(raw, qtype, 8, 16)
    number = ~np.isnan(want)  # NaN stays NaN (XLA may set the quiet bit of a payload)
    np.testing.assert_array_equal(np.isnan(got), ~number)
    np.testing.assert_array_equal(got.view(np.uint32)[number], want.view(np.uint32)[number])


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q5_0, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_transpose_row_order_and_dtype_are_folded_in(qtype):
    rows, cols = 12, cols_of(qtype)
    raw = edge_blocks(qtype, rows, cols, seed=2)
    want = reference(raw, qtype, rows, cols)
    order = np.random.default_rng(3).permutation(rows)
    got = gguf_quants.decode(raw, qtype, cols, transpose=True, dtype=jnp.bfloat16, order=order)
    assert got.shape == (cols, rows) and got.dtype == jnp.bfloat16
    expected = jnp.asarray(want[order].T, jnp.bfloat16)  # the cast the loader did before
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


@pytest.mark.parametrize("compiled", [True, False])
def test_an_offset_is_added_in_float32_before_the_cast(compiled):
    """Gemma's norms (stored as 1 + weight): the kernel and the package's code both give
    float32(values) - 1, then the cast, as the loader did before."""
    rows, cols = 6, cols_of(Q.Q8_0)
    raw = edge_blocks(Q.Q8_0, rows, cols, seed=5)
    want = reference(raw, Q.Q8_0, rows, cols) - np.float32(1.0)
    got = gguf_quants.decode(raw, Q.Q8_0, cols, compiled=compiled, offset=-1.0)
    assert isinstance(got, np.ndarray) != compiled
    np.testing.assert_array_equal(np.asarray(got), want)
    half = gguf_quants.decode(raw, Q.Q8_0, cols, True, jnp.bfloat16, compiled=compiled, offset=-1.0)
    np.testing.assert_array_equal(np.asarray(half), np.asarray(jnp.asarray(want.T, jnp.bfloat16)))
    assert np.abs(want).max() > 1e3 and np.any(np.abs(want) < 1)  # offsets that round


def test_one_value_per_nibble_in_ggml_order():
    """Q4_0 block: scale 1, byte j holds value j in its low and 15 - j in its high
    nibble: the block reads 0..15 - 8, then 15..0 - 8 (low nibbles first)."""
    block = np.zeros((1, 18), np.uint8)
    block[0, :2] = np.array([1.0], np.float16).view(np.uint8)
    block[0, 2:] = np.arange(16) | ((15 - np.arange(16)) << 4)
    got = np.asarray(gguf_quants.decode(block, Q.Q4_0, 32))[0]
    np.testing.assert_array_equal(got, np.concatenate([np.arange(16), 15 - np.arange(16)]) - 8)


def test_q5_0_high_bits_come_from_the_little_endian_word():
    """Q5_0: bit j of the 32-bit word after the scale is value j's fifth bit."""
    block = np.zeros((1, 22), np.uint8)
    block[0, :2] = np.array([0.5], np.float16).view(np.uint8)
    block[0, 2:6] = np.array([1 << 3 | 1 << 20], "<u4").view(np.uint8)
    got = np.asarray(gguf_quants.decode(block, Q.Q5_0, 32))[0]
    want = np.full(32, -16 * 0.5)
    want[[3, 20]] = 0.0  # 16 - 16
    np.testing.assert_array_equal(got, want)


def test_vectors_and_types_without_a_kernel_use_the_package():
    rng = np.random.default_rng(4)
    raw = rng.integers(0, 256, (3, 4 * 18), dtype=np.uint8)  # IQ4_NL: 32 values in 18 bytes
    for k in range(4):
        raw[:, k * 18 : k * 18 + 2] = np.array([0.25], np.float16).view(np.uint8)
    got = gguf_quants.decode(raw, Q.IQ4_NL, 128, transpose=True)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, reference(raw, Q.IQ4_NL, 3, 128).T)
    vector = edge_blocks(Q.Q8_0, 1, 64)
    np.testing.assert_array_equal(
        gguf_quants.decode(vector, Q.Q8_0, 64), reference(vector, Q.Q8_0, 1, 64)
    )


def test_a_type_the_package_cannot_dequantise_raises_not_implemented():
    raw = np.zeros((2, GGML_QUANT_SIZES[Q.Q8_1][1]), np.uint8)
    with pytest.raises(NotImplementedError, match="Q8_1"):
        gguf_quants.decode(raw, Q.Q8_1, 32)
