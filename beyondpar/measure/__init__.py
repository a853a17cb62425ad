"""The one per-layer measurement every workflow uses (the study's evaluation, the
real-model analyses and whatever comes next): `measure_layer` on one layer's attention
(B, H, T, T) returns the record that `record` documents field by field."""

from beyondpar.measure import record  # noqa: F401
from beyondpar.measure.layer import (  # noqa: F401
    MeasureSpec,
    baseline,
    baselines,
    measure_layer,
    operator_fields,
    optimum_of,
)
