"""The one-pass GGUF header reader gives what the `gguf` package's reader gives (every
value type, nested arrays, the tensor table, the raw bytes), and names what is wrong
with a file that is not one."""

import struct

import gguf
import numpy as np
import pytest

from beyondpar.pretrained.gguf import header as gguf_header
from helpers.gguf_export import export
from helpers.paths import DATA, SMOLLM2_GGUF, needs_smollm2

HF = DATA / "hf"
V = gguf.GGUFValueType


def assert_same_as_the_package(path):
    ours = gguf_header.read(path)
    theirs = gguf.GGUFReader(path)
    fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(fields)
    for key, field in fields.items():
        want = field.contents()
        assert ours.metadata[key] == want, key
        assert type(ours.metadata[key]) is type(want), key
    assert list(ours.tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert info.tensor_type == t.tensor_type and info.shape == tuple(t.shape.tolist())
        assert (info.n_elements, info.n_bytes, info.data_offset) == (
            t.n_elements,
            t.n_bytes,
            t.data_offset,
        )
        np.testing.assert_array_equal(
            ours.raw(info).ravel(), np.asarray(t.data).view(np.uint8).ravel()
        )


@pytest.mark.parametrize(
    "name,qtype",
    [
        ("llama-tiny", gguf.GGMLQuantizationType.Q8_0),
        ("gpt2-tiny", gguf.GGMLQuantizationType.F32),
        ("gemma2-tiny", gguf.GGMLQuantizationType.Q4_0),  # soft-caps, window
        ("gemma3-legacy", gguf.GGMLQuantizationType.F16),  # two rope bases, linear scaling
        ("phi3-longrope", gguf.GGMLQuantizationType.BF16),  # longrope factors as tensors
    ],
)
def test_an_exported_checkpoint_reads_as_the_package_reads_it(tmp_path, name, qtype):
    assert_same_as_the_package(export(HF / name, tmp_path / "model.gguf", qtype))


def test_every_value_type_and_nested_arrays(tmp_path):
    path = tmp_path / "values.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    values = {
        V.UINT8: 255, V.INT8: -128, V.UINT16: 65535, V.INT16: -32768, V.UINT32: 2**32 - 1,
        V.INT32: -(2**31), V.FLOAT32: 1e-5, V.BOOL: True, V.STRING: "héllo ✓",
        V.UINT64: 2**64 - 1, V.INT64: -(2**63), V.FLOAT64: 0.1,
    }  # fmt: skip
    for kind, value in values.items():
        writer.add_key_value(f"test.{kind.name.lower()}", value, kind)
    writer.add_key_value("test.floats", [0.5, -2.0, 3e38], V.ARRAY, V.FLOAT32)
    writer.add_key_value("test.bools", [True, False, True], V.ARRAY, V.BOOL)
    writer.add_key_value("test.nested", [[1, 2], [3]], V.ARRAY, V.ARRAY)
    writer.add_uint32("general.alignment", 64)
    writer.add_tensor("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = gguf_header.read(path)
    assert header.metadata["test.float32"] == np.float32(1e-5).item()
    assert header.metadata["test.string"] == "héllo ✓"
    assert header.metadata["test.nested"] == [[1, 2], [3]]
    assert header.metadata["test.bools"] == [True, False, True]
    assert header.tensors["x"].data_offset % 64 == 0
    np.testing.assert_array_equal(
        header.raw(header.tensors["x"]).view(np.float32), [[0, 1, 2], [3, 4, 5]]
    )
    for kind, value in values.items():
        assert header.metadata[f"test.{kind.name.lower()}"] == pytest.approx(value)


@pytest.mark.parametrize("alignment,pad", [(128, 3), (256, 11), (1024, 40)])
def test_tensor_data_starts_at_the_files_own_alignment(tmp_path, alignment, pad):
    """GGUF puts the tensor data at the first multiple of general.alignment after the
    tensor table, and each tensor at a multiple of it from there: with an alignment other
    than the default 32 (and metadata of a few lengths, so the table ends off any
    multiple), both tensors read back the values written."""
    path = tmp_path / "aligned.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_custom_alignment(alignment)
    writer.add_string("test.pad", "p" * pad)
    first = np.arange(10, dtype=np.float32).reshape(2, 5) - 4.5
    second = np.array([[7, -1, 2.5]], dtype=np.float32)
    writer.add_tensor("a", first)
    writer.add_tensor("b", second)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = gguf_header.read(path)
    data = path.read_bytes()
    for name, want in (("a", first), ("b", second)):
        info = header.tensors[name]
        assert info.data_offset % alignment == 0
        np.testing.assert_array_equal(header.raw(info).view(np.float32), want)
        stored = np.frombuffer(data, np.float32, want.size, info.data_offset)
        np.testing.assert_array_equal(stored.reshape(want.shape), want)
    assert header.tensors["b"].data_offset - header.tensors["a"].data_offset == alignment


@needs_smollm2
def test_the_packaged_model_reads_as_the_package_reads_it():
    assert_same_as_the_package(SMOLLM2_GGUF)


def damaged(tmp_path, data: bytes, name="damaged.gguf"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda b: b"GGML" + b[4:], r"must start with b'GGUF', got b'GGML'"),
        (lambda b: b[:4] + struct.pack("<I", 1) + b[8:], r"version must be one of \[2, 3\].*got 1"),
        (lambda b: b[:4] + struct.pack(">I", 3) + b[8:], r"version must be one of .*got 50331648"),
        (lambda b: b[:20], r"fewer than a GGUF header"),
        (lambda b: b[:200], r"runs past the end|cannot be parsed"),
        (lambda b: b[: len(b) - 10], r"tensor '.*' must end within the file's \d+ bytes"),
    ],
)
def test_damaged_headers_are_named(tmp_path, change, message):
    data = export(HF / "llama-tiny", tmp_path / "model.gguf").read_bytes()
    with pytest.raises(gguf_header.HeaderError, match=message):
        gguf_header.read(damaged(tmp_path, change(data)))


def test_a_row_length_that_is_no_multiple_of_the_block_is_named(tmp_path):
    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor_info(
        "w", (2, 64), np.dtype(np.float32), 2 * 2 * 34, gguf.GGMLQuantizationType.Q8_0
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.write_tensor_data(np.zeros((2, 68), np.uint8))
    writer.close()
    data = bytearray(path.read_bytes())
    at = data.index(b"w") + 1 + 4  # name, then n_dims (u32): ne0 follows
    data[at : at + 8] = struct.pack("<Q", 48)
    with pytest.raises(
        gguf_header.HeaderError,
        match=r"'w': row length must be a multiple of Q8_0's block of 32, got 48",
    ):
        gguf_header.read(damaged(tmp_path, bytes(data)))


def written(path, build):
    """A GGUF file of `build(writer)`'s metadata and tensors."""
    writer = gguf.GGUFWriter(path, "llama")
    build(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_tensor_may_have_up_to_eight_dimensions(tmp_path):
    """ggml records at most 8 dimensions: a tensor of 8 reads (innermost first), one of 9
    is named."""
    values = np.arange(6, dtype=np.float32).reshape(1, 1, 1, 1, 1, 1, 2, 3)
    path = written(tmp_path / "eight.gguf", lambda w: w.add_tensor("x", values))
    info = gguf_header.read(path).tensors["x"]
    assert info.shape == (3, 2, 1, 1, 1, 1, 1, 1) and info.rows_cols == (2, 3)
    np.testing.assert_array_equal(
        gguf_header.read(path).raw(info).view(np.float32), [[0, 1, 2], [3, 4, 5]]
    )
    nine = written(tmp_path / "nine.gguf", lambda w: w.add_tensor("x", values[None]))
    with pytest.raises(gguf_header.HeaderError, match=r"'x' must have at most 8 dimensions, got 9"):
        gguf_header.read(nine)


@pytest.mark.parametrize("alignment", [0, 24, 48])
def test_an_alignment_that_is_not_a_power_of_two_is_named(tmp_path, alignment):
    def build(writer):
        writer.add_uint32("general.alignment", alignment)
        writer.add_tensor("x", np.zeros((2, 4), np.float32))

    path = written(tmp_path / "aligned.gguf", build)
    with pytest.raises(
        gguf_header.HeaderError, match=rf"general.alignment must be a power of two, got {alignment}"
    ):
        gguf_header.read(path)
