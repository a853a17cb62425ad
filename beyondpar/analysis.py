"""The analysis of one text through a pretrained model, or of attention computed elsewhere.

Per analysed layer: every head's minimax fidelity, hitting time (both walks), TV and
spectral mixing (normalised walk: the reference walk saturates on causal attention), the
mixes with output-projection and uniform weights, best head, amplification gain, head
diversity, cross-head share, pairwise synergy and, when asked, optimal weights. For the
whole network: attention rollout and the sink's share of every token.

Layers are taken one at a time: a layer's metrics are computed before the next layer's
attention exists, and only one mixed T x T operator per layer is kept (for the rollout).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar import files, graphs, metrics, pretrained, synergy


@dataclasses.dataclass(frozen=True)
class AnalysisSpec:
    """What is measured. `layers` None: every layer. `pairwise` and `optimal_weights`
    switch off the costly parts (H^2 / 2 extra operators; a gradient search)."""

    horizon: int = 100
    max_steps: int = 100
    eps: float = 0.25
    residual: float = 0.5
    layers: tuple[int, ...] | None = None
    pairwise: bool = True
    optimal_weights: bool = False
    sink_tokens: int = 0

    def __post_init__(self):
        if isinstance(self.sink_tokens, bool) or not isinstance(self.sink_tokens, int):
            raise ValueError(f"sink_tokens must be an integer >= 0, got {self.sink_tokens!r}")
        if self.sink_tokens < 0:
            raise ValueError(f"sink_tokens must be an integer >= 0, got {self.sink_tokens}")

    def check_length(self, num_tokens: int) -> None:
        """The window must keep at least two tokens once the sink tokens are dropped."""
        if self.sink_tokens and self.sink_tokens >= num_tokens - 1:
            raise ValueError(
                f"--sink_tokens must be less than the window minus 1 ({num_tokens - 1}), "
                f"got {self.sink_tokens}"
            )


class Timer:
    """Wall time per named part, summed over calls."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def part(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed


def operator_fields(ops_xTxT, spec: AnalysisSpec, validate: bool = True) -> dict:
    """Every per-operator number: minimax fidelity (the paper's minimum over tokens) with
    the median and 10th percentile of node fidelity beside it (a typical token, when one
    unread token sets the minimum to 0), hitting times on both walks, TV and spectral
    mixing on the normalised walk. `validate` False: operators already checked."""
    ops = metrics.check_operator(ops_xTxT, "ops") if validate else ops_xTxT
    norm = metrics.operator_metrics(
        ops, spec.horizon, spec.max_steps, spec.eps, "normalized", validate=False
    )
    ref = metrics.hitting_time(ops, spec.max_steps, "reference", validate=False)
    node = np.asarray(norm.node_fidelity)
    return {
        "fidelity": np.asarray(norm.minimax_fidelity),
        "fidelity_median": np.median(node, axis=-1),
        "fidelity_p10": np.percentile(node, 10, axis=-1),
        "hitting_time_reference": np.asarray(ref),
        "hitting_time_normalized": np.asarray(norm.hitting_time),
        "tv_mixing_time_normalized": np.asarray(norm.tv_mixing_time),
        "spectral_mixing_time_normalized": np.asarray(norm.spectral_mixing_time),
    }


def baseline(num_tokens: int, spec: AnalysisSpec) -> dict[str, float]:
    """The same numbers for uniform causal attention of the same length: what a head that
    reads every earlier token equally would score."""
    fields = operator_fields(graphs.uniform_causal(num_tokens)[None], spec, validate=False)
    return {name: float(v[0]) for name, v in fields.items()}


def analyze_layer(
    attn_BxHxTxT, weights_H, spec: AnalysisSpec, timer: Timer | None = None, extra=None
) -> dict:
    """Every per-layer number, arrays with a leading sequence axis B. `extra` {name:
    weights (H,)} adds fixed mixes (e.g. optimal weights found on other windows). With
    `spec.sink_tokens` = k > 0, the same again under `without_sink` on the graph without
    the first k tokens (rows renormalised over the remaining keys)."""
    timer = timer or Timer()
    attn = metrics.check_operator(jnp.asarray(attn_BxHxTxT, jnp.float32), "attention")
    out = _analyze_graph(attn, weights_H, spec, timer, extra or {})
    out["sink_mass"] = np.asarray(graphs.sink_mass(attn, max(spec.sink_tokens, 1)))
    if spec.sink_tokens:
        spec.check_length(attn.shape[-1])
        dropped = graphs.drop_sink_tokens(attn, spec.sink_tokens)
        inner = dataclasses.replace(spec, sink_tokens=0, optimal_weights=False)
        out["without_sink"] = _analyze_graph(dropped, weights_H, inner, timer, extra or {})
    return out


def _analyze_graph(attn, weights_H, spec: AnalysisSpec, timer: Timer, extra: dict) -> dict:
    b, h = attn.shape[:2]
    learned = None if weights_H is None else graphs.normalize_weights(weights_H, h)
    names = (["learned"] if learned is not None else []) + ["uniform", *extra]
    mixes = ([] if learned is None else [learned]) + [jnp.full((h,), 1.0 / h)]
    mixes += [graphs.normalize_weights(w, h) for w in extra.values()]
    ops = jnp.concatenate([jnp.einsum("mh,bhij->bmij", jnp.stack(mixes), attn), attn], axis=1)
    with timer.part("per-head and mixed metrics"):
        fields = operator_fields(ops, spec, validate=False)
        fid = fields["fidelity"]
    k = len(mixes)
    out = {
        "heads": {name: v[:, k:] for name, v in fields.items()},
        "mixes": {
            mix: {name: v[:, i] for name, v in fields.items()} for i, mix in enumerate(names)
        },
        "best_head": np.argmax(fid[:, k:], axis=-1),
        "best_head_fidelity": fid[:, k:].max(-1),
    }
    for i, mix in enumerate(names):
        out["mixes"][mix]["gain"] = fid[:, i] - fid[:, k:].max(-1)
    weights = mixes[0]
    with timer.part("synergy analyses"):
        out["head_diversity"] = np.asarray(synergy.head_diversity(attn, validate=False))
        share = np.asarray(synergy.cross_head_share(attn, weights, spec.horizon, validate=False))
        out["cross_head_share_mean"] = share.mean(-1)
    if spec.pairwise:
        with timer.part("pairwise synergy"):
            out["pairwise_synergy"] = np.asarray(synergy.pairwise_synergy(attn, spec.horizon))
    if spec.optimal_weights:
        with timer.part("optimal weights"):
            w, value = synergy.optimal_weights(attn, "fidelity", horizon=spec.horizon, init=weights)
            out["optimal_weights"] = np.asarray(w)
            out["fidelity_optimal"] = float(value)
    return out


def _rollout(mixed_LxBxTxT: list, spec: AnalysisSpec) -> dict:
    """The sink's row of the rollout from the kept per-layer mixes (heads already mixed)."""
    layers = jnp.stack(mixed_LxBxTxT, axis=1)[:, :, None]  # B x L x 1 x T x T
    shares = np.asarray(graphs.rollout_sink(layers, residual=spec.residual))
    return {"sink_share": shares, "network_fidelity": shares.min(-1)}


def _selected(spec: AnalysisSpec, num_layers: int) -> tuple[int, ...]:
    layers = tuple(range(num_layers)) if spec.layers is None else spec.layers
    bad = [layer for layer in layers if not 0 <= layer < num_layers]
    if bad:
        raise ValueError(f"layers must be in [0, {num_layers}), got {bad}")
    return layers


def analyze_tokens(
    module, params, tokens_BxT, spec: AnalysisSpec, timer: Timer | None = None, extra=None
):
    """Record of a pretrained model on token ids: per analysed layer, then the rollout.

    One layer's attention is alive at a time; the rollout is carried as the running
    product R_l = A~_l R_{l-1} (B x T x T), so memory stays at one layer of one batch.
    `extra` {name: weights (L, H)} adds fixed mixes per layer.
    """
    timer = timer or Timer()
    fam = pretrained.family(module)
    cfg = module.config
    layers = _selected(spec, cfg.num_layers)
    spec.check_length(np.shape(tokens_BxT)[-1])
    out, product = {}, None
    run = pretrained.layer_by_layer(module, params, tokens_BxT)
    for layer in range(cfg.num_layers):
        with timer.part("forward"):
            _, attn = next(run)
            attn.block_until_ready()
        weights = graphs.head_importance(
            fam.out_kernel(params, layer).astype(jnp.float32), cfg.num_heads
        )
        with timer.part("rollout"):
            product = _rollout_step(product, graphs.combine_heads(attn, weights), spec.residual)
        if layer in layers:
            fixed = {name: w[layer] for name, w in (extra or {}).items()}
            out[layer] = analyze_layer(attn, weights, spec, timer, fixed)
    shares = np.asarray(product[..., -1, :])
    rollout = {"sink_share": shares, "network_fidelity": shares.min(-1)}
    return {"layers": out, "rollout": rollout, **baselines(np.shape(tokens_BxT)[-1], spec)}


@jax.jit
def _rollout_step(product, mixed_BxTxT, residual):
    eye = jnp.eye(mixed_BxTxT.shape[-1], dtype=mixed_BxTxT.dtype)
    op = residual * eye + (1.0 - residual) * mixed_BxTxT
    if product is None:
        return jnp.broadcast_to(op, mixed_BxTxT.shape)
    return jnp.matmul(op, product, precision=jax.lax.Precision.HIGHEST)


def baselines(num_tokens: int, spec: AnalysisSpec) -> dict:
    """Uniform causal attention at the window's length (and without the sink tokens)."""
    spec.check_length(num_tokens)
    out = {"baseline": baseline(num_tokens, spec)}
    if spec.sink_tokens:
        out["baseline_without_sink"] = baseline(num_tokens - spec.sink_tokens, spec)
    return out


def analyze_attention(attn, spec: AnalysisSpec, timer: Timer | None = None) -> dict:
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
    out = {layer: analyze_layer(attn[:, layer], None, spec, timer) for layer in layers}
    with timer.part("rollout"):
        rollout = _rollout(
            [jnp.asarray(attn[:, i].mean(1), jnp.float32) for i in range(attn.shape[1])], spec
        )
    return {"layers": out, "rollout": rollout, **baselines(attn.shape[-1], spec)}


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


def text_record(path_or_name, text: str, spec: AnalysisSpec, dtype=None) -> dict:
    """Load a checkpoint, tokenise `text`, analyse it: the record `analysis_report` writes."""
    timer = Timer()
    with timer.part("load"):
        module, params, tokenizer = pretrained.load(path_or_name, dtype)
    ids = tokenize(tokenizer, text, module)
    record = analyze_tokens(module, params, np.asarray([ids]), spec, timer)
    labels = [tokenizer.decode([i]) for i in ids]
    record["rollout"]["largest_shares"] = largest_shares(record["rollout"]["sink_share"], labels)
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
        "timings_s": timer.seconds,
    }


def attention_record(path, spec: AnalysisSpec) -> dict:
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
