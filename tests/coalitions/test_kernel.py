"""The in-cache measurement of many mixes: split over threads as over devices, and the
early stops against the full recursions."""

import functools

import jax
import numpy as np
import pytest

from beyondpar import coalitions, graphs, metrics
from beyondpar.coalitions import kernel

# The recursions as one program each (run op by op, every operation compiles alone), on
# operators of one shape.
settled_minimax = jax.jit(kernel.settled_minimax, static_argnums=1)
settled_hitting = jax.jit(kernel.settled_hitting, static_argnums=(1, 2))
MIXES, TOKENS = 6, 20


@pytest.mark.parametrize("threads", [None, 2, 3])
def test_threads_and_devices_give_the_same_values(threads):
    attn = graphs.random_causal(0, (5, 4), 8)
    w = np.full((5, 4), 0.25, np.float32)
    run = functools.partial(
        kernel._by_parts,  # noqa: SLF001 - the jitted body, run by over_sequences
        first=np.int32(0),
        count=4,
        low_bits=2,
        objective="fidelity",
        horizon=50,
        walk="reference",
    )
    got = np.asarray(kernel.over_sequences(run, attn, w, threads=threads))
    want = coalitions.values(attn, horizon=50)
    np.testing.assert_allclose(got[:, 1:], want[:, 1:], rtol=1e-6)


@pytest.mark.parametrize("walk", ["reference", "normalized"])
def test_early_stops_give_the_full_recursions_values(walk):
    mixed = graphs.random_causal(1, (MIXES,), TOKENS)
    np.testing.assert_allclose(
        settled_minimax(mixed, 100), metrics.minimax_fidelity(mixed, 100), rtol=1e-6
    )
    np.testing.assert_allclose(
        settled_hitting(mixed, 100, walk), metrics.hitting_time(mixed, 100, walk), rtol=1e-5
    )


def test_block_size_fits_the_cache_on_cpu():
    assert kernel.block_size(32, 128, 4) == metrics.CPU_BLOCK_BYTES // (128 * 128 * 4)
    assert kernel.block_size(1, 4096, 4) == 1


def test_a_token_the_walk_never_leaves_is_counted_at_once():
    """Token 0 of causal attention on the reference walk: its steps counted without the
    loop, the value that of the full recursion."""
    mixed = graphs.random_causal(2, (MIXES,), TOKENS)
    assert np.all(np.asarray(metrics.transition_matrix(mixed))[:, 0, 0] == 1)
    np.testing.assert_allclose(
        settled_hitting(mixed, 100, "reference"),
        metrics.hitting_time(mixed, 100, "reference"),
        rtol=1e-5,
    )


def test_a_mix_that_reads_later_tokens_is_never_stopped_early():
    """Non-causal attention (tokens 0 and 1 read later tokens): after three steps no share
    sits on or after the sink, the token with the lowest running maximum (0.25), which a
    causal walk could never raise again; here token 0 reads the sink and raises it to
    0.8125, so the minimax is 0.75. An early stop that took the operator for causal would
    return 0.25."""
    c = np.array([[0, 0, 0, 1], [0, 0, 0.75, 0.25], [1, 0, 0, 0], [0, 1, 0, 0]], np.float32)[None]
    want = metrics.minimax_fidelity(c, 5)
    np.testing.assert_allclose(want, [0.75], rtol=1e-6)
    np.testing.assert_allclose(settled_minimax(c, 5), want, rtol=1e-6)
    np.testing.assert_allclose(settled_minimax(c, 5, c), want, rtol=1e-6)
