"""The one per-layer measurement: every number a workflow gives for one layer's heads,
their mixes and the graph without the sink tokens, beside uniform causal attention of the
same length. Its record's fields, shapes and units are in `record`.

Per layer: every head's minimax fidelity (with the median and 10th percentile of node
fidelity), hitting time, TV and spectral mixing and the spectral radius on both walks
(the reference walk's TV and spectral times saturate on causal attention), the mixes
with output-projection and uniform weights, best head, amplification gain, head
diversity, cross-head share, pairwise synergy and, when asked, optimal weights held out
over sequences.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar import graphs, metrics, synergy, weighting
from beyondpar.base import checks
from beyondpar.base.timing import Timer
from beyondpar.measure import coalition_game, record


@dataclasses.dataclass(frozen=True)
class MeasureSpec:
    """What is measured. `layers` None: every layer. `pairwise` and `optimal_weights`
    switch off the costly parts (H^2 / 2 extra operators; a weight search). The optimal
    weights are cross-fitted over `folds` contiguous folds of the sequences (a single
    sequence has nothing to hold out: its optimum is in sample, and labelled so)."""

    horizon: int = 100
    max_steps: int = 100
    eps: float = 0.25
    residual: float = 0.5
    layers: tuple[int, ...] | None = None
    pairwise: bool = True
    optimal_weights: bool = False
    sink_tokens: int = 0
    folds: int = 2
    coalitions: bool = False
    exact_coalition_heads: int = 10
    permutations: int = 32
    coalition_seed: int = 0

    def __post_init__(self):
        checks.non_negative_int("--sink_tokens", self.sink_tokens)
        checks.positive_int("--folds", self.folds)
        checks.positive_int("--exact_coalition_heads", self.exact_coalition_heads)
        checks.positive_int("--permutations", self.permutations)
        checks.unit_interval("--residual", self.residual)

    def check_length(self, num_tokens: int) -> None:
        """The window must keep at least two tokens once the sink tokens are dropped."""
        if self.sink_tokens and self.sink_tokens >= num_tokens - 1:
            raise ValueError(
                f"--sink_tokens must be less than the window minus 1 ({num_tokens - 1}), "
                f"got {self.sink_tokens}"
            )


def operator_fields(ops_xTxT, spec: MeasureSpec, validate: bool = True) -> dict:
    """Every per-operator number: minimax fidelity (the paper's minimum over tokens) with
    the median and 10th percentile of node fidelity beside it (a typical token, when one
    unread token sets the minimum to 0), hitting time, TV and spectral mixing and the
    spectral radius on both walks. `validate` False: operators already checked."""
    return _operator_sweep(ops_xTxT, spec, validate)[0]


def _operator_sweep(
    ops_xTxT, spec: MeasureSpec, validate: bool = True, signal: bool = False, causal=None
):
    """(`operator_fields`, sink signals ...x horizon x T or None, node fidelity ...x T):
    both walks and the fidelity in one kernel pass. `causal`: as in
    `metrics.metrics_by_walk`."""
    by_walk, signals = metrics.metrics_by_walk(
        ops_xTxT,
        spec.horizon,
        spec.max_steps,
        spec.eps,
        ("normalized", "reference"),
        validate=validate,
        signal=signal,
        causal=causal,
    )
    norm, ref = by_walk["normalized"], by_walk["reference"]
    node = np.asarray(norm.node_fidelity)
    values = (
        norm.minimax_fidelity,
        np.median(node, axis=-1),
        np.percentile(node, 10, axis=-1),
        ref.hitting_time,
        norm.hitting_time,
        norm.tv_mixing_time,
        norm.spectral_mixing_time,
        ref.tv_mixing_time,
        ref.spectral_mixing_time,
        ref.spectral_radius,
        norm.spectral_radius,
    )  # in the order of record.OPERATOR_FIELDS
    fields = {name: np.asarray(v) for name, v in zip(record.OPERATOR_FIELDS, values, strict=True)}
    return fields, signals, node


def baseline(num_tokens: int, spec: MeasureSpec) -> dict[str, float]:
    """The same numbers for uniform causal attention of the same length: what a head that
    reads every earlier token equally would score."""
    fields = operator_fields(graphs.uniform_causal(num_tokens)[None], spec, validate=False)
    return {name: float(v[0]) for name, v in fields.items()}


def measure_layer(
    attn_BxHxTxT,
    weights_H=None,
    spec: MeasureSpec = MeasureSpec(),
    timer: Timer | None = None,
    extra=None,
    extra_without_sink=None,
) -> dict:
    """The record of one layer (`record` documents it), arrays with a leading sequence
    axis B; `weights_H` the learned head weights, (H,) or per sequence (B, H) (None: a
    model without them). `extra` {name:
    weights (H,) or per sequence (B, H)} adds fixed mixes (e.g. optimal weights searched
    on other windows). With `spec.sink_tokens` = k > 0, the same again under
    `without_sink` on the graph without the first k tokens (rows renormalised over the
    remaining keys), with the mixes of `extra_without_sink`: weights searched on that
    graph, never the full graph's."""
    timer = timer or Timer()
    attn = metrics.check_operator(jnp.asarray(attn_BxHxTxT, jnp.float32), "attention")
    # Checked once: the mixes and the graph without the sink tokens of causal attention
    # are causal too, and every kernel below would otherwise check it again.
    causal = metrics.is_causal(attn)
    out = _analyze_graph(attn, weights_H, spec, timer, extra or {}, causal)
    out["sink_mass"] = np.asarray(graphs.sink_mass(attn, max(spec.sink_tokens, 1)))
    if spec.coalitions and attn.shape[1] > 1:  # of the full graph only
        with timer.part("coalitions"):
            out[record.COALITIONS] = coalition_fields(attn, weights_H, spec)
    if spec.sink_tokens:
        spec.check_length(attn.shape[-1])
        dropped = graphs.drop_sink_tokens(attn, spec.sink_tokens)
        inner = dataclasses.replace(spec, sink_tokens=0, coalitions=False)
        out[record.WITHOUT_SINK] = _analyze_graph(
            dropped, weights_H, inner, timer, extra_without_sink or {}, causal
        )
    return out


def _weights_name(mix: str) -> str:
    """The argument a mix's weights came from, for its errors."""
    names = {record.LEARNED: "weights_H", record.UNIFORM: "uniform weights"}
    return names.get(mix, f"extra[{mix!r}]")


def _mixes(attn, weights_H, extra: dict):
    """(names, weights B x M x H): learned (when known), uniform, then `extra`."""
    b, h = attn.shape[:2]
    named = {} if weights_H is None else {record.LEARNED: weights_H}
    named.update({record.UNIFORM: jnp.full((h,), 1.0 / h)}, **extra)
    stacked = [
        jnp.broadcast_to(
            graphs.normalize_weights(w, h, _weights_name(n)).astype(attn.dtype), (b, h)
        )
        for n, w in named.items()
    ]
    return list(named), jnp.stack(stacked, axis=1)


@jax.jit
def _mix(mixes_BxMxH, attn_BxHxTxT):
    return jnp.einsum("bmh,bhij->bmij", mixes_BxMxH, attn_BxHxTxT)


def _analyze_graph(
    attn, weights_H, spec: MeasureSpec, timer: Timer, extra: dict, causal: bool
) -> dict:
    out = {}
    if spec.optimal_weights:
        with timer.part("optimal weights"):
            optimum = optimum_of(attn, weights_H, spec)
        extra = {**extra, record.OPTIMAL: optimum.pop("weights")}
        out[record.OPTIMAL] = optimum
    names, mixes = _mixes(attn, weights_H, extra)
    with timer.part("per-head and mixed metrics"):
        # Mixes and heads in two kernel calls: one batch of both would copy the layer.
        # The sink signals of the first mix and of every head give the cross-head share.
        mixed, mix_signals, mix_nodes = _operator_sweep(
            _mix(mixes, attn), spec, validate=False, signal=True, causal=causal
        )
        heads, signals, _ = _operator_sweep(attn, spec, validate=False, signal=True, causal=causal)
    best = heads["fidelity"].max(-1)
    out.update(
        heads=heads,
        mixes={mix: {name: v[:, i] for name, v in mixed.items()} for i, mix in enumerate(names)},
        best_head=np.argmax(heads["fidelity"], axis=-1),
        best_head_fidelity=best,
    )
    for mix in names:
        out["mixes"][mix][record.GAIN.name] = out["mixes"][mix]["fidelity"] - best
    with timer.part("synergy analyses"):
        out["head_diversity"] = np.asarray(
            synergy.head_diversity(attn, validate=False, causal=causal)
        )
        share = synergy.cross_head_share_of_signals(mix_signals[:, 0], signals, mixes[:, 0])
        out.update(_shares(np.asarray(share), mix_nodes[:, 0]))
    if spec.pairwise:
        with timer.part("pairwise synergy"):
            out["pairwise_synergy"] = np.asarray(synergy.pairwise_synergy(attn, spec.horizon))
    return out


def coalition_fields(attn_BxHxTxT, weights_H, spec: MeasureSpec) -> dict:
    """The fidelity game of the heads' coalitions, mixed with the learned weights (uniform
    without them), as `spec` asks (exact or sampled)."""
    return coalition_game.fidelity_fields(
        attn_BxHxTxT,
        weights_H,
        spec.horizon,
        spec.exact_coalition_heads,
        spec.permutations,
        jax.random.PRNGKey(spec.coalition_seed),
    )


def _shares(share_BxT, node_fidelity_BxT) -> dict:
    """The first mix's cross-head share at its worst-served token, and over all tokens."""
    worst = np.argmin(node_fidelity_BxT, axis=-1)
    return {
        "cross_head_share_minimax": np.take_along_axis(share_BxT, worst[:, None], -1)[:, 0],
        "cross_head_share_mean": share_BxT.mean(-1),
    }


def optimum_of(attn_BxHxTxT, weights_H, spec: MeasureSpec) -> dict:
    """The fidelity-optimal mix of a layer, cross-fitted over the B sequences: `weights`
    (B, H) each sequence's (searched without its fold), `fold_weights` (F, H), `in_sample`
    (F,) each search's value on its own sequences, `search_sets` and `held_out`."""
    found = weighting.cross_fitted(
        attn_BxHxTxT, spec.folds, objective="fidelity", horizon=spec.horizon, init=weights_H
    )
    return {
        "weights": found["weights"],
        "fold": found["fold"],
        "fold_weights": np.asarray(found["fold_weights"]),
        "in_sample": np.asarray(found["in_sample"]),
        "search_sets": found["search_sets"],
        "held_out": found["held_out"],
    }


def baselines(num_tokens: int, spec: MeasureSpec) -> dict:
    """Uniform causal attention at the window's length (and without the sink tokens)."""
    spec.check_length(num_tokens)
    out = {"baseline": baseline(num_tokens, spec)}
    if spec.sink_tokens:
        out["baseline_without_sink"] = baseline(num_tokens - spec.sink_tokens, spec)
    return out
