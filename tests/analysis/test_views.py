"""The page's views of a pretrained model: each sequence's view of each layer holds the
flows of that layer's learned mix, the uniform mix and that sequence's own extra mix,
measured on that sequence's attention."""

import numpy as np

from beyondpar import pretrained
from beyondpar.analysis import views
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
