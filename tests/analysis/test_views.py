"""The page's views of a pretrained model: each sequence's view of each layer holds the
flows of that layer's learned mix, the uniform mix and that sequence's own extra mix,
measured on that sequence's attention; a corpus shows its first windows, each with the
optimum of its own fold."""

import numpy as np

from beyondpar import measure, pretrained
from beyondpar.analysis import views, windowing
from beyondpar.measure import flow
from beyondpar.reports import packing
from helpers.paths import DATA

HORIZON = 12


def test_each_view_holds_its_own_sequences_and_layers_mixes():
    module, params, _ = pretrained.load(DATA / "hf" / "llama-tiny")
    cfg = module.config
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 10))
    rng = np.random.default_rng(1)
    extra = rng.uniform(0.1, 1.0, (2, cfg.num_layers, cfg.num_heads)).astype(np.float32)
    labels = [[str(int(t)) for t in row] for row in tokens]
    got = views.token_views(module, params, tokens, labels, HORIZON, {"x": extra})
    learned = np.asarray(pretrained.head_importances(module, params))
    assert len({tuple(w) for w in learned}) == cfg.num_layers  # layers' mixes differ
    uniform = np.full(cfg.num_heads, 1.0 / cfg.num_heads)
    for layer, attn in pretrained.layer_by_layer(module, params, tokens):
        for b in range(len(tokens)):
            mixes = {"learned": learned[layer], "uniform": uniform, "x": extra[b, layer]}
            heads, mixed = flow.layer_flows(np.asarray(attn)[b], mixes, HORIZON)
            shown = got[b]["layers"][str(layer)]
            assert shown["heads"] == packing.flow(heads, 1)
            for name, phi in mixed.items():
                assert shown["mixes"][name] == packing.flow(phi, 1), (b, layer, name)


def corpus_windows(count: int, tokens: int, vocab_size: int):
    """`count` random windows of `tokens` ids, from documents 0, 0, 1, 1, 2, 3, ..."""
    ids = np.random.default_rng(2).integers(1, vocab_size, (count, tokens), dtype=np.int32)
    document = np.asarray([(5 * i) // 8 for i in range(count)])
    return windowing.Windows(
        tokens=ids,
        document=document,
        num_documents=int(document[-1]) + 1,
        documents_used=int(document[-1]) + 1,
        dropped_tail_tokens=0,
        short_documents=0,
        total_windows=count,
        sources=[f"doc{d}.txt" for d in range(int(document[-1]) + 1)],
    )


def test_corpus_views_show_the_first_windows_with_their_own_folds_optimum():
    """More windows than fit (`views.count`, at most `MAX_VIEWS`): the views are the
    first ones, in order, each named by its window and document, labelled with its own
    tokens' texts, and drawing the optimum of the fold that holds it (one window per fold,
    so every window's optimal mix differs) on its own attention."""
    module, params, tokenizer = pretrained.load(DATA / "hf" / "llama-tiny")
    cfg = module.config
    windows = corpus_windows(views.MAX_VIEWS + 2, 10, cfg.vocab_size)
    num = len(windows.tokens)
    rng = np.random.default_rng(3)
    found = {
        "folds": [[i, i + 1] for i in range(num)],
        "layers": list(range(cfg.num_layers)),
        "weights": rng.dirichlet(np.full(cfg.num_heads, 0.3), (num, cfg.num_layers)).tolist(),
    }
    spec = measure.MeasureSpec(horizon=HORIZON)
    got = views.corpus_views(module, params, tokenizer, windows, spec, found)
    shown = views.count(num, cfg.num_layers, cfg.num_heads, 10)
    assert len(got) == shown == views.MAX_VIEWS < num
    documents = [int(windows.document[i]) for i in range(shown)]
    assert documents == [0, 0, 1, 1]  # the last windows are from documents 2 and 3
    assert [v["name"] for v in got] == [
        f"window {i} (document {d})" for i, d in enumerate(documents)
    ]
    weights = np.asarray(found["weights"], np.float32)  # window i: fold i's weights
    # The windows' attention in a batch of their own: flows within float32 batching noise.
    run = pretrained.layer_by_layer(module, params, windows.tokens)
    attn = np.stack([np.asarray(a) for _, a in run])  # L x W x H x T x T
    for i, view in enumerate(got):
        assert view["labels"] == [tokenizer.decode([int(t)]) for t in windows.tokens[i]], i
        assert sorted(view["layers"]) == [str(layer) for layer in range(cfg.num_layers)]
        for layer in range(cfg.num_layers):
            mixes = {"optimal": weights[i, layer], "other": weights[num - 1 - i, layer]}
            heads, mixed = flow.layer_flows(attn[layer, i], mixes, HORIZON)
            packed = view["layers"][str(layer)]
            assert_flow(packed["heads"], heads)
            assert_flow(packed["mixes"]["optimal"], mixed["optimal"])
            # Another window's optimum draws another flow.
            other = np.asarray(mixed["other"]).min()
            assert abs(packed["mixes"]["optimal"]["worst_value"] - other) > 1e-3 * other


def assert_flow(packed: dict, phi) -> None:
    """A packed flow is `phi`'s: 3 significant digits, the worst value to float32 noise."""
    phi = np.asarray(phi, np.float64)
    np.testing.assert_allclose(packed["values"], phi, rtol=5e-3, atol=1e-9)
    np.testing.assert_allclose(packed["worst_value"], phi.min(-1), rtol=1e-4)
