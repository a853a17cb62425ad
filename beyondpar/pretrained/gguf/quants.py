"""GGUF tensors dequantised by jitted JAX kernels straight into the layout and dtype the
model wants.

Each supported ggml type has a kernel from its raw blocks (uint8) to float32 that does
the `gguf` package's arithmetic in the same order (so the values are the package's,
bit for bit on CPU); per tensor shape it is fused with the transpose of a Dense kernel
and the cast into one jitted pass on the host's CPU device, whose output is the
parameter itself: no float32 host copy, no separate transpose. Compiling costs about
0.1 s per shape, so small models (and vectors, and types without a kernel: the IQ and
TQ families, ...) go through the package's NumPy code instead.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

Q = GGMLQuantizationType
KERNEL_MIN_VALUES = 1 << 24  # values of one (type, shape) from which a kernel pays off

# Byte offsets of the float16 fields (scales d, minimums m) in each type's blocks.
FLOAT16_FIELDS = {
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q8_0: (0,),
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
}


def _f16(raw, start: int):
    """The float16 at bytes [start, start + 2) of every block, as float32."""
    return jax.lax.bitcast_convert_type(raw[:, start : start + 2], jnp.float16).astype(jnp.float32)


def _nibbles(qs):
    """(n, k) bytes -> (n, 2k): every low nibble, then every high nibble (ggml's order)."""
    return jnp.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _shifted(x, shifts, axis: int):
    """x >> s for each s, stacked along a new `axis`."""
    return jnp.stack([x >> s for s in shifts], axis=axis)


def _low_bits(words_u32, count: int):
    """(n,) uint32 -> (n, count) uint8: bit j of each word in column j."""
    return ((words_u32[:, None] >> jnp.arange(count, dtype=jnp.uint32)) & 1).astype(jnp.uint8)


def _f32(raw):
    return jax.lax.bitcast_convert_type(raw, jnp.float32)


def _f16_values(raw):
    return jax.lax.bitcast_convert_type(raw, jnp.float16).astype(jnp.float32)


def _bf16(raw):
    bits = jax.lax.bitcast_convert_type(raw, jnp.uint16).astype(jnp.uint32) << 16
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _q4_0(raw):
    q = _nibbles(raw[:, 2:]).astype(jnp.int8) - jnp.int8(8)
    return _f16(raw, 0)[:, None] * q.astype(jnp.float32)


def _q4_1(raw):
    q = _nibbles(raw[:, 4:]).astype(jnp.float32)
    return _f16(raw, 0)[:, None] * q + _f16(raw, 2)[:, None]


def _q5_0(raw):
    high = _low_bits(jax.lax.bitcast_convert_type(raw[:, 2:6], jnp.uint32), 32)
    q = (_nibbles(raw[:, 6:]) | (high << 4)).astype(jnp.int8) - jnp.int8(16)
    return _f16(raw, 0)[:, None] * q.astype(jnp.float32)


def _q5_1(raw):
    high = _low_bits(jax.lax.bitcast_convert_type(raw[:, 4:8], jnp.uint32), 32)
    q = (_nibbles(raw[:, 8:]) | (high << 4)).astype(jnp.float32)
    return _f16(raw, 0)[:, None] * q + _f16(raw, 2)[:, None]


def _q8_0(raw):
    x = jax.lax.bitcast_convert_type(raw[:, 2:], jnp.int8).astype(jnp.float32)
    return x * _f16(raw, 0)[:, None]


def _q2_k(raw):
    n = raw.shape[0]
    scales, qs = raw[:, :16], raw[:, 16:80]
    d, dmin = _f16(raw, 80)[:, None], _f16(raw, 82)[:, None]
    dl = (d * (scales & 0x0F).astype(jnp.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).astype(jnp.float32)).reshape(n, 16, 1)
    q = _shifted(qs.reshape(n, 2, 32), (0, 2, 4, 6), axis=2) & 3
    return (dl * q.reshape(n, 16, 16).astype(jnp.float32) - ml).reshape(n, 256)


def _q3_k(raw):
    n = raw.shape[0]
    hmask, qs, packed, d = raw[:, :32], raw[:, 32:96], raw[:, 96:108], _f16(raw, 108)
    low = _nibbles(packed[:, :8])  # scale j's low 4 bits: byte j % 8, nibble j // 8
    high = _shifted(packed[:, 8:], (0, 2, 4, 6), axis=1).reshape(n, 16) & 3
    scales = ((low | (high << 4)).astype(jnp.int8) - jnp.int8(32)).astype(jnp.float32)
    dl = (d[:, None] * scales).reshape(n, 16, 1)
    ql = (_shifted(qs.reshape(n, 2, 32), (0, 2, 4, 6), axis=2) & 3).reshape(n, 16, 16)
    qh = (_shifted(hmask, tuple(range(8)), axis=1) & 1).reshape(n, 16, 16) ^ 1
    q = (ql.astype(jnp.int8) - (qh << 2).astype(jnp.int8)).astype(jnp.float32)
    return (dl * q).reshape(n, 256)


def _k_scales(packed):
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit minimums."""
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = jnp.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)], axis=-1)
    mins = jnp.concatenate([b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)], axis=-1)
    return scales.astype(jnp.float32), mins.astype(jnp.float32)


def _q4_k(raw):
    n = raw.shape[0]
    d, dmin = _f16(raw, 0)[:, None], _f16(raw, 2)[:, None]
    scales, mins = _k_scales(raw[:, 4:16])
    q = _shifted(raw[:, 16:].reshape(n, 4, 32), (0, 4), axis=2) & 0x0F
    q = q.reshape(n, 8, 32).astype(jnp.float32)
    return ((d * scales)[..., None] * q - (dmin * mins)[..., None]).reshape(n, 256)


def _q5_k(raw):
    n = raw.shape[0]
    d, dmin = _f16(raw, 0)[:, None], _f16(raw, 2)[:, None]
    scales, mins = _k_scales(raw[:, 4:16])
    qh, qs = raw[:, 16:48], raw[:, 48:]
    low = (_shifted(qs.reshape(n, 4, 32), (0, 4), axis=2) & 0x0F).reshape(n, 8, 32)
    high = _shifted(qh, tuple(range(8)), axis=1) & 1
    q = (low | (high << 4)).astype(jnp.float32)
    return ((d * scales)[..., None] * q - (dmin * mins)[..., None]).reshape(n, 256)


def _q6_k(raw):
    n = raw.shape[0]
    ql, qh = raw[:, :128], raw[:, 128:192]
    scales = jax.lax.bitcast_convert_type(raw[:, 192:208], jnp.int8).astype(jnp.float32)
    d = (_f16(raw, 208)[:, None] * scales).reshape(n, 16, 1)
    low = (_shifted(ql.reshape(n, 2, 64), (0, 4), axis=2) & 0x0F).reshape(n, 2, 4, 32)
    high = (_shifted(qh.reshape(n, 2, 32), (0, 2, 4, 6), axis=2) & 3).reshape(n, 2, 4, 32)
    q = (low | (high << 4)).astype(jnp.int8) - jnp.int8(32)
    return (d * q.reshape(n, 16, 16).astype(jnp.float32)).reshape(n, 256)


KERNELS = {
    Q.F32: _f32,
    Q.F16: _f16_values,
    Q.BF16: _bf16,
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q5_0: _q5_0,
    Q.Q5_1: _q5_1,
    Q.Q8_0: _q8_0,
    Q.Q2_K: _q2_k,
    Q.Q3_K: _q3_k,
    Q.Q4_K: _q4_k,
    Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k,
}


@functools.cache
def _kernel(qtype: Q, rows: int, cols: int, transpose: bool, dtype: np.dtype, offset: float):
    """Jitted raw (rows, bytes per row) -> values + `offset` (rows, cols), or (cols, rows)
    when `transpose`, in `dtype`: one pass over the bytes, no float32 copy in between."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = KERNELS[qtype]

    def run(raw):
        values = blocks(raw.reshape(-1, type_size)).reshape(rows, cols)
        if offset:
            values = values + jnp.float32(offset)
        values = values.astype(dtype)
        return values.T if transpose else values

    return jax.jit(run)


@functools.cache
def _cpu():
    return jax.local_devices(backend="cpu")[0]


def decode(
    raw, qtype, cols: int, transpose=False, dtype=np.float32, order=None, compiled=True, offset=0.0
):
    """The values of a tensor stored as `raw` (uint8, rows x bytes per row) as a
    (rows, cols) array, rows taken in `order` (default: as stored), `offset` added in
    float32 (Gemma's norms), transposed when asked, in `dtype`: a jax.Array on the host's
    CPU device from the type's kernel, or, when not `compiled`, for vectors and for types
    without a kernel, a NumPy array (a transposed view) from the package's code."""
    qtype, dtype = Q(qtype), np.dtype(dtype)
    rows = raw.shape[0]
    raw = raw if order is None else raw[order]
    if not compiled or qtype not in KERNELS or rows == 1:
        values = dequantize(raw, qtype).reshape(rows, cols)
        values = values + np.float32(offset) if offset else values
        values = values.T if transpose else values
        return values if values.dtype == dtype else values.astype(dtype)
    kernel = _kernel(qtype, rows, cols, transpose, dtype, float(offset))
    return kernel(jax.device_put(raw, _cpu()))


def worth_compiling(values: int) -> bool:
    """Whether `values` values of one (type, shape) repay compiling a kernel for them
    (about 0.1 s) over the package's NumPy code (a few ns more per value)."""
    return values >= KERNEL_MIN_VALUES


def dequantize(raw, qtype) -> np.ndarray:
    """The `gguf` package's float32 values of raw bytes (its NumPy code, any type)."""
    qtype = Q(qtype)
    data = np.ascontiguousarray(raw)
    if qtype == Q.F32:
        return data.view(np.float32)
    if qtype == Q.F16:
        return data.view(np.float16).astype(np.float32)
    return gguf_dequantize(data, qtype)
