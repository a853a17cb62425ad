"""The header of a GGUF file (metadata and tensor table), read in one pass over a
memory map.

The `gguf` package's reader builds a NumPy view for every part of every metadata value:
a file whose vocabulary holds 150,000 tokens and as many merges takes seconds before a
single weight is read. Here strings are decoded straight from the mapped bytes, numeric
arrays are read in one call each, and tensors stay unread (raw bytes of the map) until
asked for. Values come out as the package's `ReaderField.contents()` gives them: str,
int, float, bool, or lists of them.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF value types: struct format of the scalars, NumPy dtype of arrays of them.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS.update({10: "<Q", 11: "<q", 12: "<d"})
_STRING, _ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class HeaderError(ValueError):
    """The bytes are not a readable GGUF header (damaged, cut short or another format)."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table, named as the `gguf` package's `ReaderTensor` names
    its fields: `shape` in ggml order (innermost dimension first)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int  # from the start of the file

    @property
    def rows_cols(self) -> tuple[int, int]:
        """(rows, columns) of the tensor as a matrix in NumPy order: ggml's ne0 is the
        row length; every outer dimension counts rows (a vector is one row)."""
        cols = self.shape[0] if self.shape else 1
        return self.n_elements // max(cols, 1), cols


@dataclasses.dataclass(frozen=True)
class Header:
    version: int
    metadata: dict
    tensors: dict[str, TensorInfo]
    data: np.ndarray  # the whole file as read-only uint8, memory-mapped

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The stored bytes of a tensor as uint8 (rows, bytes per row), not copied."""
        rows, _ = info.rows_cols
        start = info.data_offset
        return self.data[start : start + info.n_bytes].reshape(rows, -1)


def read(path: str | os.PathLike) -> Header:
    """The header of a GGUF file; HeaderError names what is wrong."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise HeaderError(f"the file holds {size} bytes, fewer than a GGUF header")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(buf, size)
    except (struct.error, UnicodeDecodeError, IndexError, OverflowError, MemoryError) as err:
        raise HeaderError(f"the header cannot be parsed: {err}") from err


def _parse(buf, size: int) -> Header:
    if buf[:4] != MAGIC:
        raise HeaderError(f"the file must start with {MAGIC!r}, got {bytes(buf[:4])!r}")
    (version,) = _U32.unpack_from(buf, 4)
    if version not in VERSIONS:
        raise HeaderError(
            f"GGUF version must be one of {list(VERSIONS)} (little-endian), got {version}"
        )
    tensor_count, kv_count = struct.unpack_from("<QQ", buf, 8)
    reader = _Reader(buf, 24, size)
    metadata = {}
    for _ in range(kv_count):
        key = reader.string()
        metadata[key] = reader.value(reader.u32())
    infos = [reader.tensor_info() for _ in range(tensor_count)]
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        raise HeaderError(f"general.alignment must be a power of two, got {alignment!r}")
    start = -(-reader.pos // alignment) * alignment
    tensors = {}
    for name, dims, kind, offset in infos:
        info = _tensor(name, dims, kind, start + offset)
        if info.data_offset + info.n_bytes > size:
            raise HeaderError(
                f"tensor {name!r} must end within the file's {size} bytes, "
                f"got its end at byte {info.data_offset + info.n_bytes} (cut short?)"
            )
        if name in tensors:
            raise HeaderError(f"tensor names must be unique, got {name!r} twice")
        tensors[name] = info
    data = np.frombuffer(buf, dtype=np.uint8)
    return Header(version, metadata, tensors, data)


def _tensor(name: str, dims: tuple, kind: int, offset: int) -> TensorInfo:
    try:
        qtype = GGMLQuantizationType(kind)
        block, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError) as err:
        raise HeaderError(f"tensor {name!r} has an unknown ggml type {kind}") from err
    elements = int(np.prod(dims, dtype=np.int64)) if dims else 1
    if dims and dims[0] % block:
        raise HeaderError(
            f"tensor {name!r}: row length must be a multiple of {qtype.name}'s block of "
            f"{block}, got {dims[0]}"
        )
    return TensorInfo(name, qtype, dims, elements, elements // block * type_size, offset)


class _Reader:
    """Sequential little-endian reads from a buffer; strings are UTF-8."""

    def __init__(self, buf, pos: int, size: int):
        self.buf, self.pos, self.size = buf, pos, size

    def u32(self) -> int:
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def u64(self) -> int:
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return value

    def string(self) -> str:
        n = self.u64()
        end = self.pos + n
        if end > self.size:
            raise HeaderError(f"a string of {n} bytes runs past the end of the file")
        text = str(self.buf[self.pos : end], "utf-8")
        self.pos = end
        return text

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array(self.u32(), self.u64())
        if kind not in _SCALARS:
            raise HeaderError(f"metadata value type must be one of 0..12, got {kind}")
        fmt = _SCALARS[kind]
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def array(self, kind: int, count: int) -> list:
        if kind == _STRING:
            return self.strings(count)
        if kind == _ARRAY:
            return [self.array(self.u32(), self.u64()) for _ in range(count)]
        if kind not in _SCALARS:
            raise HeaderError(f"metadata array item type must be one of 0..12, got {kind}")
        dtype = np.dtype(_SCALARS[kind])
        nbytes = dtype.itemsize * count
        if self.pos + nbytes > self.size:
            raise HeaderError(f"an array of {count} items runs past the end of the file")
        items = np.frombuffer(self.buf, dtype, count, self.pos)
        self.pos += nbytes
        return items.tolist()

    def strings(self, count: int) -> list[str]:
        """`count` strings: the loop that decides the header's read time, kept tight."""
        buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
        out = []
        append = out.append
        for _ in range(count):
            (n,) = unpack(buf, pos)
            pos += 8
            append(str(buf[pos : pos + n], "utf-8"))
            pos += n
        if pos > self.size:
            raise HeaderError(f"an array of {count} strings runs past the end of the file")
        self.pos = pos
        return out

    def tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self.string()
        n_dims = self.u32()
        if n_dims > 8:
            raise HeaderError(f"tensor {name!r} must have at most 8 dimensions, got {n_dims}")
        dims = tuple(self.u64() for _ in range(n_dims))
        return name, dims, self.u32(), self.u64()


def is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == MAGIC
