"""Language-study run folders as an ablation leaves them, made up so that every number
is known: bits per byte falling with steps and moving with heads by a sign, and the
optimal mix's wins rising or falling (the report and page tests read them back)."""

from __future__ import annotations

import json
import math

from beyondpar.base import settings
from beyondpar.study import lm_stats
from configs import lm as lm_config

HEADS = (1, 2, 4)
SEEDS = (0, 1, 2)
STEPS = (100, 200, 300)
LAYERS = 2
MEASURES = ("best_head_fidelity", "fidelity_learned", "fidelity_uniform", "fidelity_optimal")


def bpb(heads, seed, step, sign):
    """A bits-per-byte value: falls with steps, moves with heads by `sign`, seed noise."""
    return 3.0 - 0.001 * step + sign * 0.05 * math.log2(heads) + 0.01 * ((seed * 7 + heads) % 3)


def wins(heads, seed, step, sign):
    """Windows won by the optimal mix, per layer: rising (sign 1) or falling with step."""
    base = 0.5 + sign * 0.001 * (step - 200) + 0.02 * seed
    return [base + 0.01 * layer for layer in range(LAYERS)]


def eval_line(heads, seed, step, loss_sign, wins_sign):
    value = bpb(heads, seed, step, loss_sign)
    line = {"step": step, "eval/bits_per_byte": value, "eval/loss": value * math.log(2)}
    for layer in range(LAYERS):
        for k, name in enumerate(MEASURES):
            line[f"layer{layer + 1}/{name}"] = 0.01 * (k + 1) + 0.001 * heads + 0.0001 * seed
        line[f"layer{layer + 1}/wins_optimal"] = wins(heads, seed, step, wins_sign)[layer]
    return line


def write_runs(root, loss_sign=-1, wins_sign=1, heads=HEADS, seeds=SEEDS):
    """A grid of run folders as an ablation leaves them: config.json and metrics.jsonl
    with training lines between the evaluations."""
    for h in heads:
        for s in seeds:
            run = root / f"heads-{h}_seed-{s}"
            run.mkdir(parents=True)
            config = lm_config.get_config(f"heads={h},seed={s}")
            config.model.update(embed_dim=16, num_layers=LAYERS, mlp_dim=32, max_len=16)
            config.seq_len = 16
            (run / "config.json").write_text(json.dumps(settings.json_form(config.to_dict())))
            lines = []
            for step in STEPS:
                lines.append({"step": step - 50, "train/loss": 2.0})
                lines.append(eval_line(h, s, step, loss_sign, wins_sign))
            (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return lm_stats.read_runs(root)
