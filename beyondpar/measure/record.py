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
    optimal         the optimum's search     only when searched here (spec.optimal_weights)
    without_sink    the same record on the graph without the first k tokens
                    (spec.sink_tokens = k > 0)
"""

from __future__ import annotations

import dataclasses

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

# Names the reports read one by one (a name, never a position in the tuples below).
FIDELITY, MEDIAN, P10 = "fidelity", "fidelity_median", "fidelity_p10"
HITTING_NORMALIZED = "hitting_time_normalized"
BEST_HEAD_FIDELITY, DIVERSITY = "best_head_fidelity", "head_diversity"
CROSS_HEAD_SHARE = "cross_head_share_mean"

OPERATOR_FIELDS = tuple(f.name for f in OPERATOR)
MIX_FIELDS = (*OPERATOR_FIELDS, GAIN.name)
LAYER_SCALARS = tuple(f.name for f in LAYER)
FIELDS = {f.name: f for f in (*OPERATOR, GAIN, *LAYER, SINK_MASS)}
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


def unit_of(name: str) -> str:
    """The unit of a field of the record; an unknown name is an error, never a guess."""
    if name not in FIELDS:
        raise ValueError(f"field must be one of {sorted(FIELDS)}, got {name!r}")
    return FIELDS[name].unit
