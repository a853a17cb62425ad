"""The coalitions suite on tiny shapes: both parts timed, counted and printed."""

import numpy as np
import pytest

from beyondpar.benchmarks import coalitions
from helpers.tiny_models import TINY_SMOLLM2


def test_coalitions_suite_times_both_models(capsys, monkeypatch):
    monkeypatch.setattr(coalitions, "matmul_flops_per_s", lambda repeats: 87.6e9)
    r = coalitions.coalitions_suite(
        windows=3, tokens=12, sequences=2, smollm2_config=TINY_SMOLLM2, paper_heads=2, repeats=2
    )
    small, paper = r["smollm2"], r["paper_16_heads"]
    assert (small["layers"], small["heads"], small["coalitions"]) == (2, 3, 16)
    assert (small["sequences"], small["tokens"]) == (3, 12)
    assert (paper["layers"], paper["heads"], paper["coalitions"]) == (1, 2, 4)
    assert (paper["sequences"], paper["tokens"]) == (2, 100)
    assert small["coalitions_per_s"] == pytest.approx(16 / small["values_s"])
    assert paper["mixes_per_s"] == pytest.approx(4 * 2 / paper["values_s"])
    assert np.isfinite(small["mean_all_minus_empty"]) and r["matmul_gflop_per_s"] == 87.6
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].endswith("matmul 88 GFLOP/s") and out[-1].startswith('{"devices"')
    assert "coalitions/s" in out[2] and "paper 2 heads shape, random weights" in out[3]
