"""The Transformer: parameter parity across head counts, causality, attention, dropout."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import linear, model
from beyondpar.norm import rms_norm

SMALL = dict(vocab_size=11, embed_dim=16, num_layers=2, mlp_dim=24, max_len=12)


def small_params(key, num_layers=SMALL["num_layers"]):
    """The parameters of a SMALL model of `num_layers` layers (at most SMALL's), from the one
    `init_params` program of SMALL's sizes that the tests here share: Flax draws each
    layer's parameters from the layer's name, so a shallower model's are the first layers'."""
    params = model.init_params(model.Transformer(model.ModelConfig(num_heads=1, **SMALL)), key)
    dropped = {f"layers_{i}" for i in range(num_layers, SMALL["num_layers"])}
    return {name: p for name, p in params.items() if name not in dropped}


@pytest.fixture(scope="module")
def one_layer_params():
    """NumPy copies of one-layer SMALL parameters by seed, drawn once with x64 off (a
    module fixture is set up before a `float64` test turns it on): under x64 the same
    `init_params` is another program to compile."""
    return {
        seed: jax.tree.map(np.asarray, small_params(jax.random.PRNGKey(seed), 1)) for seed in (0, 1)
    }


def test_parameter_count_is_the_same_for_every_head_count():
    counts = {}
    for heads in (1, 4, 8, 16):
        module = model.Transformer(model.ModelConfig(num_heads=heads))
        shapes = jax.eval_shape(lambda m=module: model.init_params(m, jax.random.PRNGKey(0)))
        counts[heads] = model.count_params(shapes)
    assert set(counts.values()) == {172_800}


@pytest.mark.float64
def test_parameters_are_float32_when_64_bit_arrays_are_on():
    """Flax's float32 parameters, whatever JAX's default float (here float64: x64 on):
    a layer that took the default would train and save float64 weights."""
    assert jnp.zeros(()).dtype == jnp.float64
    module = model.Transformer(model.ModelConfig(num_heads=2, **SMALL))
    # Traced, not run: the dtypes are the program's, without compiling it under x64.
    params = jax.eval_shape(lambda key: model.init_params(module, key), jax.random.PRNGKey(0))
    dtypes = {
        jax.tree_util.keystr(p): a.dtype for p, a in jax.tree_util.tree_leaves_with_path(params)
    }
    assert set(dtypes.values()) == {jnp.dtype(jnp.float32)}, dtypes


@pytest.mark.parametrize(
    "config",
    [
        dict(num_heads=4, dropout_rate=0.3, **SMALL),
        # Another head count and no dropout, at SMALL's sizes: the one `init_params`
        # program of the tests here, not a program of sizes of its own.
        dict(num_heads=2, dropout_rate=0.0, **SMALL),
    ],
)
def test_init_params_are_modules_own_initialisation(config):
    """`init_params` jits one program for every head count and dropout rate: its values
    are the module's own `init` for the module's sizes (to the last bit of the normal
    samples' float32 rounding, which XLA's fused code may place differently)."""
    module = model.Transformer(model.ModelConfig(**config))
    key = jax.random.PRNGKey(5)
    got = model.init_params(module, key)  # the program of the other tests' SMALL models
    tokens = jnp.zeros((1, module.config.max_len), jnp.int32)
    want = module.init(key, tokens)["params"]
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_max_ulp(np.asarray(a), np.asarray(b), maxulp=2)


@pytest.mark.parametrize("heads", [1, 4])
def test_logits_do_not_depend_on_later_tokens(heads):
    module = model.Transformer(model.ModelConfig(num_heads=heads, **SMALL))
    params = model.init_params(module, jax.random.PRNGKey(0))
    # The token shape of the other SMALL models here: their operations are shared.
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 12), 0, 11)
    embed = params["token_emb"]["embedding"][tokens]

    def logit_at(position, x):
        # The model from the token embeddings on, so that gradients reach every input.
        pos = params["pos_emb"]["embedding"][: x.shape[1]]
        h = x + pos
        for i in range(module.config.num_layers):
            h = model.Block(module.config).apply(
                {"params": params[f"layers_{i}"]}, h, deterministic=True
            )
        head = params["head"]
        return jnp.sum((h @ head["kernel"] + head["bias"])[0, position])

    full = module.apply({"params": params}, tokens)
    # One program for the value and for every position's gradient.
    value_and_grad_at = jax.jit(jax.value_and_grad(logit_at, argnums=1))
    value, _ = value_and_grad_at(3, embed)
    np.testing.assert_allclose(
        full[0, 3].sum(), value, rtol=1e-5
    )  # the unrolled model is the model
    for position in (0, 4, 9):
        _, grad = value_and_grad_at(position, embed)
        norms = np.linalg.norm(np.asarray(grad[0]), axis=-1)
        assert np.all(norms[position + 1 :] == 0), (position, norms)
        assert norms[position] > 0


def test_attention_rows_sum_to_one_and_are_causal():
    module = model.Transformer(model.ModelConfig(num_heads=4, **SMALL))
    params = model.init_params(module, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 12), 0, 11)
    logits, attn = model.apply_with_attention(module, params, tokens)
    assert logits.shape == (3, 12, 11)
    assert attn.shape == (3, 2, 4, 12, 12)
    np.testing.assert_allclose(attn.sum(-1), 1.0, rtol=1e-6)
    assert np.all(np.triu(np.asarray(attn), 1) == 0)
    plain = module.apply({"params": params}, tokens)
    np.testing.assert_array_equal(plain, logits)


def test_dropout_keeps_the_right_fraction_and_scales():
    x = jnp.ones((64, 4, 32, 32))
    out = model.Dropout(0.1).apply(
        {}, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(3)}
    )
    kept = np.asarray(out) > 0
    n = kept.size
    assert abs(kept.mean() - 0.9) < 4 * np.sqrt(0.09 / n)
    np.testing.assert_allclose(np.asarray(out)[kept], 1 / 0.9, rtol=1e-6)
    # Neighbouring elements and rows are not correlated.
    flat = kept.reshape(-1, 32).astype(float)
    assert abs(np.corrcoef(flat[:, :-1].ravel(), flat[:, 1:].ravel())[0, 1]) < 0.01
    assert abs(np.corrcoef(flat[:-1].ravel(), flat[1:].ravel())[0, 1]) < 0.01
    same = model.Dropout(0.1).apply({}, x, deterministic=True)
    np.testing.assert_array_equal(same, x)
    # Without the rescale: the same mask (the same key), the kept values as they were.
    plain = model.Dropout(0.1, rescale=False).apply(
        {}, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(3)}
    )
    np.testing.assert_array_equal(np.asarray(plain) > 0, kept)
    np.testing.assert_array_equal(np.asarray(plain)[kept], 1.0)
    assert model.keep_probability(0.1) == pytest.approx(0.9, abs=2**-32)


@pytest.mark.parametrize("rescale", [True, False])
def test_dropout_gradient_is_its_mask_over_the_keep_probability(rescale):
    """d out / d x is the mask (over the keep probability when rescaling), in x's dtype."""
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 40), jnp.float32)
    weights = jax.random.normal(jax.random.PRNGKey(1), x.shape, jnp.float32)
    dropout = model.Dropout(0.35, rescale=rescale)
    rngs = {"dropout": jax.random.PRNGKey(7)}
    apply = lambda y: dropout.apply({}, y, deterministic=False, rngs=rngs)
    kept = np.asarray(apply(jnp.ones_like(x))) != 0
    assert 0.5 < kept.mean() < 0.8
    grad = jax.jit(jax.grad(lambda y: jnp.sum(apply(y) * weights)))(x)
    assert grad.dtype == x.dtype
    scale = 1 / model.keep_probability(0.35) if rescale else 1.0
    expected = np.where(kept, np.asarray(weights) * np.float32(scale), 0)
    np.testing.assert_allclose(grad, expected, rtol=1e-6)
    # The same gradient as the mask multiplied in as written, differentiated by JAX.
    written = lambda y: jnp.where(kept, y * np.float32(scale), 0)
    np.testing.assert_allclose(
        grad, jax.grad(lambda y: jnp.sum(written(y) * weights))(x), rtol=1e-6
    )


def test_row_seeds_are_distinct_and_a_later_shard_continues_the_whole_batch():
    words = jnp.array([0x12345678, 0x9ABCDEF0], jnp.uint32)
    whole = np.asarray(model.row_seeds(words, (6, 3, 5)))
    assert whole.shape == (6, 3, 5) and len(np.unique(whole)) == whole.size
    np.testing.assert_array_equal(model.row_seeds(words, (2, 3, 5), 4), whole[4:])
    np.testing.assert_array_equal(model.row_seeds(words, (3, 3, 5), 1), whole[1:4])
    np.testing.assert_array_equal(model.row_seeds(words, (1, 5), 2), whole.reshape(-1, 5)[2:3])
    # Each key word changes every seed.
    for changed in (words.at[0].add(1), words.at[1].add(1)):
        assert np.mean(np.asarray(model.row_seeds(changed, (6, 3, 5))) == whole) < 0.01


@pytest.mark.parametrize("rate", [0.3, 0.05])
def test_dropout_split_over_devices_keeps_the_whole_batchs_elements(rate):
    """Under `shard_map` over `data_axis`, each device's rows of the mask are the rows it
    holds of the whole batch's mask: the same step on any number of devices."""
    from jax.sharding import PartitionSpec as P

    from beyondpar.base import parallel

    mesh = parallel.data_mesh()
    x = jnp.ones((2 * mesh.size, 3, 16))
    key = jax.random.PRNGKey(5)
    whole = model.Dropout(rate).apply({}, x, deterministic=False, rngs={"dropout": key})

    def shard(y, k):
        dropout = model.Dropout(rate, data_axis=parallel.DATA)
        return dropout.apply({}, y, deterministic=False, rngs={"dropout": k})

    split = jax.jit(
        jax.shard_map(shard, mesh=mesh, in_specs=(P(parallel.DATA), P()), out_specs=P("data"))
    )
    assert mesh.size > 1
    np.testing.assert_array_equal(split(x, key), whole)
    assert 0 < np.mean(np.asarray(whole) == 0) < 2 * rate


def test_training_logits_split_over_devices_are_the_whole_batchs():
    """A `Transformer` with `data_axis`, each device holding its sequences under
    `shard_map` (two each), gives the training-mode logits of the whole batch run on one device:
    every layer's attention and MLP dropout draw the whole batch's masks."""
    from jax.sharding import PartitionSpec as P

    from beyondpar.base import parallel

    mesh = parallel.data_mesh()
    cfg = model.ModelConfig(**{**SMALL, "num_layers": 1, "num_heads": 2, "dropout_rate": 0.3})
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2 * mesh.size, 5), 0, cfg.vocab_size)
    params = small_params(jax.random.PRNGKey(1), cfg.num_layers)
    key = jax.random.PRNGKey(2)

    def logits(module, p, t, k):
        return module.apply({"params": p}, t, deterministic=False, rngs={"dropout": k})

    def whole_and_evaluation(p, t, k):  # one program: the evaluation is not run op by op
        module = model.Transformer(cfg)
        return logits(module, p, t, k), module.apply({"params": p}, t)

    whole, evaluation = jax.jit(whole_and_evaluation)(params, tokens, key)
    shard_module = model.Transformer(cfg, data_axis=parallel.DATA)
    split = jax.jit(
        jax.shard_map(
            functools.partial(logits, shard_module),
            mesh=mesh,
            in_specs=(P(), P(parallel.DATA), P()),
            out_specs=P(parallel.DATA),
        )
    )
    assert mesh.size > 1
    np.testing.assert_allclose(split(params, tokens, key), whole, rtol=1e-6, atol=1e-6)
    # Dropout is on: the training logits differ from the evaluation ones.
    assert not np.allclose(whole, evaluation, atol=1e-3)


@pytest.mark.parametrize("rate", [0.1, 0.3, 1 / 3, 0.5, 1e-12, 1.0])
def test_keep_probability_is_a_whole_number_of_32_bit_values(rate):
    """An element is kept when its 32 random bits reach a threshold, so the share kept is
    a whole number of the 2^32 values over 2^32, the nearest to 1 - rate (at least one
    value: rate 1 still keeps 2^-32, and a rate under half of 2^-32 drops nothing)."""
    kept_values = model.keep_probability(rate) * 2.0**32
    assert kept_values == round(kept_values)
    assert 1 <= kept_values <= 2**32
    assert abs(kept_values - max((1 - rate) * 2.0**32, 1)) <= 0.5


def test_attention_dropout_is_unbiased():
    """Training-mode attention, averaged over dropout keys, is the eval-mode attention:
    the dropped probabilities are scaled by 1 / keep (here on the values) in expectation."""
    cfg = model.ModelConfig(num_heads=2, dropout_rate=0.5, **SMALL)
    attn = model.CausalSelfAttention(cfg)
    # The input shape of the other training-attention tests: their operations are shared.
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, cfg.embed_dim))
    params = attn.init(jax.random.PRNGKey(1), x, True)
    out_no_bias = lambda y: y - params["params"]["out"]["bias"]
    exact = out_no_bias(attn.apply(params, x, True))

    def train_mode(key):
        return out_no_bias(attn.apply(params, x, False, rngs={"dropout": key}))

    keys = jax.random.split(jax.random.PRNGKey(2), 4000)
    mean = jax.jit(jax.vmap(train_mode))(keys).mean(0)
    scale = float(jnp.sum(mean * exact) / jnp.sum(exact * exact))  # 1 when unbiased
    assert scale == pytest.approx(1.0, abs=0.05)
    np.testing.assert_allclose(mean, exact, atol=0.1 * float(jnp.abs(exact).max()))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(num_heads=3), "num_heads must divide embed_dim=64, got num_heads=3"),
        (dict(num_heads=0), "num_heads must be an integer >= 1, got 0"),
        (dict(dropout_rate=1.0), r"dropout_rate must be in \[0, 1\), got 1.0"),
        (dict(norm_eps=0.0), "norm_eps must be a finite number > 0, got 0.0"),
    ],
)
def test_bad_model_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        model.ModelConfig(**kwargs)


def test_sequence_longer_than_positions():
    module = model.Transformer(model.ModelConfig(num_heads=2, **SMALL))
    with pytest.raises(ValueError, match="sequence length must be <= max_len=12, got 13"):
        module.init(jax.random.PRNGKey(0), jnp.zeros((1, 13), jnp.int32))


def test_norm_eps_reaches_the_norms():
    """A large epsilon damps every RMSNorm: the logits move far beyond float rounding
    (parity tests cannot tell 1e-6 from float32 epsilon)."""
    # The heads and token shape of the other SMALL models here: their operations are shared.
    small = model.Transformer(model.ModelConfig(num_heads=4, **SMALL))
    large = model.Transformer(model.ModelConfig(num_heads=4, norm_eps=10.0, **SMALL))
    params = model.init_params(small, jax.random.PRNGKey(0))
    tokens = jnp.arange(36).reshape(3, 12) % 11
    diff = np.abs(small.apply({"params": params}, tokens) - large.apply({"params": params}, tokens))
    assert diff.max() > 1e-2, diff.max()


def test_layer_by_layer_forward_is_the_models_forward():
    """embed, one block at a time, unembed: the same logits and attention as the whole
    model, with a head mask that differs per layer."""
    # The sizes of the other tests here: their operations are compiled once.
    cfg = model.ModelConfig(num_heads=4, **SMALL)
    module = model.Transformer(cfg)
    params = model.init_params(module, jax.random.PRNGKey(3))
    tokens = jax.random.randint(jax.random.PRNGKey(4), (3, 12), 0, SMALL["vocab_size"])
    mask = jnp.asarray([[0, 0, 0, 1], [0, 1, 0.5, 1]], jnp.float32)
    logits, attn = model.apply_with_attention(module, params, tokens, head_mask=mask)
    x = model.embed(module, params, tokens)
    for layer in range(cfg.num_layers):
        x, layer_attn = model.apply_block(module, params, layer, x, mask[layer])
        np.testing.assert_allclose(layer_attn, attn[:, layer], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(model.unembed(module, params, x), logits, rtol=1e-5, atol=1e-6)
    # The masked heads matter: without the mask the first layer's output differs.
    free, _ = model.apply_block(module, params, 0, model.embed(module, params, tokens))
    masked, _ = model.apply_block(module, params, 0, model.embed(module, params, tokens), mask[0])
    assert float(jnp.max(jnp.abs(free - masked))) > 1e-4


def test_unembed_is_the_models_output_layer_with_its_bias():
    """unembed after the blocks gives the model's logits for any head, a bias included."""
    # The heads and token shape of the layer-by-layer test: its operations are shared.
    module = model.Transformer(model.ModelConfig(num_heads=4, **SMALL))
    params = model.init_params(module, jax.random.PRNGKey(0))
    bias = jax.random.normal(jax.random.PRNGKey(1), params["head"]["bias"].shape)
    params = {**params, "head": {**params["head"], "bias": bias}}
    tokens = jax.random.randint(jax.random.PRNGKey(2), (3, 12), 0, 11)
    x = model.embed(module, params, tokens)
    for layer in range(SMALL["num_layers"]):
        x, _ = model.apply_block(module, params, layer, x)
    logits = module.apply({"params": params}, tokens)
    np.testing.assert_allclose(model.unembed(module, params, x), logits, rtol=1e-5, atol=1e-6)


def _attention_inputs(b=3, h=2, t=7, d=4, seed=0):
    """float64 queries, keys and values and uint32 row seeds, drawn in NumPy: drawn by JAX,
    each shape compiled sampling programs of its own."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, h, t, d)) for _ in range(3))
    return q, k, v, jnp.asarray(rng.integers(0, 2**32, (b, h, t), dtype=np.uint32))


def _attention_by_autodiff(q, k, v, seeds, rate):
    """The same attention written with plain operations, differentiated by JAX."""
    probs = model.causal_softmax(q, k)
    if seeds is not None:
        probs = jnp.where(model.kept_elements(seeds, q.shape[-2], rate), probs, 0)
    return jnp.einsum("bhqk,bhkd->bhqd", probs, v)


@pytest.mark.float64
@pytest.mark.parametrize(
    "rate, shape",
    [
        (0.3, (3, 2, 7, 4)),
        (0.6, (2, 3, 5, 3)),
        (0.0, (1, 1, 6, 2)),
        (0.3, (2, 3, 9, 1)),  # query halves of 4 and 5 rows
        (0.2, (1, 2, 16, 2)),  # query halves of 8 rows
        (0.4, (2, 2, 9, 6)),  # heads past CONTRACT_BY_SUM_HEAD_DIM: products
        (0.2, (1, 2, 48, 5)),  # the same in query halves of 24 rows
        (None, (2, 3, 16, 2)),  # no dropout (seeds None): sums, in query halves
        (None, (1, 2, 48, 5)),  # no dropout: products, in query halves
        (None, (2, 2, 7, 6)),  # no dropout: products, whole
    ],
)
def test_attention_gradient_written_out_matches_autodiff(rate, shape):
    """The hand-written backward (the row sums from the output, no causal-mask gradient,
    query blocks against the keys they read) against JAX's own differentiation of the
    same attention over the whole T x T, in float64; rate None: no dropout, no seeds."""
    q, k, v, seeds = _attention_inputs(*shape)
    if rate is None:
        seeds, rate = None, 0.0
    weights = np.random.default_rng(9).standard_normal(q.shape)

    def loss(attend):
        return lambda q, k, v: jnp.sum(jnp.sin(attend(q, k, v, seeds, rate)) * weights)

    def values_and_gradients(q, k, v):  # one compiled program for both, not op by op
        return [
            (attend(q, k, v, seeds, rate), jax.grad(loss(attend), (0, 1, 2))(q, k, v))
            for attend in (model.attend_with_dropout, _attention_by_autodiff)
        ]

    (fused, got), (plain, want) = jax.jit(values_and_gradients)(q, k, v)
    # Divided by the row sums after the value product, not before: rounding apart.
    np.testing.assert_allclose(fused, plain, rtol=1e-13, atol=1e-14)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13)


@pytest.mark.float64
def test_causal_softmax_is_each_prefix_softmax():
    """Row i is the softmax of its scores over keys 0..i and exactly 0 after, also when
    the last key, future to every other row, scores highest in every row and the scores
    are far from 0 (the row maximum has to come off first)."""
    q, k, _, _ = _attention_inputs(b=2, h=3, t=9, d=5, seed=4)
    q = np.abs(q) * 20.0 + 3.0
    k[:, :, -1] = 50.0  # q . k_last > 250 > every other score of the row
    got = np.asarray(jax.jit(model.causal_softmax)(q, k))  # one program, not op by op
    scores = np.einsum("bhqd,bhkd->bhqk", q, k)
    assert np.all(scores.argmax(-1) == 8)
    for i in range(9):
        prefix = scores[..., i, : i + 1]
        e = np.exp(prefix - prefix.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
        # atol: XLA flushes subnormals (below 2.2e-308) to zero, NumPy keeps them.
        np.testing.assert_allclose(got[..., i, : i + 1], want, rtol=1e-12, atol=1e-300)
        assert np.all(got[..., i, i + 1 :] == 0)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_causal_softmax_in_low_precision_masks_large_future_scores(dtype):
    """Finite future scores near the type's largest value leave every row finite, summing
    to 1 over its past, with exact zeros after the diagonal."""
    q = jnp.ones((1, 1, 6, 1), dtype)
    k = jnp.array([0.0, 1.0, 2.0, 3.0, 4.0, 200.0], dtype).reshape(1, 1, 6, 1) * 300
    got = np.asarray(model.causal_softmax(q, k), np.float32)[0, 0]
    assert np.all(np.isfinite(got)) and np.all(np.triu(got, 1) == 0)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-2)
    assert got[4, 4] > 0.99 and got[5, 5] == 1.0


def _products_and_barriers(jaxpr):
    """Every dot_general and optimization_barrier equation of `jaxpr`, nested ones too."""
    for e in jaxpr.eqns:
        if e.primitive.name in ("dot_general", "optimization_barrier"):
            yield e
        for value in e.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                yield from _products_and_barriers(inner)


def _row_sum_products(tokens, head_dim):
    """(products summing a Q x K tensor over its rows, barriers) of the attention's
    backward pass; also checks that no product has the Q x K tensor on its left."""
    q, k, v, seeds = _attention_inputs(t=tokens, d=head_dim)
    grad = jax.grad(lambda *a: jnp.sum(model.attend_with_dropout(*a, seeds, 0.2)), (0, 1, 2))
    eqns = list(_products_and_barriers(jax.make_jaxpr(grad)(q, k, v).jaxpr))
    over_rows = []
    for e in eqns:
        if e.primitive.name != "dot_general":
            continue
        (contract_l, contract_r), _ = e.params["dimension_numbers"]
        wide = [x.aval.shape[-1] != head_dim for x in e.invars]  # Q x K, not T x Dh
        assert not (wide[0] and contract_l == (2,)), "wide operand on the left"
        if wide[1] and contract_r == (2,):
            over_rows.append(e.outvars[0])
    return over_rows, [e for e in eqns if e.primitive.name == "optimization_barrier"]


@pytest.mark.float64
@pytest.mark.parametrize("tokens, head_dim", [(7, 5), (48, 6)])
def test_gradient_products_keep_the_wide_operand_on_the_right(tokens, head_dim):
    """The value and key gradients sum a Q x K tensor over its rows. As the left operand of
    such a product it runs several times slower on CPU, so the backward pass puts it on the
    right and keeps XLA from swapping it back with a barrier on each product, in every
    query block."""
    assert head_dim > model.CONTRACT_BY_SUM_HEAD_DIM
    blocks = len(model.query_blocks(tokens, head_dim))
    over_rows, barriers = _row_sum_products(tokens, head_dim)
    assert len(over_rows) == 2 * blocks and len(barriers) == 2 * blocks
    assert {b.invars[0] for b in barriers} == set(over_rows)


@pytest.mark.float64
@pytest.mark.parametrize("tokens", [7, 40])
def test_narrow_heads_sum_their_gradients_without_products(tokens):
    """Heads of at most CONTRACT_BY_SUM_HEAD_DIM dims (16 heads of the paper's d = 64)
    sum the value and key gradients over the rows directly, with no product and no
    barrier."""
    over_rows, barriers = _row_sum_products(tokens, model.CONTRACT_BY_SUM_HEAD_DIM)
    assert over_rows == [] and barriers == []
    paper_16_heads = model.ModelConfig(num_heads=16, max_len=100)
    head_dim = paper_16_heads.embed_dim // paper_16_heads.num_heads
    assert _row_sum_products(tokens, head_dim) == ([], [])


@pytest.mark.float64
@pytest.mark.parametrize("head_dim", [3, 4, 6])
def test_contract_rows_is_the_plain_product_transposed_and_padded(head_dim):
    """A block of 4 query rows against its first 5 keys, padded to all 7 keys, by the sum
    (narrow heads) and by the product."""
    # Drawn in NumPy: drawn by JAX, each head dimension compiled sampling programs.
    rng = np.random.default_rng(head_dim)
    wide = jnp.asarray(rng.standard_normal((2, 3, 4, 5)))
    narrow = jnp.asarray(rng.standard_normal((2, 3, 4, head_dim)))
    got = np.asarray(model._contract_rows(wide, narrow, 7))
    assert got.shape == (2, 3, head_dim, 7)
    want = np.einsum("bhqk,bhqd->bhdk", np.asarray(wide), np.asarray(narrow))
    np.testing.assert_allclose(got[..., :5], want, rtol=1e-12, atol=1e-12)
    assert np.all(got[..., 5:] == 0)


@pytest.mark.parametrize(
    "tokens, head_dim, want",
    [
        (100, 64, ((0, 100),)),  # the paper's 1 head
        (100, 16, ((0, 50), (50, 100))),  # 4 heads
        (100, 8, ((0, 50), (50, 100))),  # 8 heads
        (100, 4, ((0, 50), (50, 100))),  # 16 heads
        (95, 16, ((0, 95),)),
        (96, 16, ((0, 48), (48, 96))),
        (100, 32, ((0, 100),)),  # 2 heads
        (11, 2, ((0, 11),)),
        (12, 2, ((0, 6), (6, 12))),
        (13, 2, ((0, 6), (6, 13))),
        (1, 1, ((0, 1),)),
    ],
)
def test_query_blocks_split_in_halves_from_six_tokens_per_head_dimension(tokens, head_dim, want):
    assert model.query_blocks(tokens, head_dim) == want


@pytest.mark.float64
def test_causal_softmax_of_later_queries_reads_keys_up_to_each_one():
    """Queries 3..5 of a sequence against its first 6 keys: the same rows as the whole
    sequence's attention, cut at key 6."""
    q, k, _, _ = _attention_inputs(b=2, h=3, t=9, d=5, seed=6)
    softmax = jax.jit(model.causal_softmax, static_argnums=2)  # a program, not op by op
    whole = np.asarray(softmax(q, k))
    got = np.asarray(softmax(q[..., 3:6, :], k[..., :6, :], 3))
    assert got.shape == (2, 3, 3, 6)
    np.testing.assert_allclose(got, whole[..., 3:6, :6], rtol=1e-13, atol=1e-15)
    assert np.all(whole[..., 3:6, 6:] == 0)


def test_training_attention_drops_probabilities_and_scales_the_values(monkeypatch):
    """Training-mode attention is the eval-mode probabilities with the elements of its
    seeds' mask dropped, times the values scaled by 1 / keep, through the output
    projection; the seeds come from the `dropout` stream, one per row."""
    cfg = model.ModelConfig(num_heads=2, dropout_rate=0.4, **SMALL)
    attn = model.CausalSelfAttention(cfg)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, cfg.embed_dim))
    params = attn.init(jax.random.PRNGKey(1), x, True)
    seen = []
    real = model.attend_with_dropout
    monkeypatch.setattr(model, "attend_with_dropout", lambda *a: seen.append(a[3]) or real(*a))
    got = attn.apply(params, x, False, rngs={"dropout": jax.random.PRNGKey(7)})
    other = attn.apply(params, x, False, rngs={"dropout": jax.random.PRNGKey(8)})
    seeds = seen[0]
    assert seeds.shape == (2, 2, 6) and not np.array_equal(seeds, seen[1])
    _, state = attn.apply(params, x, True, mutable=["intermediates"])
    probs = state["intermediates"]["attention"][0]
    kept = model.kept_elements(seeds, 6, 0.4)
    p = params["params"]
    split = lambda y: y.reshape(2, 6, 2, 8).transpose(0, 2, 1, 3)
    v = split(x @ p["value"]["kernel"] + p["value"]["bias"]) / model.keep_probability(0.4)
    heads = jnp.einsum("bhqk,bhkd->bhqd", jnp.where(kept, probs, 0), v)
    want = heads.transpose(0, 2, 1, 3).reshape(2, 6, 16) @ p["out"]["kernel"] + p["out"]["bias"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, other)


@pytest.mark.parametrize("rate", [model.ModelConfig().dropout_rate, 0.02])
def test_training_attention_drops_the_first_token_at_every_positive_rate(rate):
    """The first query reads only key 0, with probability 1, so with one head each
    sequence's first training output is its eval output's value term over keep (the
    projection's bias b plus (eval - b) / keep) or, dropped, b alone; about `rate` of
    256 sequences are dropped (the paper's 0.1 among them, not only larger rates)."""
    cfg = model.ModelConfig(**{**SMALL, "num_heads": 1, "dropout_rate": rate})
    attn = model.CausalSelfAttention(cfg)
    x = jax.random.normal(jax.random.PRNGKey(0), (256, 3, cfg.embed_dim))
    params = attn.init(jax.random.PRNGKey(1), x, True)
    bias = np.asarray(params["params"]["out"]["bias"])
    eval0 = np.asarray(attn.apply(params, x, True))[:, 0]
    train0 = np.asarray(attn.apply(params, x, False, rngs={"dropout": jax.random.PRNGKey(2)}))
    kept = bias + (eval0 - bias) / model.keep_probability(rate)
    is_kept = np.all(np.abs(train0[:, 0] - kept) < 1e-5, axis=-1)
    is_dropped = np.all(np.abs(train0[:, 0] - bias) < 1e-5, axis=-1)
    assert np.all(is_kept ^ is_dropped)
    dropped = is_dropped.sum()
    assert dropped >= 1 and abs(dropped / 256 - rate) < 4 * np.sqrt(rate * (1 - rate) / 256)


@pytest.mark.float64
def test_training_attention_without_dropout_is_eval_attention_with_its_written_out_gradient(
    monkeypatch, one_layer_params
):
    """With dropout 0, training mode gives eval mode's outputs and gradients, computed by
    `attend_with_dropout` without seeds (its written-out backward, not autodiff of the
    softmax), and needs no `dropout` stream."""
    # One layer: the attention of every layer is the same code.
    cfg = model.ModelConfig(num_heads=4, dropout_rate=0.0, **{**SMALL, "num_layers": 1})
    module = model.Transformer(cfg)
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 12), 0, cfg.vocab_size)
    # Converted in NumPy, not by a program per parameter shape.
    params = {"params": jax.tree.map(lambda p: jnp.asarray(p, jnp.float64), one_layer_params[1])}
    seen = []
    real = model.attend_with_dropout
    monkeypatch.setattr(model, "attend_with_dropout", lambda *a: seen.append(a[3:]) or real(*a))

    def loss(p, deterministic):
        return jnp.sum(jnp.sin(module.apply(p, tokens, deterministic)))

    # One compiled program per mode (the attention is seen while it is traced).
    value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    train_value, train_grads = value_and_grad(params, False)
    assert seen and all(s == (None, 0.0) for s in seen)
    seen.clear()
    eval_value, eval_grads = value_and_grad(params, True)
    assert not seen
    np.testing.assert_allclose(train_value, eval_value, rtol=1e-12)
    for got, want in zip(jax.tree.leaves(train_grads), jax.tree.leaves(eval_grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.float64
def test_attention_gradients_keep_each_inputs_dtype():
    """Queries wider than keys and values (a float64 scale under x64) get float64
    gradients, keys and values float32 ones, as JAX's own differentiation gives."""
    q, k, v, seeds = _attention_inputs()
    k, v = k.astype(jnp.float32), v.astype(jnp.float32)
    grads = jax.grad(lambda *a: jnp.sum(model.attend_with_dropout(*a, seeds, 0.2)), (0, 1, 2))
    # Jitted: one program, not the backward pass op by op.
    assert [g.dtype for g in jax.jit(grads)(q, k, v)] == [jnp.float64, jnp.float32, jnp.float32]


def _seed_hashing_to(value: int) -> int:
    """The row seed whose column-0 hash is `value` (MurmurHash3's finaliser inverted)."""
    mask = 2**32 - 1
    x = value ^ (value >> 16)
    x = (x * pow(0xC2B2AE35, -1, 2**32)) & mask
    x ^= (x >> 13) ^ (x >> 26)
    x = (x * pow(0x85EBCA6B, -1, 2**32)) & mask
    return x ^ (x >> 16)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_an_element_is_kept_exactly_when_its_hash_reaches_the_threshold(rate):
    """`keep_probability` counts the 32-bit values at or above the threshold, so the
    element whose hash is the threshold is kept and the one just below is dropped."""
    threshold = 2**32 - round(model.keep_probability(rate) * 2**32)
    seeds = jnp.asarray([_seed_hashing_to(threshold), _seed_hashing_to(threshold - 1)], jnp.uint32)
    assert model._mix32(seeds).tolist() == [threshold, threshold - 1]
    assert model.kept_elements(seeds, 1, rate)[:, 0].tolist() == [True, False]


def test_rate_zero_keeps_every_element():
    """Even the element whose hash is 0 (seed 0, column 0)."""
    seeds = jnp.asarray([0, 1, 2**31], jnp.uint32)
    assert bool(model.kept_elements(seeds, 5, 0.0).all())


def zero_params(init):
    """Zeros in the shapes and dtypes of `init(key)`'s parameters, made in NumPy from its
    traced shapes: run op by op, the init compiled its forward pass's operations."""
    shapes = jax.eval_shape(init, jax.random.PRNGKey(0))["params"]
    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)


@pytest.mark.parametrize("num_heads", [2, 4])
def test_attention_scores_are_scaled_by_the_root_of_the_head_dimension(num_heads):
    """Scaled dot-product attention divides each head's scores by sqrt(head_dim), not by
    sqrt(embed_dim). With identity query and key projections, token 0 at the origin and
    token 1 at 2 on the first feature, the second query scores 0 against key 0 and 4
    against key 1 in the head holding that feature, so it puts sigmoid(4 / sqrt(Dh)) on
    itself there and 1/2 on each key in every other head; the first query has only
    itself to read."""
    cfg = model.ModelConfig(num_heads=num_heads, dropout_rate=0.0, **SMALL)
    d, head_dim = cfg.embed_dim, cfg.head_dim
    attn = model.CausalSelfAttention(cfg)
    x = np.zeros((1, 2, d), np.float32)
    x[0, 1, 0] = 2.0
    params = zero_params(lambda key: attn.init(key, x, True))
    for name in ("query", "key"):
        params[name]["kernel"] = np.eye(d, dtype=np.float32)
    _, state = attn.apply({"params": params}, x, True, mutable=["intermediates"])
    probs = np.asarray(state["intermediates"]["attention"][0])
    assert probs.shape == (1, num_heads, 2, 2)
    on_itself = 1 / (1 + np.exp(-4 / np.sqrt(head_dim)))
    want = np.full((num_heads, 2), 0.5)
    want[0] = (1 - on_itself, on_itself)
    np.testing.assert_allclose(probs[0, :, 1], want, rtol=1e-6)
    np.testing.assert_allclose(probs[0, :, 0], np.tile([1.0, 0.0], (num_heads, 1)))


def test_head_mask_scales_each_heads_output_in_training_mode():
    """In training mode too, a head's mask entry multiplies its output before the output
    projection: the same dropout key gives the unmasked model with that head's rows of
    the output kernel scaled, and an all-zero mask leaves only the output bias."""
    cfg = model.ModelConfig(num_heads=2, dropout_rate=0.4, **SMALL)
    attn = model.CausalSelfAttention(cfg)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, cfg.embed_dim))
    params = attn.init(jax.random.PRNGKey(1), x, True)["params"]
    rngs = {"dropout": jax.random.PRNGKey(7)}
    apply = jax.jit(lambda p, m: attn.apply({"params": p}, x, False, m, rngs=rngs))

    def train(p, head_mask=None):
        return np.asarray(apply(p, jnp.ones(2) if head_mask is None else head_mask))

    masked = train(params, jnp.asarray([1.0, 0.25]))
    out = dict(params["out"], kernel=params["out"]["kernel"].at[8:].multiply(0.25))
    np.testing.assert_allclose(masked, train({**params, "out": out}), rtol=1e-5, atol=1e-6)
    assert np.abs(masked - train(params)).max() > 1e-3
    removed = train(params, jnp.zeros(2))
    np.testing.assert_allclose(removed, np.broadcast_to(params["out"]["bias"], removed.shape))
    # One mask per sequence: each sequence as if alone under its own mask.
    per_sequence = train(params, jnp.asarray([[1.0, 0.0], [0.0, 1.0]]))
    for b, head in enumerate((1, 0)):
        rows = slice(8 * head, 8 * head + 8)
        out = dict(params["out"], kernel=params["out"]["kernel"].at[rows].set(0.0))
        want = train({**params, "out": out})[b]
        np.testing.assert_allclose(per_sequence[b], want, rtol=1e-5, atol=1e-6)


def test_check_head_mask_takes_layer_by_head_masks_with_or_without_a_batch_axis():
    """(L, H) and (B, L, H) masks pass with their values; the last two axes must be
    (L, H), whatever the first is."""
    cfg = model.ModelConfig(num_heads=4, **SMALL)  # L = 2, H = 4
    for shape in [(2, 4), (3, 2, 4), (4, 2, 4), (1, 2, 4)]:
        mask = np.random.default_rng(0).uniform(size=shape)
        got = model.check_head_mask(mask, cfg)
        assert got.shape == shape
        np.testing.assert_allclose(got, mask)
    for shape in [(4, 2), (2, 4, 3), (2, 4, 4), (2, 3, 4), (2, 4, 2, 4), (8,)]:
        with pytest.raises(ValueError, match="head_mask must have shape"):
            model.check_head_mask(np.ones(shape), cfg)


@pytest.mark.float64
def test_training_attention_handles_scores_whose_exponential_overflows():
    """Scores over 900 (exp overflows float64 past 709) still give the softmax's outputs
    and gradients: the row maximum comes off before the exponential."""
    q, k, v, seeds = _attention_inputs(b=2, h=2, t=7, d=3, seed=3)
    q = np.abs(q) * 20.0 + 30.0
    k = np.abs(k) * 10.0 + 10.0
    assert float(np.einsum("bhqd,bhkd->bhqk", q, k).min()) > 900
    weights = np.random.default_rng(9).standard_normal(q.shape)

    def loss(attend):
        return lambda q, k, v: jnp.sum(attend(q, k, v, seeds, 0.3) * weights)

    both = lambda *a: [
        jax.value_and_grad(loss(attend), (0, 1, 2))(*a)
        for attend in (model.attend_with_dropout, _attention_by_autodiff)
    ]
    (value, got), (want_value, want) = jax.jit(both)(q, k, v)  # one program for the two
    assert np.isfinite(value)
    np.testing.assert_allclose(value, want_value, rtol=1e-12)
    for g, w in zip(got, want, strict=True):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)


def test_mlp_is_relu_between_its_two_projections():
    """With identity projections and no biases the MLP returns max(x, 0): negative
    features are cut to 0, positive ones pass unchanged (ReLU, not a smooth variant)."""
    cfg = model.ModelConfig(num_heads=2, dropout_rate=0.0, **SMALL)
    mlp = model.Mlp(cfg)
    x = np.linspace(-2.0, 2.0, 2 * 3 * cfg.embed_dim, dtype=np.float32).reshape(2, 3, -1)
    params = zero_params(lambda key: mlp.init(key, x, True))
    params["hidden"]["kernel"] = np.eye(cfg.embed_dim, cfg.mlp_dim, dtype=np.float32)
    params["output"]["kernel"] = np.eye(cfg.mlp_dim, cfg.embed_dim, dtype=np.float32)
    got = np.asarray(mlp.apply({"params": params}, x, True))
    np.testing.assert_allclose(got, np.maximum(np.asarray(x), 0.0), rtol=1e-6, atol=1e-7)


def test_rate_zero_dropout_is_the_identity_and_needs_no_key():
    """Dropout at rate 0 returns its input in training mode without asking for a
    `dropout` key, and so does a rate-0 MLP: training mode is eval mode there."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 5))
    np.testing.assert_array_equal(model.Dropout(0.0).apply({}, x, deterministic=False), x)
    mlp = model.Mlp(model.ModelConfig(num_heads=2, dropout_rate=0.0, **SMALL))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, SMALL["embed_dim"]))
    params = mlp.init(jax.random.PRNGKey(2), x, True)
    np.testing.assert_array_equal(mlp.apply(params, x, False), mlp.apply(params, x, True))


def test_block_normalises_both_sublayer_inputs_with_the_configs_epsilon():
    """x + attention(norm(x)), then h + mlp(norm(h)), each norm with `norm_eps` and its own
    scale; an epsilon of 0.5 on inputs of rms about 0.3 shows any other epsilon."""
    cfg = model.ModelConfig(num_heads=2, dropout_rate=0.0, norm_eps=0.5, **SMALL)
    x = 0.3 * jax.random.normal(jax.random.PRNGKey(0), (2, 6, cfg.embed_dim))
    block = model.Block(cfg)
    params = block.init(jax.random.PRNGKey(1), x, True)["params"]
    for i, name in enumerate(("ln1", "ln2")):
        params[name]["scale"] = jnp.linspace(0.5, 1.5 + i, cfg.embed_dim, dtype=jnp.float32)
    got = block.apply({"params": params}, x, True)
    attn = model.CausalSelfAttention(cfg).apply(
        {"params": params["attn"]}, rms_norm(x, params["ln1"]["scale"], 0.5), True
    )
    h = x + attn
    mlp = model.Mlp(cfg).apply(
        {"params": params["mlp"]}, rms_norm(h, params["ln2"]["scale"], 0.5), True
    )
    np.testing.assert_allclose(got, h + mlp, rtol=1e-6, atol=1e-7)


# x64 on: the cosine offsets below, and so the parameters, are float64; in float32 the
# comparison below fails its tolerances.
@pytest.mark.float64
def test_model_is_its_flax_layers_with_separate_projections(monkeypatch, one_layer_params):
    """The joined query/key/value product and the written-out norm change nothing a user
    sees: the model with Flax's RMSNorm and one product per projection (as `nn.Dense`
    computes it) gives the same logits, in evaluation and with dropout, and the same
    gradients to float32 rounding."""
    # One layer: every layer is the same code, and each layer more doubles the compiling.
    small = {**SMALL, "num_layers": 1}
    cfg = model.ModelConfig(num_heads=4, dropout_rate=0.2, norm_eps=1e-3, **small)
    module = model.Transformer(cfg)
    # In NumPy: op by op in JAX each parameter shape compiled its own few programs.
    offset = lambda a: a + 0.1 * np.cos(np.arange(a.size)).reshape(a.shape)
    params = jax.tree.map(lambda a: jnp.asarray(offset(a)), one_layer_params[0])
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 12), 0, 11)
    rngs = {"dropout": jax.random.PRNGKey(2)}

    def outputs():
        apply = lambda p, train: module.apply({"params": p}, tokens, not train, rngs=rngs)
        loss = lambda p: jnp.sum(jnp.sin(apply(p, True)))
        run = jax.jit(lambda p: (apply(p, False), apply(p, True), jax.grad(loss)(p)))
        return run(params)

    ours = outputs()
    separate = lambda x, weights: [linear.dense_product(x, k) + b for k, b in weights]
    monkeypatch.setattr(model, "dense_together", separate)
    monkeypatch.setattr(model, "RMSNorm", lambda eps, name: nn.RMSNorm(epsilon=eps, name=name))
    flax_layers = outputs()
    for got, want in zip(ours[:2], flax_layers[:2], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    for got, want in zip(jax.tree.leaves(ours[2]), jax.tree.leaves(flax_layers[2]), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(ours[0] - ours[1]).max()) > 1e-2  # dropout is on
