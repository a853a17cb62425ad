"""Multi-head analyses: amplification and pairwise synergy."""

import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import benchmarks, metrics, synergy, worked_example


def test_example2_pair_synergy():
    ops = worked_example.operators()
    heads = jnp.stack([ops["head1"], ops["head2"]])
    got = np.asarray(synergy.pairwise_synergy(heads))
    np.testing.assert_allclose(got, [[0, 5 / 12 - 3 / 8], [5 / 12 - 3 / 8, 0]], atol=1e-12)


def test_pairwise_synergy_batches_and_matches_amplification():
    attn = benchmarks.random_causal_attention(0, (2, 3), 10, dtype=np.float64)  # B x H x T x T
    got = np.asarray(synergy.pairwise_synergy(attn, 30))
    assert got.shape == (2, 3, 3)
    np.testing.assert_allclose(got, np.swapaxes(got, -1, -2))
    for b in range(2):
        pair = 0.5 * (attn[b, 0] + attn[b, 2])
        amp = synergy.amplification(
            metrics.minimax_fidelity(attn[b, [0, 2]], 30), metrics.minimax_fidelity(pair, 30)
        )
        np.testing.assert_allclose(got[b, 0, 2], amp["gain"], rtol=1e-12)
    with pytest.raises(ValueError, match=r"attn must have shape \(\.\.\., H, T, T\)"):
        synergy.pairwise_synergy(np.eye(3))
