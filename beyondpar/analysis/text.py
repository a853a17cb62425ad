"""The analysis of one text through a pretrained model, or of attention computed elsewhere.

Layers are taken one at a time: a layer's metrics are computed before the next layer's
attention exists, and only one mixed T x T operator per layer is kept (for the rollout).
For the whole network: attention rollout and the sink's share of every token.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from beyondpar import graphs, metrics, pretrained
from beyondpar.analysis import coalition_summary, views
from beyondpar.base import files
from beyondpar.base.timing import Timer
from beyondpar.measure import MeasureSpec, baselines, measure_layer


def _selected(spec: MeasureSpec, num_layers: int) -> tuple[int, ...]:
    layers = tuple(range(num_layers)) if spec.layers is None else spec.layers
    bad = [layer for layer in layers if not 0 <= layer < num_layers]
    if bad:
        raise ValueError(f"layers must be in [0, {num_layers}), got {bad}")
    return layers


def analyze_tokens(
    module,
    params,
    tokens_BxT,
    spec: MeasureSpec,
    timer: Timer | None = None,
    extra=None,
    extra_without_sink=None,
    with_baselines: bool = True,
):
    """Record of a pretrained model on token ids: per analysed layer, then the rollout,
    and (`with_baselines`) uniform causal attention of the same length beside them.

    One layer's attention is alive at a time; for the rollout only each layer's mix of
    heads (B x T x T) is kept (see `SinkRollout`).
    `extra` {name: weights (L, H), or per sequence (B, L, H)} adds fixed mixes per layer;
    `extra_without_sink` the same for the graph without the sink tokens.
    """
    timer = timer or Timer()
    cfg = module.config
    layers = _selected(spec, cfg.num_layers)
    spec.check_length(np.shape(tokens_BxT)[-1])
    # On the host: the parameters may live on a mesh, each layer's attention on part of it.
    importances = np.asarray(pretrained.head_importances(module, params))
    out, rollout = {}, SinkRollout(cfg.num_layers, spec.residual)
    run = pretrained.layer_by_layer(module, params, tokens_BxT)
    for layer in range(cfg.num_layers):
        with timer.part("forward"):
            _, attn = next(run)
            attn.block_until_ready()
        weights = importances[layer]
        with timer.part("rollout"):
            rollout.add(graphs.combine_heads(attn, weights))
        if layer in layers:
            fixed, fixed_inner = _at_layer(extra, layer), _at_layer(extra_without_sink, layer)
            out[layer] = measure_layer(attn, weights, spec, timer, fixed, fixed_inner)
    with timer.part("rollout"):
        summary = rollout.record()
    out = {"layers": out, "rollout": summary}
    return {**out, **baselines(np.shape(tokens_BxT)[-1], spec)} if with_baselines else out


def _at_layer(extra: dict | None, layer: int) -> dict:
    """{name: weights of `layer`} from {name: (..., L, H)}."""
    return {name: jnp.asarray(w)[..., layer, :] for name, w in (extra or {}).items()}


# Up to this many bytes for every layer's mix together, the mixes are kept and the sink's
# row is taken at the end, as L vector-matrix products (O(L T^2)); beyond it, the running
# product R_l = A~_l R_{l-1} is carried instead (O(L T^3), one layer of memory). SmolLM2 at
# 8 windows of 512 tokens keeps 252 MB and saves the 30 T x T x T products of each batch.
ROLLOUT_KEEP_BYTES = 2**30


class SinkRollout:
    """The sink's row of the rollout of the layers `add`ed in order (heads already mixed,
    B x T x T each), with `residual` * I added to every layer. The math is `graphs`'s; this
    class only chooses what to keep in memory (see `ROLLOUT_KEEP_BYTES`)."""

    def __init__(self, num_layers: int, residual: float, keep_bytes: int | None = None):
        self.num_layers, self.residual = num_layers, residual
        self.keep_bytes = ROLLOUT_KEEP_BYTES if keep_bytes is None else keep_bytes
        self.kept, self.product, self.keep = [], None, None

    def add(self, mixed_BxTxT) -> None:
        if self.keep is None:
            self.keep = mixed_BxTxT.nbytes * self.num_layers <= self.keep_bytes
        if self.keep:
            self.kept.append(mixed_BxTxT)
            return
        op = graphs.layer_operator(jnp.asarray(mixed_BxTxT), self.residual)
        self.product = op if self.product is None else graphs.rollout_step(self.product, op)
        self.product.block_until_ready()

    def sink_share(self) -> np.ndarray:
        """(B, T): token j's share in what the last position holds after every layer."""
        if self.product is not None:
            return np.asarray(self.product[..., -1, :])
        return np.asarray(graphs.rollout_sink_of_mixed(self.kept, self.residual))

    def record(self) -> dict:
        """The sink's share of every token, and the smallest: the network's fidelity."""
        shares = self.sink_share()
        return {"sink_share": shares, "network_fidelity": shares.min(-1)}


def analyze_attention(attn, spec: MeasureSpec, timer: Timer | None = None) -> dict:
    """Record of attention from anywhere: L x H x T x T or B x L x H x T x T (uniform
    weights, since no output projection is known)."""
    attn = np.asarray(attn)
    if attn.ndim == 4:
        attn = attn[None]
    if attn.ndim != 5:
        raise ValueError(
            f"attention must have shape (L, H, T, T) or (B, L, H, T, T), got shape {attn.shape}"
        )
    attn = np.asarray(metrics.check_operator(attn.astype(np.float32), "attention"))
    timer = timer or Timer()
    layers = _selected(spec, attn.shape[1])
    spec.check_length(attn.shape[-1])
    out = {layer: measure_layer(attn[:, layer], None, spec, timer) for layer in layers}
    with timer.part("rollout"):
        rollout = SinkRollout(attn.shape[1], spec.residual)
        for layer in range(attn.shape[1]):
            rollout.add(jnp.asarray(attn[:, layer].mean(1), jnp.float32))
        summary = rollout.record()
    return {"layers": out, "rollout": summary, **baselines(attn.shape[-1], spec)}


def tokenize(tokenizer, text: str, module) -> list[int]:
    """Token ids of `text`; an empty text or one longer than the context is an error."""
    if not text or not text.strip():
        raise ValueError("text must not be empty, got an empty text")
    ids = tokenizer.encode(text).ids
    if not ids:
        raise ValueError(f"text must give at least one token, got none for {text[:40]!r}")
    if len(ids) > module.config.max_len:
        raise ValueError(
            f"text must fit the model's context of {module.config.max_len} tokens, got "
            f"{len(ids)} tokens (texts are never cut silently: shorten it)"
        )
    return ids


def largest_shares(sink_share_BxT, labels, count: int = 10) -> list[dict]:
    """The tokens with the largest mean share at the last position, largest first: at
    T = 1,024 the full list is unreadable, and a sink token holds nearly all of it."""
    share = np.mean(np.asarray(sink_share_BxT), axis=0)
    top = np.argsort(-share)[:count]
    return [{"position": int(i), "token": labels[i], "share": float(share[i])} for i in top]


def text_record(path_or_name, text: str, spec: MeasureSpec, dtype=None, mesh=None) -> dict:
    """Load a checkpoint (onto `mesh`, default one device), tokenise `text`, analyse it:
    the record `analysis_report` writes."""
    timer = Timer()
    with timer.part("load"):
        module, params, tokenizer = pretrained.load(path_or_name, dtype, mesh)
    ids = tokenize(tokenizer, text, module)
    record = analyze_tokens(module, params, np.asarray([ids]), spec, timer)
    labels = [tokenizer.decode([i]) for i in ids]
    record["rollout"]["largest_shares"] = largest_shares(record["rollout"]["sink_share"], labels)
    with timer.part("views"):
        shown = views.token_views(
            module, params, np.asarray([ids]), [labels], spec.horizon, layers=spec.layers
        )
    shown[0]["name"] = "text"
    if spec.coalitions:
        with timer.part("coalitions: loss"):
            record["coalitions"] = coalition_summary.of_tokens(
                module, params, np.asarray([ids]), record["layers"], spec, 0
            )
    return {
        "source": str(path_or_name),
        "model_type": type(module.config).__name__,
        "num_layers": module.config.num_layers,
        "num_heads": module.config.num_heads,
        "num_sequences": 1,
        "seq_len": len(ids),
        "tokens": ids,
        "token_labels": labels,
        "spec": dataclasses.asdict(spec),
        **record,
        views.KEY: shown,
        "timings_s": timer.seconds,
    }


def attention_record(path, spec: MeasureSpec) -> dict:
    """Analyse attention saved by any framework: an .npz with key `attention`."""
    try:
        data = files.read_npz(path)
        if "attention" not in data:
            raise ValueError(f"must hold the key 'attention', got keys {sorted(data)}")
        attn = data["attention"]
    except (OSError, ValueError) as err:
        raise ValueError(f"attention file {path}: {err}") from err
    timer = Timer()
    try:
        record = analyze_attention(attn, spec, timer)
    except ValueError as err:
        raise ValueError(f"attention file {path}: {err}") from err
    batch = attn[None] if attn.ndim == 4 else attn
    if spec.coalitions:  # no model: the fidelity game only
        games = coalition_summary.batch_games(record["layers"])
        record["coalitions"] = coalition_summary.summarize(games, {}, 0)
    return {
        "source": str(path),
        "num_layers": batch.shape[1],
        "num_heads": batch.shape[2],
        "num_sequences": batch.shape[0],
        "seq_len": batch.shape[-1],
        "spec": dataclasses.asdict(spec),
        **record,
        "timings_s": timer.seconds,
    }
