"""The coalitions section of the reports: its rows are the summary's values, heads and
layers numbered from 1, and the interaction figures leave the diagonal blank."""

import numpy as np

from beyondpar.base import files
from beyondpar.measure import coalition_game
from beyondpar.reports import coalitions


def summary(objective: str) -> dict:
    """A two-head-and-more layer's summary from fields over 3 sequences."""
    rng = np.random.default_rng(0)
    fields = {
        f"shapley_{objective}": rng.normal(size=(3, 3)),
        f"shapley_stderr_{objective}": np.zeros((3, 3)),
        f"interaction_{objective}": rng.normal(size=(3, 3, 3)),
        f"pair_dividends_{objective}": rng.normal(size=(3, 3)),
        f"negative_pair_share_{objective}": np.asarray([0.0, 1 / 3, 2 / 3]),
        f"triple_dividends_{objective}": rng.normal(size=(3, 1)),
        f"negative_triple_share_{objective}": np.asarray([0.0, 1.0, 1.0]),
    }
    return coalition_game.summarize(fields, objective, coalition_game.normal_intervals)


def table(lines: list[str], heading: str) -> dict[str, list[str]]:
    """{layer number: cells} of the table under `heading`."""
    start = lines.index(heading) + 4
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_rows_are_the_summarys_values_numbered_from_one():
    games = {"0": {"fidelity": summary("fidelity"), "loss": summary("loss")}, "4": {}}
    games["4"] = {"fidelity": summary("fidelity")}
    lines = coalitions.section(games)
    fid = games["0"]["fidelity"]
    shapley = table(lines, "### Shapley values on the minimax fidelity of the coalition's mix (pp)")
    assert set(shapley) == {"1", "5"}
    assert lines[2] == (
        "Heads are numbered from 1: head h is index h-1 of each per-head list in the JSON outputs."
    )
    heading = "### Shapley values on the minimax fidelity of the coalition's mix (pp)"
    columns = lines[lines.index(heading) + 2]
    assert columns == "| layer | head 1 | head 2 | head 3 |"  # the summary's indices 0, 1, 2
    for h in range(3):
        m, lo, hi = (100 * fid["shapley"][k][h] for k in ("mean", "low", "high"))
        assert shapley["1"][h] == f"{m:.3f} [{lo:.3f}, {hi:.3f}]"
    heading = (
        "### Harsanyi dividends on the loss the coalition restores with the layer's other "
        "heads masked (nats)"
    )
    dividends = table(lines, heading)
    assert set(dividends) == {"1"}  # layer 5 has no loss game
    best = games["0"]["loss"]["strongest_positive_pair"]
    heads = "+".join(str(h + 1) for h in best["heads"])
    assert (
        dividends["1"][0] == f"{heads}: {best['mean']:.3f} [{best['low']:.3f}, {best['high']:.3f}]"
    )
    share = games["0"]["loss"]["negative_triple_share"]
    assert (
        dividends["1"][5]
        == f"{100 * share['mean']:.1f} [{100 * share['low']:.1f}, {100 * share['high']:.1f}]"
    )


def test_interaction_figures_blank_the_diagonal(tmp_path):
    games = {"0": {"fidelity": summary("fidelity")}, "1": {"fidelity": summary("fidelity")}}
    mats = coalitions.interaction_by_layer(games, "fidelity")
    assert np.isnan(np.diag(mats["0"])).all()
    off = 100 * np.asarray(games["0"]["fidelity"]["interaction"])[0, 1]
    assert mats["0"][0, 1] == off
    drawn = coalitions.draw(games, files.pyplot())
    assert list(drawn) == ["coalitions_interaction_fidelity.png"]
    written = files.write_figures(tmp_path, drawn)
    assert written[0].exists()
