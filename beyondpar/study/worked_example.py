"""The paper's Example 2 (Figure 3): two heads that each lose a token, mixed, lose none.

Nodes u, v, w, tau (the sink); every node keeps a self-loop. Head 1 is the chain
u -> v -> w -> tau; head 2 has u -> w, v -> w, v -> tau, w -> tau. Alone, head 1 keeps
at most 37.5% of every token at the sink and head 2 25%; mixed 0.5 / 0.5 they keep 5/12.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np

from beyondpar import graphs, metrics
from beyondpar.base import files

NODES = ("u", "v", "w", "tau")
HEAD_EDGES = {
    "head1": [("u", "v"), ("v", "w"), ("w", "tau")],
    "head2": [("u", "w"), ("v", "w"), ("v", "tau"), ("w", "tau")],
}
STEPS = 20


def operators(mix: tuple[float, float] = (0.5, 0.5)) -> dict[str, jnp.ndarray]:
    """Head 1, head 2 and their mixture as 4 x 4 row-stochastic operators."""
    index = {name: i for i, name in enumerate(NODES)}
    heads = {
        name: graphs.dag_operator([(index[a], index[b]) for a, b in edges], len(NODES))
        for name, edges in HEAD_EDGES.items()
    }
    mixed = graphs.combine_heads(jnp.stack(list(heads.values())), jnp.asarray(mix))
    return {**heads, "mixed": mixed}


def summary(horizon: int = STEPS) -> dict:
    """Per operator: fidelity of each node and the minimax fidelity (fractions)."""
    out = {}
    for name, op in operators().items():
        phi = np.asarray(metrics.node_fidelity(op, horizon))
        out[name] = {
            "node_fidelity": dict(zip(NODES, phi.tolist(), strict=True)),
            "minimax_fidelity": float(phi.min()),
        }
    return out


def plot_operator(name: str, op, steps: int = STEPS):
    """Signal percent at the sink per node over time, with the running minimax fidelity."""
    import matplotlib.ticker

    plt = files.pyplot()
    signal = 100 * np.asarray(metrics.sink_signal(op, steps))  # steps x nodes
    t = np.arange(1, steps + 1)
    running = np.maximum.accumulate(signal, axis=0).min(axis=1)
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for j, node in enumerate(NODES):
        ax.plot(t, signal[:, j], marker="o", ms=3, label=node)
    ax.plot(t, running, "k--", label=f"minimax fidelity ({running[-1]:.1f}%)")
    ax.set(xlabel="diffusion step t", ylabel="share at the sink (%)", title=f"Example 2: {name}")
    ax.set_ylim(0, 100)
    ax.set_xlim(0.5, steps + 0.5)
    ticks = sorted({1, *range(5, steps + 1, 5)})  # t = 1 is the first step, not t = 0
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # off the curves
    fig.tight_layout()
    return fig


def write(out_dir: str | Path, steps: int = STEPS) -> dict:
    """Write example2_<operator>.png for each operator and example2.json; return the summary."""
    out_dir = Path(out_dir)
    result = summary(steps)
    figures = {
        f"example2_{name}.png": lambda name=name, op=op: plot_operator(name, op, steps)
        for name, op in operators().items()
    }
    files.write_figures(out_dir, figures, dpi=120)
    files.write_json(out_dir / "example2.json", result)
    return result


def format_summary(result: dict) -> str:
    lines = [f"{'operator':<8}" + "".join(f"{n:>8}" for n in NODES) + f"{'minimax':>10}"]
    for name, row in result.items():
        cells = "".join(f"{100 * row['node_fidelity'][n]:7.2f}%" for n in NODES)
        lines.append(f"{name:<8}{cells}{100 * row['minimax_fidelity']:9.2f}%")
    return "\n".join(lines)
