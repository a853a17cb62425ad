"""Multi-head analyses on top of the metric kernels: does mixing beat every head?"""

from __future__ import annotations

import jax.numpy as jnp


def amplification(per_head_fidelity_xH, combined_fidelity):
    """The paper's Tables 5-6: best individual head, combined, and the gain.

    `per_head_fidelity_xH` (..., H) holds each head's own minimax fidelity and
    `combined_fidelity` (...) that of the mixed operator; gain = combined - best.
    """
    best = jnp.max(per_head_fidelity_xH, axis=-1)
    return {
        "best_individual": best,
        "combined": combined_fidelity,
        "gain": combined_fidelity - best,
    }
