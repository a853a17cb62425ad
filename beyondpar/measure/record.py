"""The per-layer record, named once: every field `measure_layer` returns, with its shape
and unit, and the groups that summaries, series and reports read from here.

Shapes carry B, the sequences (or windows) of the batch, and H, the layer's heads. A
layer's record is a dict:

    heads           {field: (B, H)}          every head alone, OPERATOR_FIELDS
    mixes           {mix: {field: (B,)}}     each mix of the heads, MIX_FIELDS; mixes are
                                             LEARNED (output-projection weights, when the
                                             model has them), UNIFORM, then any given
                                             (OPTIMAL: weights searched on other sequences;
                                             the cross-head shares are of the first mix)
    best_head       (B,) int                 the head of largest minimax fidelity
    LAYER_SCALARS   (B,) each                see FIELDS
    sink_mass       (B, H)                   see FIELDS
    pairwise_synergy (B, H, H)               only when asked (spec.pairwise)
    coalitions      {field: (B, ...)}        only when asked (spec.coalitions): the heads'
                                             coalitions as a cooperative game, COALITION;
                                             fields ending in _fidelity here, those ending
                                             in _loss added by a workflow that runs the
                                             model (the loss a coalition restores)
    optimal         the optimum's search     only when searched here (spec.optimal_weights)
    without_sink    the same record on the graph without the first k tokens
                    (spec.sink_tokens = k > 0)
"""

from __future__ import annotations

import dataclasses
import itertools

FORMAT = 2  # the version of the record written to JSON: 1 had no "format" key


@dataclasses.dataclass(frozen=True)
class Field:
    """One number of the record: its `unit` (fraction, steps, radius, tv: a total-variation
    distance) and meaning."""

    name: str
    unit: str
    doc: str


OPERATOR = (
    Field("fidelity", "fraction", "minimax fidelity: min over tokens of max_t s_t[j]"),
    Field("fidelity_median", "fraction", "median node fidelity (a typical token)"),
    Field("fidelity_p10", "fraction", "10th percentile of node fidelity"),
    Field("hitting_time_reference", "steps", "hitting time, the paper's reference walk"),
    Field("hitting_time_normalized", "steps", "hitting time, the normalised walk"),
    Field("tv_mixing_time_normalized", "steps", "TV mixing time, the normalised walk"),
    Field("spectral_mixing_time_normalized", "steps", "spectral mixing, the normalised walk"),
    # The reference walk never leaves token 0 of causal attention: its TV and spectral
    # times saturate (kept for parity with the paper's estimator).
    Field("tv_mixing_time_reference", "steps", "TV mixing time, the reference walk"),
    Field("spectral_mixing_time_reference", "steps", "spectral mixing, the reference walk"),
    Field("spectral_radius_reference", "radius", "spectral radius of Q, the reference walk"),
    Field("spectral_radius_normalized", "radius", "spectral radius of Q, the normalised walk"),
)
GAIN = Field("gain", "fraction", "the mix's fidelity minus its best head's")
LAYER = (
    Field("best_head_fidelity", "fraction", "the largest minimax fidelity of one head"),
    Field("head_diversity", "tv", "mean total variation distance between heads' rows"),
    Field(
        "cross_head_share_minimax",
        "fraction",
        "the sink signal of the mix's worst-served token carried through two or more heads",
    ),
    Field(
        "cross_head_share_mean",
        "fraction",
        "mean over tokens of the sink signal carried by paths through two or more heads",
    ),
)
SINK_MASS = Field("sink_mass", "fraction", "each head's mean attention on the first k tokens")

# The coalitions of a layer's heads as a cooperative game, on two values: `fidelity`, the
# minimax fidelity of the coalition's mix (weights renormalised over its members; empty:
# 0), and `loss`, the loss the coalition restores when the layer's other heads are masked
# (L(every head of the layer masked) - L(only the coalition kept)). Pairs and triples are
# listed in `itertools.combinations(range(H), k)` order (`coalition_members`).
OBJECTIVES = ("fidelity", "loss")
OBJECTIVE_UNITS = {"fidelity": "fraction", "loss": "nats"}
_COALITION_DOCS = (
    ("shapley", "(B, H) each head's Shapley value"),
    ("shapley_stderr", "(B, H) its standard error (0 when every coalition is valued)"),
    ("interaction", "(B, H, H) pairwise Shapley interaction index (diagonal: Shapley)"),
    ("pair_dividends", "(B, H(H-1)/2) Harsanyi dividend of every pair"),
    ("triple_dividends", "(B, C(H, 3)) Harsanyi dividend of every triple"),
    ("negative_pair_share", "(B,) share of pairs with a negative dividend"),
    ("negative_triple_share", "(B,) share of triples with a negative dividend"),
)
COALITION = tuple(
    Field(
        f"{name}_{objective}",
        "fraction" if name.startswith("negative") else OBJECTIVE_UNITS[objective],
        f"{doc}, on the {objective} value",
    )
    for objective in OBJECTIVES
    for name, doc in _COALITION_DOCS
)
COALITIONS = "coalitions"
# Valued by sampled permutations (too many heads for every coalition): the dividends and
# the interaction are absent, the Shapley values carry their standard errors.
COALITION_SAMPLED = ("shapley", "shapley_stderr")

# Names the reports read one by one (a name, never a position in the tuples below).
FIDELITY, MEDIAN, P10 = "fidelity", "fidelity_median", "fidelity_p10"
HITTING_NORMALIZED = "hitting_time_normalized"
BEST_HEAD_FIDELITY, DIVERSITY = "best_head_fidelity", "head_diversity"
CROSS_HEAD_SHARE = "cross_head_share_mean"

OPERATOR_FIELDS = tuple(f.name for f in OPERATOR)
MIX_FIELDS = (*OPERATOR_FIELDS, GAIN.name)
LAYER_SCALARS = tuple(f.name for f in LAYER)
COALITION_FIELDS = tuple(f.name for f in COALITION)
FIELDS = {f.name: f for f in (*OPERATOR, GAIN, *LAYER, SINK_MASS, *COALITION)}
assert {FIDELITY, MEDIAN, P10, HITTING_NORMALIZED, BEST_HEAD_FIDELITY, DIVERSITY} <= set(FIELDS)

LEARNED, UNIFORM, OPTIMAL = "learned", "uniform", "optimal"
# The optimum searched on the sequences it is scored on (an upper estimate), and the
# hitting-time optimum held out and in sample, as the study adds them.
OPTIMAL_IN_SAMPLE = "optimal_in_sample"
OPTIMAL_HITTING_TIME = "optimal_hitting_time"
OPTIMAL_HITTING_TIME_IN_SAMPLE = "optimal_hitting_time_in_sample"
WITHOUT_SINK = "without_sink"
# Entries that are not one number per sequence: pairwise synergy (H x H, for the one-text
# report) and the optimum's search record (per fold).
NOT_PER_SEQUENCE = ("pairwise_synergy", OPTIMAL)


def coalition_field(name: str, objective: str) -> str:
    """The record's name of a coalition quantity (`shapley`, `pair_dividends`, ...) on an
    objective (`fidelity` or `loss`)."""
    field = f"{name}_{objective}"
    if field not in COALITION_FIELDS:
        raise ValueError(f"coalition field must be one of {COALITION_FIELDS}, got {field!r}")
    return field


def coalition_members(num_heads: int, size: int) -> list[tuple[int, ...]]:
    """The heads of each entry of the `size`-head dividends (2: pairs, 3: triples)."""
    return list(itertools.combinations(range(num_heads), size))


def unit_of(name: str) -> str:
    """The unit of a field of the record; an unknown name is an error, never a guess."""
    if name not in FIELDS:
        raise ValueError(f"field must be one of {sorted(FIELDS)}, got {name!r}")
    return FIELDS[name].unit
