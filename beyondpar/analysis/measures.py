"""Per-layer measures of attention: every number the real-model analyses give for one
layer's heads, their mixes and the graph without the sink tokens, beside uniform causal
attention of the same length.

Per layer: every head's minimax fidelity (with the median and 10th percentile of node
fidelity), hitting time on both walks, TV and spectral mixing (normalised walk: the
reference walk saturates on causal attention), the mixes with output-projection and
uniform weights, best head, amplification gain, head diversity, cross-head share,
pairwise synergy and, when asked, optimal weights.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from beyondpar import graphs, metrics, synergy
from beyondpar.base.timing import Timer


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


def operator_fields(ops_xTxT, spec: AnalysisSpec, validate: bool = True) -> dict:
    """Every per-operator number: minimax fidelity (the paper's minimum over tokens) with
    the median and 10th percentile of node fidelity beside it (a typical token, when one
    unread token sets the minimum to 0), hitting times on both walks, TV and spectral
    mixing on the normalised walk. `validate` False: operators already checked."""
    return _operator_sweep(ops_xTxT, spec, validate)[0]


def _operator_sweep(ops_xTxT, spec: AnalysisSpec, validate: bool = True, signal: bool = False):
    """(`operator_fields`, sink signals ...x horizon x T or None): both walks and the
    fidelity in one kernel pass."""
    by_walk, signals = metrics.metrics_by_walk(
        ops_xTxT,
        spec.horizon,
        spec.max_steps,
        spec.eps,
        ("normalized", "reference"),
        validate=validate,
        signal=signal,
    )
    norm, ref = by_walk["normalized"], by_walk["reference"]
    node = np.asarray(norm.node_fidelity)
    fields = {
        "fidelity": np.asarray(norm.minimax_fidelity),
        "fidelity_median": np.median(node, axis=-1),
        "fidelity_p10": np.percentile(node, 10, axis=-1),
        "hitting_time_reference": np.asarray(ref.hitting_time),
        "hitting_time_normalized": np.asarray(norm.hitting_time),
        "tv_mixing_time_normalized": np.asarray(norm.tv_mixing_time),
        "spectral_mixing_time_normalized": np.asarray(norm.spectral_mixing_time),
    }
    return fields, signals


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
        # The sink signals of the first mix and of every head give the cross-head share.
        fields, signals = _operator_sweep(ops, spec, validate=False, signal=True)
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
        share = synergy.cross_head_share_of_signals(signals[:, 0], signals[:, k:], weights)
        out["cross_head_share_mean"] = np.asarray(share).mean(-1)
    if spec.pairwise:
        with timer.part("pairwise synergy"):
            out["pairwise_synergy"] = np.asarray(synergy.pairwise_synergy(attn, spec.horizon))
    if spec.optimal_weights:
        with timer.part("optimal weights"):
            w, value = synergy.optimal_weights(attn, "fidelity", horizon=spec.horizon, init=weights)
            out["optimal_weights"] = np.asarray(w)
            out["fidelity_optimal"] = float(value)
    return out


def baselines(num_tokens: int, spec: AnalysisSpec) -> dict:
    """Uniform causal attention at the window's length (and without the sink tokens)."""
    spec.check_length(num_tokens)
    out = {"baseline": baseline(num_tokens, spec)}
    if spec.sink_tokens:
        out["baseline_without_sink"] = baseline(num_tokens - spec.sink_tokens, spec)
    return out
