"""GGUF files: every supported architecture against the Hugging Face fixtures, exported
the way llama.cpp lays them out, at several quantisation types, read through the jitted
kernels; Gemma's and Phi-3's parameters bit for bit the `gguf` package's values with
their fix-ups; damaged and unsupported files."""

import dataclasses
import shutil

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from beyondpar import pretrained
from beyondpar.pretrained.gguf import quants as gguf_quants
from beyondpar.pretrained.gguf import reader as gguf_reader
from helpers.gguf_export import export
from helpers.hf_fixtures import HF, copy_checkpoint, expected

Q = gguf.GGMLQuantizationType
# Round-off of each type on these weights: the logits' worst deviation it allows.
TOLERANCE = {Q.F32: 1e-4, Q.F16: 5e-3, Q.BF16: 5e-2, Q.Q8_0: 0.1}


@pytest.mark.parametrize(
    "name,qtype,kernels",
    [
        ("llama-tiny", Q.F32, True),  # q/k rows put back in order, then the kernel
        ("llama-tiny", Q.Q8_0, True),
        ("llama3-rope", Q.F16, True),
        ("gpt2-tiny", Q.F32, True),  # Conv1D weights stored transposed
        ("gpt2-tiny", Q.BF16, True),
        ("gpt2-untied", Q.F32, False),
        ("qwen3-tiny", Q.F32, False),
        ("mistral-window", Q.F32, False),
        ("gemma2-pattern", Q.F32, False),
        ("gemma2-pattern", Q.BF16, True),
        ("gemma3-tiny", Q.F32, False),
        ("phi3-tiny", Q.F32, False),
        ("phi3-tiny", Q.Q8_0, True),  # Phi-3's fused rows grouped, then the kernel
        ("phi3-longrope", Q.F32, False),
    ],
)
def test_gguf_matches_the_hugging_face_checkpoint(tmp_path, monkeypatch, name, qtype, kernels):
    """Every quantised type and both stored layouts of F32 through the jitted kernels
    (compiled for every shape, as for a large model); the other F32 files through the
    package's NumPy code, as a small model reads them (a kernel compiled for each of
    their shapes would check the kernels no further)."""
    if kernels:
        monkeypatch.setattr(gguf_quants, "KERNEL_MIN_VALUES", 0)
    path = export(HF / name, tmp_path / "model.gguf", qtype)
    exp = expected(name)
    module, params, tokenizer = pretrained.load(path)
    assert tokenizer.encode(str(exp["text"])).ids[:64] == list(exp["tokens"][0])
    logits, attn = pretrained.apply_with_attention(module, params, exp["tokens"])
    np.testing.assert_allclose(logits, exp["logits"], atol=TOLERANCE[qtype])
    np.testing.assert_allclose(attn, exp["attention"], atol=TOLERANCE[qtype])
    if qtype != Q.F32:  # quantised, so not bit-equal: the test would pass on any load
        assert np.abs(np.asarray(logits) - exp["logits"]).max() > 1e-7
    if "tokens_24" in exp:  # longrope's short factors, within the original length
        logits, _ = pretrained.apply_with_attention(module, params, exp["tokens_24"])
        np.testing.assert_allclose(logits, exp["logits_24"], atol=TOLERANCE[qtype])


def grouped(hf_name: str, values: np.ndarray, config) -> np.ndarray:
    """Phi-3's fused rows as the model keeps them, cut out by hand: per kv head its query
    heads, key and value; gate and up features side by side."""
    if hf_name.endswith("qkv_proj.weight"):
        d, heads, kv = config.head_dim, config.num_heads, config.num_kv_heads
        q, k, v = np.split(values, [heads * d, (heads + kv) * d])
        per = heads // kv * d  # rows of one group's query heads
        return np.concatenate(
            [
                np.concatenate(
                    [q[g * per : (g + 1) * per], k[g * d : (g + 1) * d], v[g * d : (g + 1) * d]]
                )
                for g in range(kv)
            ]
        )
    if hf_name.endswith("gate_up_proj.weight"):
        gate, up = np.split(values, 2)
        return np.stack([gate, up], axis=1).reshape(values.shape)
    return values


def package_params(path, module) -> dict:
    """Every parameter as the loader read it before its own reader and kernels: the
    `gguf` package's values, 1 taken off Gemma's norms, Phi-3's rows grouped, kernels
    transposed."""
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    names = gguf_reader.GgufFile(path).hf_names()
    fam = pretrained.family(module)
    out = {}
    for keys in pretrained.parameter_shapes(module):
        hf, transpose = fam.hf_name(keys)
        t = tensors[names[hf]]
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape)))
        if type(module).__name__ == "Gemma" and hf.endswith("norm.weight"):
            values = values - np.float32(1.0)
        values = grouped(hf, values, module.config)
        out[keys] = values.T if transpose else values
    return out


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize(
    "name,qtype",
    [
        ("gemma2-tiny", Q.Q8_0),
        ("gemma3-tiny", Q.Q4_0),
        ("phi3-tiny", Q.Q8_0),
        ("phi3-tiny", Q.Q5_1),
    ],
)
def test_new_architectures_read_the_packages_values_with_their_fix_ups(
    tmp_path, monkeypatch, name, qtype, kernels
):
    """Gemma 2, Gemma 3 and Phi-3 through the kernels (or the package's NumPy code):
    every parameter bit for bit the package's values with the family's fix-ups, and in
    bfloat16 their cast."""
    if kernels:
        monkeypatch.setattr(gguf_quants, "KERNEL_MIN_VALUES", 0)
    path = export(HF / name, tmp_path / "model.gguf", qtype)
    module, params, _ = pretrained.load(path, progress=False)
    part = "qkv_proj" if name.startswith("phi3") else "q_proj"
    read = gguf_reader.GgufFile(path).read(f"model.layers.1.self_attn.{part}.weight", True)
    assert isinstance(read, jax.Array) == kernels  # the kernel ran, or the package's code
    want = package_params(path, module)
    flat = {tuple(k.key for k in p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
    assert flat.keys() == want.keys()
    for keys, values in want.items():
        np.testing.assert_array_equal(flat[keys], values, err_msg=str(keys))
    _, half, _ = pretrained.load(path, jnp.bfloat16, progress=False)
    flat = {tuple(k.key for k in p): x for p, x in jax.tree_util.tree_leaves_with_path(half)}
    for keys, values in want.items():
        assert flat[keys].dtype == jnp.bfloat16
        np.testing.assert_array_equal(flat[keys], jnp.asarray(values, jnp.bfloat16), str(keys))


def folder_as_stored(folder, gguf_module):
    """(module, params) of a Hugging Face folder, the module's norm epsilon rounded to
    float32 as a GGUF file stores it (the same float32 model, so one compiled program
    runs both), after checking that the GGUF file's module is that module."""
    module, params, _ = pretrained.load(folder)
    module = eps_as_stored(module)
    assert gguf_module == module, (gguf_module.config, module.config)
    return module, params


def eps_as_stored(module):
    """`module` with its norm epsilon rounded to float32, as a GGUF file stores it."""
    eps = float(np.float32(module.config.eps))
    return module.clone(config=dataclasses.replace(module.config, eps=eps))


LLAMA_CPP_GEMMA3 = {"query_pre_attn_scalar": 16, "hidden_activation": "gelu_pytorch_tanh"}


@pytest.mark.parametrize(
    "name,assumed",
    [
        ("gemma2-tiny", {"query_pre_attn_scalar": 16}),  # key_length, not 24
        ("gemma3-legacy", {**LLAMA_CPP_GEMMA3, "sliding_window_pattern": 6}),
    ],
)
def test_what_a_gemma_gguf_does_not_record_is_what_llama_cpp_assumes(tmp_path, name, assumed):
    """llama.cpp's converter keeps no query_pre_attn_scalar, no sliding pattern and no
    activation, and llama.cpp scales by key_length ** -0.5, slides five layers in six
    and takes the tanh GELU: the file is that model, to the bit."""
    path = export(HF / name, tmp_path / "model.gguf")
    folder = copy_checkpoint(name, tmp_path, assumed)
    tokens = expected(name)["tokens"]
    module, params, _ = pretrained.load(path)
    want = pretrained.apply_with_attention(*folder_as_stored(folder, module), tokens)
    got = pretrained.apply_with_attention(module, params, tokens)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert np.abs(np.asarray(got[0]) - expected(name)["logits"]).max() > 1e-3


@pytest.mark.parametrize("pattern", [3, [True, True, False, True]])
def test_a_gemma_gguf_sliding_pattern_key_is_read(tmp_path, pattern):
    """`gemma3.attention.sliding_window_pattern` (a period or a flag per layer) gives
    gemma3-legacy's own pattern back: only what llama.cpp assumes otherwise differs."""
    path = export(
        HF / "gemma3-legacy",
        tmp_path / "model.gguf",
        extra=lambda writer: writer.add_sliding_window_pattern(pattern),
    )
    folder = copy_checkpoint("gemma3-legacy", tmp_path, LLAMA_CPP_GEMMA3)
    tokens = expected("gemma3-legacy")["tokens"]
    module, params, _ = pretrained.load(path)
    want = pretrained.apply_with_attention(*folder_as_stored(folder, module), tokens)
    got = pretrained.apply_with_attention(module, params, tokens)
    np.testing.assert_array_equal(got[1], want[1])


def test_gemma_norms_are_stored_plus_one_and_read_back(tmp_path):
    """llama.cpp's converter adds 1 to every Gemma norm weight (q/k norms too); reading
    takes it off again."""
    path = export(HF / "gemma3-tiny", tmp_path / "model.gguf")
    source = gguf_reader.GgufFile(path)
    hf = load_file(HF / "gemma3-tiny" / "model.safetensors")
    names = source.hf_names()
    for name in ("model.layers.2.post_feedforward_layernorm.weight", "model.norm.weight"):
        np.testing.assert_allclose(source.dequantize(names[name]), hf[name] + 1, atol=1e-7)
    name = "model.layers.2.self_attn.k_norm.weight"
    got = dict(source.read_tensors([name]))[name]
    np.testing.assert_allclose(got, hf[name], atol=1e-6)


def test_a_gguf_with_a_sliding_window_keeps_it(tmp_path):
    """Mistral's GGUF is architecture llama with llama.attention.sliding_window: every layer
    gets the window (a query reads itself and the 7 keys before it), as transformers."""
    module, params, _ = pretrained.load(export(HF / "mistral-window", tmp_path / "m.gguf"))
    cfg = module.config
    assert [cfg.window(layer) for layer in range(cfg.num_layers)] == [8] * cfg.num_layers
    _, attn = pretrained.apply_with_attention(module, params, expected("mistral-window")["tokens"])
    i, j = np.indices(attn.shape[-2:])
    assert not np.asarray(attn)[..., i - j >= 8].any()
    assert (np.asarray(attn)[..., (i - j == 7)] > 0).all()


def test_llama_rows_are_unpermuted_and_not_for_qwen(tmp_path):
    """llama.cpp interleaves the rotary pairs of Llama's q/k rows and leaves Qwen's (its
    NEOX rotary) alone: reading the Llama file without undoing it gives other attention."""
    path = export(HF / "llama-tiny", tmp_path / "llama.gguf")
    source = gguf_reader.GgufFile(path)
    names = source.hf_names()
    q = dict(source.read_tensors(["model.layers.0.self_attn.q_proj.weight"]))
    raw = source.dequantize(names["model.layers.0.self_attn.q_proj.weight"])
    hf = load_file(HF / "llama-tiny" / "model.safetensors")
    np.testing.assert_array_equal(
        q["model.layers.0.self_attn.q_proj.weight"], hf["model.layers.0.self_attn.q_proj.weight"]
    )
    assert not np.array_equal(raw, hf["model.layers.0.self_attn.q_proj.weight"])


def test_a_folder_or_an_ollama_blob_holding_a_gguf_loads(tmp_path):
    path = export(HF / "llama-tiny", tmp_path / "model.gguf")
    blob = tmp_path / "blobs" / "sha256-0123abcd"
    blob.parent.mkdir()
    shutil.copy(path, blob)
    exp = expected("llama-tiny")
    for where in (tmp_path, blob):
        module, params, _ = pretrained.load(where)
        logits, _ = pretrained.apply_with_attention(module, params, exp["tokens"])
        np.testing.assert_allclose(logits, exp["logits"], atol=1e-4)
    shutil.copy(path, tmp_path / "other.gguf")
    with pytest.raises(ValueError, match="must hold one .gguf file, got 2"):
        pretrained.load(tmp_path)


def test_dtype_casts_dequantised_tensors(tmp_path):
    import jax
    import jax.numpy as jnp

    path = export(HF / "llama-tiny", tmp_path / "model.gguf", Q.F16)
    _, params, _ = pretrained.load(path, jnp.bfloat16)
    assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}


def test_a_gguf_cut_short_is_one_error_naming_the_file(tmp_path):
    path = export(HF / "llama-tiny", tmp_path / "model.gguf")
    data = path.read_bytes()
    for size in (len(data) // 2, 64):
        cut = tmp_path / f"cut{size}.gguf"
        cut.write_bytes(data[:size])
        with pytest.raises(ValueError, match=rf"GGUF file {cut} cannot be read"):
            pretrained.load(cut)


def rewrite(path, tmp_path, change) -> object:
    """A copy of a GGUF file with metadata changed: `change(reader_fields) -> {key: value}`."""
    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    overrides = change(reader)
    out = tmp_path / "changed.gguf"
    writer = gguf.GGUFWriter(out, overrides.pop("general.architecture", arch))
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = overrides.pop(key, field.contents())
        if value is None:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, kind, sub_type=sub)
    for tensor in reader.tensors:
        qtype = Q(tensor.tensor_type)
        writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"general.architecture": "falcon"},
            r"general.architecture must be one of \['llama', 'qwen2', 'qwen3', 'gpt2', "
            r"'gemma2', 'gemma3', 'phi3'\], got 'falcon'",
        ),
        ({"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model must be 'gpt2'.*got 'bert'"),
        ({"tokenizer.ggml.pre": "chatglm-bpe"}, "tokenizer.ggml.pre must be one of .*chatglm"),
        ({"llama.attention.head_count": None}, "must hold metadata 'llama.attention.head_count'"),
        (
            {"llama.attention.head_count": 0},
            r"changed.gguf: metadata 'llama.attention.head_count' must be an integer >= 1, got 0$",
        ),
        (
            {"llama.attention.head_count_kv": 0},
            r"metadata 'llama.attention.head_count_kv' must be an integer >= 1, got 0$",
        ),
        (
            {"llama.embedding_length": 0},
            r"metadata 'llama.embedding_length' must be an integer >= 1, got 0$",
        ),
        (
            {"llama.attention.head_count_kv": 3},
            r"changed.gguf: metadata 'llama.attention.head_count_kv' must divide "
            r"num_attention_heads=4, got 3$",
        ),
    ],
)
def test_unsupported_gguf_files_are_named(tmp_path, change, message):
    path = export(HF / "llama-tiny", tmp_path / "model.gguf")
    changed = rewrite(path, tmp_path, lambda reader: dict(change))
    with pytest.raises(ValueError, match=message):
        pretrained.load(changed)


@pytest.mark.parametrize("value", [True, 2.0, -1])
def test_a_gguf_count_that_is_not_a_positive_integer_is_named(tmp_path, value):
    path = export(HF / "llama-tiny", tmp_path / "model.gguf")
    source = gguf_reader.GgufFile(path)
    assert source.arch_value("attention.head_count") == 4
    source.header.metadata["llama.attention.head_count"] = value
    with pytest.raises(ValueError) as err:
        source.arch_value("attention.head_count")
    assert str(err.value) == (
        f"GGUF file {path}: metadata 'llama.attention.head_count' must be an integer >= 1, "
        f"got {value!r}"
    )


@pytest.mark.parametrize(
    "name,extra,message",
    [
        (
            "gemma3-tiny",
            lambda w: w.add_string("gemma3.rope.scaling.type", "yarn"),
            r"gemma3.rope.scaling.type must be 'none' or 'linear', got 'yarn' with factor 4.0",
        ),
        (
            "gemma2-pattern",
            lambda w: w.add_rope_freq_base_swa(5000.0),
            r"gemma2.rope.freq_base_swa must equal rope.freq_base=10000.0, got 5000.0",
        ),
        (
            "gemma3-tiny",
            lambda w: w.add_sliding_window_pattern([True, False]),
            r"gemma3.attention.sliding_window_pattern must flag 6 layers, got 2",
        ),
        (
            "phi3-tiny",
            lambda w: w.add_rope_scaling_factor(8.0),
            r"phi3.rope.scaling.type must be 'none' or 'longrope', got 'linear' with factor 8.0",
        ),
        (
            "gemma2-pattern",
            lambda w: w.add_rope_dimension_count(6),
            r"gemma2.rope.dimension_count must equal gemma2.attention.key_length .*share of 0.5",
        ),
        (
            "llama-tiny",
            lambda w: (
                w.add_sliding_window(8),
                w.add_tensor("blk.0.attn_q.bias", np.zeros(32, np.float32)),
            ),
            r"a llama model with attention biases must have no llama.attention.sliding_window",
        ),
    ],
)
def test_gguf_metadata_a_family_cannot_run_is_named(tmp_path, name, extra, message):
    path = export(HF / name, tmp_path / "model.gguf", extra=extra)
    with pytest.raises(ValueError, match=message):
        pretrained.load(path)


def test_a_quantisation_the_package_cannot_dequantise_is_named(tmp_path):
    """Q8_1 (llama.cpp's dot-product scratch type) has no dequantiser anywhere."""
    path = export(HF / "llama-tiny", tmp_path / "model.gguf", Q.Q8_0)
    reader = gguf.GGUFReader(path)
    out = tmp_path / "q8_1.gguf"
    writer = gguf.GGUFWriter(out, "llama")
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for tensor in reader.tensors:
        data, qtype = np.asarray(tensor.data), Q(tensor.tensor_type)
        if tensor.name == "blk.1.ffn_up.weight":
            rows, cols = data.shape[0], int(tensor.shape[0])
            data, qtype = np.zeros((rows, cols // 32 * 40), np.uint8), Q.Q8_1
        writer.add_tensor(tensor.name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        ValueError,
        match=r"tensor 'blk.1.ffn_up.weight' has quantisation type Q8_1, which the gguf "
        "package cannot dequantise",
    ):
        pretrained.load(out, progress=False)


@pytest.mark.parametrize(
    "name,change,field,want",
    [
        # head_dim is key_length (llama.cpp's n_embd_head_k), whatever value_length says
        ("llama-tiny", {"llama.attention.value_length": 4}, "head_dim", 8),
        # the 27B models scale by hidden / heads: 32 / 4 here, not key_length 16
        ("gemma2-tiny", {"gemma2.block_count": 46}, "query_pre_attn_scalar", 8),
        ("gemma3-tiny", {"gemma3.block_count": 62}, "query_pre_attn_scalar", 8),
        ("gemma2-tiny", {"gemma2.block_count": 42}, "query_pre_attn_scalar", 16),
        # llama.cpp's defaults for keys a file leaves out
        (
            "phi3-tiny",
            {"phi3.rope.scaling.original_context_length": None},
            "original_max_position_embeddings",
            4096,
        ),
        # Gemma 3 without a window key has no sliding layers (its converter leaves the
        # key out when every layer is full); Gemma 2 without one slides by 4096
        ("gemma3-tiny", {"gemma3.attention.sliding_window": None}, "sliding_window", None),
        (
            "gemma3-tiny",
            {"gemma3.attention.sliding_window": None},
            "layer_types",
            ["full_attention"] * 6,
        ),
        ("gemma2-tiny", {"gemma2.attention.sliding_window": None}, "sliding_window", 4096),
        (
            "gemma3-tiny",
            {"gemma3.rope.freq_base_swa": None},
            "rope_parameters",
            {
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        ),
    ],
)
def test_gguf_metadata_becomes_the_config_llama_cpp_runs(tmp_path, name, change, field, want):
    path = rewrite(export(HF / name, tmp_path / "model.gguf"), tmp_path, lambda r: dict(change))
    assert gguf_reader.GgufFile(path).config()[field] == want


def test_a_llama_file_turning_part_of_each_head_is_the_scaled_rope_that_reads_the_share(tmp_path):
    """llama.cpp turns `rope.dimension_count` features of each head; transformers' Llama
    turns part of a head only under a scaled rope (its default ignores the share). A file
    with 4 of 8 features turning equals the Hugging Face copy with linear-by-1 and a
    share of a half, and differs from the whole head turning."""
    path = export(HF / "llama-tiny", tmp_path / "model.gguf")
    partial = rewrite(path, tmp_path, lambda reader: {"llama.rope.dimension_count": 4})
    tokens = expected("llama-tiny")["tokens"]
    module, params, _ = pretrained.load(partial)
    got, _ = pretrained.apply_with_attention(module, params, tokens)
    rope = {"rope_type": "linear", "factor": 1.0, "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    folder = copy_checkpoint("llama-tiny", tmp_path, {"rope_parameters": rope})
    want, _ = pretrained.apply_with_attention(*folder_as_stored(folder, module), tokens)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.abs(np.asarray(got) - expected("llama-tiny")["logits"]).max() > 1e-2


def test_a_gguf_the_system_cannot_read_is_a_value_error_naming_the_file(tmp_path, monkeypatch):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(60))

    def refuse(p):
        raise PermissionError(13, "Permission denied", str(p))

    monkeypatch.setattr(gguf_reader.header, "read", refuse)
    with pytest.raises(ValueError, match=rf"GGUF file {path} cannot be read") as info:
        gguf_reader.GgufFile(path)
    assert isinstance(info.value.__cause__, PermissionError)


def test_find_expands_a_home_folder_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.gguf").write_bytes(b"")
    assert gguf_reader.find("~/models/m.gguf") == tmp_path / "models" / "m.gguf"
    assert gguf_reader.find("~/models") == tmp_path / "models" / "m.gguf"


def test_a_gemma2_gguf_with_a_rope_scaling_factor_runs_the_linearly_scaled_rope(tmp_path):
    """llama.cpp reads `rope.scaling.factor` as linear when no type is stored, and Gemma 2
    takes it like Gemma 3's full layers: the file runs as the Hugging Face copy with that
    rope (and the key_length ** -0.5 score scale a GGUF file implies), not as the
    unscaled one."""
    extra = lambda w: w.add_rope_scaling_factor(2.0)  # noqa: E731
    path = export(HF / "gemma2-tiny", tmp_path / "model.gguf", extra=extra)
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert gguf_reader.GgufFile(path).config()["rope_parameters"] == rope
    tokens = expected("gemma2-tiny")["tokens"]
    module, params, _ = pretrained.load(path)
    got, _ = pretrained.apply_with_attention(module, params, tokens)
    change = {"rope_parameters": rope, "query_pre_attn_scalar": 16}
    scaled = folder_as_stored(copy_checkpoint("gemma2-tiny", tmp_path / "scaled", change), module)
    # Unscaled: the fixture's own rope, the model a file without the factor holds (the
    # test above runs it: one program for both).
    folder = copy_checkpoint("gemma2-tiny", tmp_path / "unscaled", {"query_pre_attn_scalar": 16})
    unscaled, unscaled_params, _ = pretrained.load(folder)
    logits = {
        "scaled": pretrained.apply_with_attention(*scaled, tokens)[0],
        "unscaled": pretrained.apply_with_attention(
            eps_as_stored(unscaled), unscaled_params, tokens
        )[0],
    }
    np.testing.assert_allclose(got, logits["scaled"], atol=1e-5)
    assert np.abs(np.asarray(got) - logits["unscaled"]).max() > 1e-3
