"""Exact, jitted, batched kernels for how information moves to the sink of an operator.

Every kernel takes row-stochastic operators `c` of shape `...xTxT` (rows: queries that
read, columns: keys that are read; the sink is the last token tau = T - 1) and returns
one value per operator (or per token). Definitions: the README's "Metric definitions".

Speed: each quantity is a K-step vector recursion per matrix (2 K T^2 flop). Streaming
every matrix from memory once per step leaves a CPU idle on memory bandwidth, so on CPU
the batch is cut into blocks of a few matrices that stay in cache for the whole horizon,
and the blocks are spread over all local devices. The fidelity vector and the walk's
survival vector are advanced in the same pass; with the normalised walk they even share
the matrix, since both are row vectors times `c`.

Modules: `operators` (the input check, walk laws, causality), `batching` (cache blocks,
devices, threads), `fused` (the one-pass sweep, dense or triangular), `early_stop` (loops
that end once their value is settled), `spectral`, and `api` (the public kernels). The
settings re-exported here are read where they are defined: set them there.
"""

from beyondpar.metrics.api import (  # noqa: F401
    OperatorMetrics,
    hitting_time,
    metrics_by_walk,
    minimax_fidelity,
    monte_carlo_hitting_time,
    node_fidelity,
    objective_unchecked,
    operator_metrics,
    relaxation_time,
    row_powers,
    sink_signal,
    spectral_mixing_time,
    spectral_radius,
    survival,
    tv_mixing_time,
)
from beyondpar.metrics.batching import CPU_BLOCK, CPU_BLOCK_BYTES, map_blocks  # noqa: F401
from beyondpar.metrics.fused import (  # noqa: F401
    TRIANGULAR_BLOCK_BYTES,
    TRIANGULAR_MIN_TOKENS,
    TRIANGULAR_SHARED_MIN_TOKENS,
    TRIANGULAR_TILES,
    triangular_tile,
)
from beyondpar.metrics.operators import (  # noqa: F401
    ROW_SUM_TOLERANCE,
    WALKS,
    check_operator,
    is_causal,
    transition_matrix,
)
from beyondpar.metrics.spectral import POWER_ITERATIONS  # noqa: F401
