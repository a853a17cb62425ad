"""A language ablation (a grid over heads and seeds of configs/lm.py) trains its runs and
ends with the language study's report, read from the runs' own evaluations."""

from pathlib import Path

import ml_collections
import pytest

from beyondpar.study import ablation, lm_stats
from helpers import lm_corpus

CONFIGS = Path(__file__).parents[2] / "configs"


def tiny_language_ablation(corpus: Path) -> ml_collections.ConfigDict:
    """The shape of a language ablation config, with a tiny model and a few steps."""
    c = ml_collections.ConfigDict()
    c.base = str(CONFIGS / "lm.py")
    c.base_arg = ""
    c.axes = ml_collections.ConfigDict({"heads": "model.num_heads", "seed": "seed"})
    c.levels = ml_collections.ConfigDict({"heads": (1, 2), "seed": (0,)})
    c.overrides = ml_collections.ConfigDict(
        {
            "data__path": str(corpus),
            "model__embed_dim": 16,
            "model__num_layers": 1,
            "model__mlp_dim": 32,
            "model__max_len": 16,
            "seq_len": 16,
            "optim__batch_size": 4,
            "optim__steps": 4,
            "optim__warmup_steps": 1,
            "eval_every_steps": 2,
            "log_every_steps": 2,
            "checkpoint_every_steps": 4,
            "evaluation__heldout_windows": 4,
            "evaluation__graph_windows": 2,
            "evaluation__graph_tokens": 8,
            "evaluation__horizon": 20,
            "evaluation__max_steps": 20,
        }
    )
    c.steps = "latest"
    return c


@pytest.mark.slow
def test_language_ablation_ends_with_the_language_report(tmp_path):
    corpus = lm_corpus.write_folder(tmp_path / "corpus", lm_corpus.documents())
    written, failures = ablation.run(
        tiny_language_ablation(corpus), tmp_path / "study", progress=False
    )
    assert failures == []
    assert {p.name for p in written} >= {"report.md", "results.json", "loss_vs_heads.png"}
    report = (tmp_path / "study" / "report" / "report.md").read_text()
    assert "Parameters are matched" in report
    assert "| 2 | 1 |" in report  # the 2-head row, one seed
    runs = lm_stats.read_runs(tmp_path / "study")
    assert sorted(r["heads"] for r in runs) == [1, 2]
    assert all(sorted(r["evals"]) == [2, 4] for r in runs)
    assert not (tmp_path / "study" / "evaluation.jsonl").exists()  # no batch evaluation
