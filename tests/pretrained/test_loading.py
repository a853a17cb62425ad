"""The loader: every family's fixture against transformers' numbers, config fields read
as transformers reads them, dtypes, parameter shapes traced block by block, GGUF files
read by threads into the same names, values and config as the reference reader's
(`reference_gguf`, one tensor at a time by the `gguf` package), the progress bar, errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from safetensors.numpy import load_file

from beyondpar import pretrained
from beyondpar.base import parallel
from beyondpar.benchmarks import gguf_models, reference_gguf
from beyondpar.pretrained import hf_folder, loading, running, sharding
from beyondpar.pretrained.gguf import quants as gguf_quants
from beyondpar.pretrained.gguf import reader as gguf_reader
from helpers.gguf_export import export
from helpers.hf_fixtures import (
    ATTENTION_ATOL,
    CONFIG_VARIANTS,
    FAMILIES,
    copy_checkpoint,
    expected,
)
from helpers.paths import DATA

HF = DATA / "hf"
FIXTURES = sorted(p.name for p in HF.iterdir() if (p / "config.json").is_file())
TINY_QWEN2 = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    max_position_embeddings=128,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
)


@pytest.fixture(scope="module")
def qwen2_gguf(tmp_path_factory):
    """A Qwen2-shaped GGUF with every type of llama.cpp's Q4_K_M mix: Q5_0, Q8_0 (rows of
    64 values), Q4_K and Q6_K (the MLP down projection, rows of 256)."""
    path = tmp_path_factory.mktemp("gguf") / "qwen2.gguf"
    counts = gguf_models.write_qwen2_gguf(path, TINY_QWEN2)
    assert set(counts) == {"Q5_0", "Q8_0", "Q4_K", "Q6_K", "F32"}
    return path


def full_trace_shapes(module):
    like = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), int)))
    leaves = jax.tree_util.tree_leaves_with_path(like["params"])
    return {tuple(p.key for p in path): tuple(leaf.shape) for path, leaf in leaves}


@pytest.mark.parametrize("name", FIXTURES)
def test_block_by_block_shapes_are_the_whole_networks(name):
    module = pretrained.build(hf_folder.read_config(HF / name))
    assert pretrained.parameter_shapes(module) == full_trace_shapes(module)


def test_shapes_of_layers_with_different_blocks():
    config = hf_folder.read_config(HF / "qwen3-tiny")
    config.update(
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
        use_sliding_window=True,
    )
    module = pretrained.build(config)
    assert module.config.layer_windows == (4, None)
    assert pretrained.parameter_shapes(module) == full_trace_shapes(module)


@pytest.mark.parametrize(
    "name,head",
    [
        ("llama-tiny", "lm_head"),
        ("neox-tiny", "embed_out"),
        ("gemma3-legacy", "lm_head"),
        ("phi3-tiny", "lm_head"),
    ],
)
def test_untied_heads_are_kept_as_stored(name, head):
    """An untied output head is an Embed holding the checkpoint's vocab x hidden matrix
    (no transpose), split by vocabulary like the embedding; tied models have none."""
    module, params, _ = pretrained.load(HF / name, progress=False)
    stored = load_file(HF / name / "model.safetensors")
    stored_name = "embed_out.weight" if head == "embed_out" else "lm_head.weight"
    np.testing.assert_array_equal(params[head]["embedding"], stored[stored_name])
    assert sharding.partition_spec((head, "embedding"), 2, module.config, 4) == P("model", None)
    _, tied, _ = pretrained.load(HF / "gemma3-tiny", progress=False)
    assert "lm_head" not in tied


def test_a_row_order_must_name_every_stored_row(tmp_path):
    """A family's row order (Phi-3's groups) against a tensor of another size is named,
    from a safetensors file and from a GGUF one; a tensor GGUF stores transposed (GPT-2's
    Conv1D) takes none."""
    name = "model.layers.0.self_attn.qkv_proj.weight"
    with hf_folder.Safetensors(hf_folder.shard_files(HF / "phi3-tiny")) as source:
        rows = source.tensor(name).shape[0]
        message = rf"tensor '{name}' must have {rows - 1} rows, got {rows}"
        with pytest.raises(ValueError, match=message):
            source.read(name, True, order=np.arange(rows - 1))
    phi3 = gguf_reader.GgufFile(export(HF / "phi3-tiny", tmp_path / "phi3.gguf"))
    with pytest.raises(ValueError, match=rf"must have {rows + 1} rows, got {rows}"):
        phi3.read(name, True, order=np.arange(rows + 1))
    gpt2 = gguf_reader.GgufFile(export(HF / "gpt2-tiny", tmp_path / "gpt2.gguf"))
    with pytest.raises(ValueError, match="'h.0.attn.c_attn.weight' is stored transposed"):
        gpt2.read("h.0.attn.c_attn.weight", False, order=np.arange(96))


def leaves(params):
    return {
        jax.tree_util.keystr(p): np.asarray(x)
        for p, x in jax.tree_util.tree_leaves_with_path(params)
    }


@pytest.mark.parametrize("kernels", ["every shape", "large shapes only"])
def test_gguf_values_are_the_reference_readers_bit_for_bit(qwen2_gguf, monkeypatch, kernels):
    """Every type of the Q4_K_M mix, each parameter under its name; the tokenizer holds
    the file's vocabulary as the `gguf` package reads it."""
    if kernels == "every shape":
        monkeypatch.setattr(gguf_quants, "KERNEL_MIN_VALUES", 0)
    module, params, tokenizer = pretrained.load(qwen2_gguf, progress=False)
    ref_module, ref_params, _ = reference_gguf.load(qwen2_gguf)
    assert module.config == ref_module.config
    new, ref = leaves(params), leaves(ref_params)
    assert new.keys() == ref.keys() and len(new) == 3 * 12 + 3
    for key in new:
        assert new[key].dtype == np.float32, key
        np.testing.assert_array_equal(new[key], ref[key], err_msg=key)
    assert params["lm_head"]["embedding"].shape == (512, 64)  # as stored: no transpose
    vocabulary = reference_gguf.ReferenceGguf(qwen2_gguf).value("tokenizer.ggml.tokens")
    assert [tokenizer.id_to_token(i) for i in range(len(vocabulary))] == vocabulary


@pytest.mark.parametrize("name", ["llama-tiny", "qwen3-tiny"])
def test_exported_gguf_reads_as_the_reference_reader_reads_it(tmp_path, name):
    """Llama's q/k rows, stored permuted for llama.cpp's rotary, and Qwen3's q/k norms
    come back under the reference reader's names, in its row order, with its config."""
    path = export(HF / name, tmp_path / f"{name}.gguf")
    module, params, _ = pretrained.load(path, progress=False)
    ref_module, ref_params, _ = reference_gguf.load(path)
    assert module.config == ref_module.config
    new, ref = leaves(params), leaves(ref_params)
    assert new.keys() == ref.keys()
    for key in new:
        np.testing.assert_array_equal(new[key], ref[key], err_msg=key)


@pytest.mark.parametrize("kernels", ["every shape", "large shapes only"])
def test_bfloat16_is_the_reference_readers_cast(qwen2_gguf, monkeypatch, kernels):
    if kernels == "every shape":
        monkeypatch.setattr(gguf_quants, "KERNEL_MIN_VALUES", 0)
    _, params, _ = pretrained.load(qwen2_gguf, jnp.bfloat16, progress=False)
    _, ref_params, _ = reference_gguf.load(qwen2_gguf, jnp.bfloat16)
    new, ref = leaves(params), leaves(ref_params)
    for key in new:
        assert new[key].dtype == jnp.bfloat16
        np.testing.assert_array_equal(new[key], ref[key], err_msg=key)


def test_one_thread_or_many_read_the_same(qwen2_gguf, monkeypatch):
    monkeypatch.setattr(gguf_quants, "KERNEL_MIN_VALUES", 0)
    _, many, _ = pretrained.load(qwen2_gguf, progress=False)
    monkeypatch.setattr(gguf_reader.GgufFile, "workers", 1)
    _, one, _ = pretrained.load(qwen2_gguf, progress=False)
    for key, value in leaves(one).items():
        np.testing.assert_array_equal(value, leaves(many)[key])


class RecordingBar:
    """Stands in for tqdm.tqdm and keeps what the loader told it."""

    made: list = []

    def __init__(self, total, disable=False, **kwargs):
        self.total, self.disable, self.n, self.closed = total, disable, 0, False
        RecordingBar.made.append(self)

    def update(self, n):
        self.n += n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.closed = True


@pytest.mark.parametrize("source", ["gguf", "hf"])
def test_progress_bar_counts_every_parameter_and_finishes(qwen2_gguf, monkeypatch, source):
    monkeypatch.setattr(loading.tqdm, "tqdm", RecordingBar)
    RecordingBar.made = []
    path = qwen2_gguf if source == "gguf" else HF / "llama-tiny"
    _, params, _ = pretrained.load(path)
    (bar,) = RecordingBar.made
    values = sum(x.size for x in jax.tree.leaves(params))
    assert bar.total == values and bar.n == values and bar.closed
    assert bar.disable is None  # shown on a terminal, not in a log
    pretrained.load(path, progress=False)
    assert RecordingBar.made[-1].disable is True


def test_a_failing_tensor_stops_the_load_with_its_error(qwen2_gguf, monkeypatch):
    read = gguf_reader.GgufFile.read
    calls = []

    def failing(self, name, transpose, dtype=None, order=None):
        calls.append(name)
        if name == "model.layers.1.mlp.up_proj.weight":
            raise ValueError(f"tensor {name!r} cannot be read: test")
        return read(self, name, transpose, dtype, order)

    monkeypatch.setattr(gguf_reader.GgufFile, "read", failing)
    with pytest.raises(ValueError, match="'model.layers.1.mlp.up_proj.weight' cannot be read"):
        pretrained.load(qwen2_gguf, progress=False)


def test_a_broken_tokenizer_stops_the_load(qwen2_gguf, monkeypatch):
    def broken(self):
        raise ValueError("tokenizer.ggml.model must be 'gpt2' (test)")

    monkeypatch.setattr(gguf_reader.GgufFile, "tokenizer", broken)
    with pytest.raises(ValueError, match=r"tokenizer.ggml.model must be 'gpt2' \(test\)"):
        pretrained.load(qwen2_gguf, progress=False)


def test_loaded_config_matches_the_written_shape(qwen2_gguf):
    module, _, _ = pretrained.load(qwen2_gguf, progress=False)
    cfg = dataclasses.asdict(module.config)
    assert (cfg["num_layers"], cfg["num_heads"], cfg["num_kv_heads"], cfg["mlp_dim"]) == (
        3,
        4,
        2,
        256,
    )
    assert cfg["qkv_bias"] and not cfg["tied"]


@pytest.mark.parametrize(
    "name,attribute",
    [
        ("num_hidden_layers", "num_layers"),
        ("intermediate_size", "mlp_dim"),
        ("max_position_embeddings", "max_len"),
        ("vocab_size", "vocab_size"),
    ],
)
def test_a_size_of_zero_in_the_config_is_named_and_one_builds(name, attribute):
    """Layer, feature, position and token counts describe no model at 0 (a network of no
    layers would run as an embedding and a head alone): the field is named with its value.
    1, the smallest size, builds a model of exactly that size."""
    config = hf_folder.read_config(HF / "llama-tiny")
    with pytest.raises(ValueError, match=rf"'{name}' must be an integer >= 1, got 0"):
        pretrained.build({**config, name: 0})
    with pytest.raises(ValueError, match=rf"'{name}' must be an integer >= 1, got -2"):
        pretrained.build({**config, name: -2})
    module = pretrained.build({**config, name: 1})
    assert getattr(module.config, attribute) == 1


def test_kernels_are_compiled_only_for_shapes_with_many_values(qwen2_gguf, monkeypatch):
    source = gguf_reader.GgufFile(qwen2_gguf)
    assert source._compiled == set()  # 0.2M values in all: NumPy is quicker than compiling
    monkeypatch.setattr(gguf_quants, "KERNEL_MIN_VALUES", 6 * 256 * 64)  # gate and up
    source = gguf_reader.GgufFile(qwen2_gguf)
    assert {(q.name, r, c) for q, r, c in source._compiled} == {("Q5_0", 256, 64)}
    assert isinstance(source.read("model.layers.2.mlp.up_proj.weight", True), jax.Array)
    assert isinstance(source.read("lm_head.weight", False), np.ndarray)


@pytest.mark.parametrize("data,model", [(1, 2), (2, 1)])
def test_parameters_split_along_the_model_axis_only(data, model):
    """A 1 x 2 mesh splits the query heads over its model axis; a 2 x 1 mesh (data
    parallel) keeps every parameter whole on each device."""
    mesh = parallel.model_mesh(data, model)
    _, params, _ = pretrained.load(HF / "llama-tiny", mesh=mesh, progress=False)
    kernel = params["layers_0"]["q_proj"]["kernel"]
    assert kernel.sharding.spec == (P(None, "model") if model > 1 else P())
    assert kernel.sharding.mesh.shape == {"data": data, "model": model}


def test_a_qwen2_gguf_with_a_sliding_window_windows_every_layer(tmp_path):
    """A Qwen2 GGUF records `qwen2.attention.sliding_window` but no max_window_layers, and
    llama.cpp windows every layer with it: each query of every layer, the first included,
    reads itself and the window - 1 keys before it (a window of 5, not the fixture's 8)."""
    folder = copy_checkpoint("qwen2-tiny", tmp_path, config={"sliding_window": 5})
    module, params, _ = pretrained.load(export(folder, tmp_path / "q.gguf"), progress=False)
    cfg = module.config
    assert [cfg.window(layer) for layer in range(cfg.num_layers)] == [5] * cfg.num_layers
    _, attn = pretrained.apply_with_attention(module, params, expected("qwen2-tiny")["tokens"])
    attn = np.asarray(attn)
    i, j = np.indices(attn.shape[-2:])
    assert attn.shape[1] == 2
    assert not attn[..., i - j >= 5].any()
    assert (attn[..., i - j == 4] > 0).all()


def test_fingerprint_follows_the_files_load_reads_not_their_folder(tmp_path, qwen2_gguf):
    """A copy of a model is the same model; another model, a weight changed near either
    end of its file or a GGUF file cut short is another; a GGUF file under another name is
    the same."""
    import shutil

    tiny = pretrained.fingerprint(HF / "gpt2-tiny")
    copy = tmp_path / "copy"
    shutil.copytree(HF / "gpt2-tiny", copy)
    assert pretrained.fingerprint(copy) == tiny
    assert pretrained.fingerprint(HF / "gpt2-untied") != tiny
    weights = copy / hf_folder.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor
    weights.write_bytes(bytes(data))
    assert pretrained.fingerprint(copy) != tiny
    (copy / hf_folder.CONFIG).write_text((HF / "gpt2-tiny" / hf_folder.CONFIG).read_text() + " ")
    weights.write_bytes((HF / "gpt2-tiny" / hf_folder.WEIGHTS).read_bytes())
    assert pretrained.fingerprint(copy) != tiny  # the config's size changed
    renamed = tmp_path / "renamed.gguf"
    shutil.copyfile(qwen2_gguf, renamed)
    assert pretrained.fingerprint(renamed) == pretrained.fingerprint(qwen2_gguf)
    renamed.write_bytes(renamed.read_bytes()[:-1])
    assert pretrained.fingerprint(renamed) != pretrained.fingerprint(qwen2_gguf)


def test_fingerprint_samples_the_end_and_the_size_of_a_large_file(tmp_path):
    """A file over twice the sample: a byte changed in its last MiB, or more bytes whose
    first and last MiB are the same, give another fingerprint."""
    big = loading.FINGERPRINT_SAMPLE_BYTES * 3
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(big))
    before = pretrained.fingerprint(path)
    assert pretrained.fingerprint(path) == before
    path.write_bytes(bytes(big - 1) + b"\x01")
    assert pretrained.fingerprint(path) != before
    path.write_bytes(bytes(big + loading.FINGERPRINT_SAMPLE_BYTES))
    assert pretrained.fingerprint(path) != before


def test_fingerprint_covers_the_tokenizer_of_a_folder(tmp_path):
    import shutil

    tiny = pretrained.fingerprint(HF / "gpt2-tiny")
    copy = tmp_path / "copy"
    shutil.copytree(HF / "gpt2-tiny", copy)
    tokenizer = copy / hf_folder.TOKENIZER
    tokenizer.write_text(tokenizer.read_text() + " ")
    assert pretrained.fingerprint(copy) != tiny


@pytest.mark.parametrize("name", FAMILIES)
def test_parity_with_transformers(name):
    exp = expected(name)
    module, params, tokenizer = pretrained.load(HF / name)
    ids = tokenizer.encode(str(exp["text"])).ids
    np.testing.assert_array_equal(ids[: exp["tokens"].shape[1]], exp["tokens"][0])
    logits, attn = pretrained.apply_with_attention(module, params, exp["tokens"])
    assert attn.dtype == jnp.float32 and attn.shape == exp["attention"].shape
    np.testing.assert_allclose(logits, exp["logits"], atol=1e-4)
    np.testing.assert_allclose(attn, exp["attention"], atol=ATTENTION_ATOL.get(name, 1e-5))


@pytest.mark.float64
@pytest.mark.parametrize("name", CONFIG_VARIANTS)
def test_config_fields_are_read_as_transformers_reads_them(name):
    """Fixtures whose config.json holds a field as real checkpoints write it, where
    reading it another way changes every output (see `hf_fixtures.CONFIG_VARIANTS`). In
    float64, so that what is compared is the model each config describes."""
    exp = expected(name)
    module, params, _ = pretrained.load(HF / name, jnp.float64)
    logits, attn = pretrained.apply_with_attention(module, params, exp["tokens"])
    np.testing.assert_allclose(logits, exp["logits"], atol=1e-4)
    np.testing.assert_allclose(attn, exp["attention"], atol=1e-5)


def test_bf16_stays_bf16_and_attention_is_float32(tmp_path):
    def to_bf16(weights):
        return {k: v.astype(jnp.bfloat16) for k, v in weights.items()}

    folder = copy_checkpoint("llama-tiny", tmp_path, tensors=to_bf16)
    module, params, _ = pretrained.load(folder)
    assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    logits, attn = pretrained.apply_with_attention(module, params, expected("llama-tiny")["tokens"])
    assert attn.dtype == jnp.float32 and logits.dtype == jnp.bfloat16
    np.testing.assert_allclose(attn.sum(-1), 1.0, rtol=1e-6)
    assert np.abs(np.asarray(attn) - expected("llama-tiny")["attention"]).max() < 0.1
    _, params32, _ = pretrained.load(folder, jnp.float32)
    assert {p.dtype for p in jax.tree.leaves(params32)} == {jnp.dtype(jnp.float32)}


@pytest.mark.parametrize(
    "config,message",
    [
        ({"model_type": "bert"}, r"'model_type' must be one of .*, got 'bert'"),
        (
            {"rope_parameters": {"rope_type": "yarm", "rope_theta": 1e4}},
            r"'rope_type' must be one of \['default', 'dynamic', 'linear', 'llama3', 'yarn'\], "
            "got 'yarm'",
        ),
        ({"num_key_value_heads": 3}, "'num_key_value_heads' must divide num_attention_heads=4"),
        ({"hidden_act": "tanh"}, r"'hidden_act' must be one of .*, got 'tanh'"),
    ],
)
def test_bad_configs_name_the_field(config, message, tmp_path):
    folder = copy_checkpoint("llama-tiny", tmp_path, config)
    with pytest.raises(ValueError, match=message):
        pretrained.load(folder)


def test_wrong_tensor_shape_is_named(tmp_path):
    def shrink(weights):
        weights["transformer.h.1.mlp.c_fc.weight"] = weights["transformer.h.1.mlp.c_fc.weight"][
            :, :64
        ]
        return weights

    folder = copy_checkpoint("gpt2-tiny", tmp_path, tensors=shrink)
    with pytest.raises(
        ValueError,
        match=r"'transformer.h.1.mlp.c_fc.weight' must have shape \(32, 128\), got \(32, 64\)",
    ):
        pretrained.load(folder)


@pytest.mark.parametrize(
    "name,field",
    [
        ("gpt2-tiny", "layer_norm_epsilon"),
        ("llama-tiny", "rms_norm_eps"),
        ("neox-tiny", "layer_norm_eps"),
        ("qwen3-tiny", "rms_norm_eps"),
    ],
)
def test_norm_epsilon_is_read_from_config(tmp_path, name, field):
    """A large epsilon changes every norm's output: the config's value must reach the
    module (the fixtures use the defaults, which a misspelt field would fall back to).
    Seen through the final norm alone (`unembed`, a small program to compile): the same
    stream and parameters give other logits than under the fixture's own epsilon."""
    folder = copy_checkpoint(name, tmp_path, {field: 0.5})
    module, params, _ = pretrained.load(folder)
    assert module.config.eps == 0.5
    default = pretrained.build(hf_folder.read_config(HF / name))
    assert default.config.eps < 1e-4
    x = np.random.default_rng(0).normal(size=(1, 4, module.config.embed_dim))
    x = x.astype(np.float32)
    got = running.unembed(module, params, x)
    want = running.unembed(default, params, x)
    assert np.abs(np.asarray(got) - np.asarray(want)).max() > 1e-3
