"""The optimal head mix of a corpus, scored out of sample.

The windows are split into contiguous folds (`weighting.folds`); each fold's weights are
searched, layer by layer, on windows outside it (`weighting.search_sets`: the same number
for every fold, so that all folds search in one batched call), and every window is then
measured with the weights of the search that did not see it. The searches' own values on
their windows (in sample) are kept beside them. With `sink_tokens` > 0 the graph without
the sink tokens gets its own search. Everything found is kept in `optimal_weights.json`,
so a resumed run measures its remaining windows with the same weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tqdm

from beyondpar import graphs, pretrained, weighting
from beyondpar.base import files, settings

OPTIMAL_FILE = "optimal_weights.json"


def plan(num_windows: int, num_folds: int, search_windows: int, layers: list[int]) -> dict:
    """The folds ([start, end) in window order), each fold's search windows, the layers."""
    blocks = weighting.folds(num_windows, num_folds)
    picked = weighting.search_sets(num_windows, num_folds, search_windows)
    return {
        "folds": [[b.start, b.stop] for b in blocks],
        "search_windows": [s.tolist() for s in picked],
        "held_out": len(blocks) > 1,
        "layers": list(layers),
    }


def corpus_optimum(module, params, windows, spec, cspec, out_dir, progress=True) -> dict:
    """The plan, per fold and analysed layer the weights (F, L', H) and their in-sample
    values (F, L') for the full graph and, with sink tokens, for the graph without them;
    read from `out_dir` when a previous run found them for the same plan."""
    layers = list(range(module.config.num_layers)) if spec.layers is None else list(spec.layers)
    wanted = plan(len(windows.tokens), spec.folds, cspec.search_windows, layers)
    path = Path(out_dir) / OPTIMAL_FILE
    found = settings.guard(
        path,
        wanted,
        f"{path} holds weights searched for other folds",
        "--max_windows changed which windows each fold holds; use another --out",
        free=lambda field: field not in wanted,  # what was found beside the plan
        write=False,  # the file is written once the weights are found
    )
    if found is None:
        found = {**wanted, **_search(module, params, windows, spec, wanted, progress)}
        files.write_json(path, found)
    return found


def _search(module, params, windows, spec, wanted: dict, progress: bool) -> dict:
    searched = sorted({i for s in wanted["search_windows"] for i in s})
    position = {window: i for i, window in enumerate(searched)}
    by_fold = np.asarray([[position[i] for i in s] for s in wanted["search_windows"]])
    learned = np.asarray(pretrained.head_importances(module, params))
    graphs_of = {"": lambda a: a}
    if spec.sink_tokens:
        graphs_of["_without_sink"] = lambda a: graphs.drop_sink_tokens(a, spec.sink_tokens)
    out = {f"{kind}{suffix}": [] for kind in ("weights", "in_sample") for suffix in graphs_of}
    run = pretrained.layer_by_layer(
        module, params, pretrained.place_tokens(params, windows.tokens[searched])
    )
    desc = f"optimal weights ({len(by_fold)} folds x {by_fold.shape[1]} windows)"
    bar = tqdm.tqdm(total=len(wanted["layers"]), desc=desc, unit="layer", disable=not progress)
    for layer, attn in run:
        if layer not in wanted["layers"]:
            continue
        for suffix, graph in graphs_of.items():
            per_fold = graph(attn)[by_fold]  # F x S x H x T x T
            w, value = weighting.optimal_weights(
                per_fold, "fidelity", horizon=spec.horizon, init=learned[layer]
            )
            out[f"weights{suffix}"].append(np.asarray(w))
            out[f"in_sample{suffix}"].append(np.asarray(value))
        bar.update(1)
    bar.close()
    # Stored fold-major: (F, L, H) weights, (F, L) values.
    return {name: np.swapaxes(np.stack(v), 0, 1).tolist() for name, v in out.items()}


def per_window(found: dict, name: str, num_windows: int, num_layers: int) -> np.ndarray:
    """(W, L, H): each window's weights `name`, from the fold that holds it (layers that
    were not searched get uniform weights, never read)."""
    searched = np.asarray(found[name], np.float32)  # F x L' x H
    fold = np.concatenate([np.full(b - a, f) for f, (a, b) in enumerate(found["folds"])])
    if len(fold) != num_windows:
        raise ValueError(f"the folds must cover {num_windows} windows, got {len(fold)}")
    h = searched.shape[-1]
    weights = np.full((len(found["folds"]), num_layers, h), 1.0 / h, np.float32)
    weights[:, found["layers"]] = searched
    return weights[fold]


def summary(found: dict) -> dict:
    """What a report needs: the plan, and per layer (keyed like the summary's layers) the
    in-sample value (mean over folds), each fold's, and the weights."""
    out = {k: found[k] for k in ("folds", "search_windows", "held_out")}
    keys = [str(layer) for layer in found["layers"]]
    for suffix in ("", "_without_sink"):
        if f"in_sample{suffix}" in found:
            values = np.asarray(found[f"in_sample{suffix}"])  # F x L'
            out[f"in_sample{suffix}"] = dict(zip(keys, values.mean(0).tolist(), strict=True))
            out[f"in_sample_by_fold{suffix}"] = dict(zip(keys, values.T.tolist(), strict=True))
            weights = np.swapaxes(np.asarray(found[f"weights{suffix}"]), 0, 1).tolist()
            out[f"weights{suffix}"] = dict(zip(keys, weights, strict=True))
    return out
