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
from beyondpar.reports import html, numbering, packing

NODES = ("u", "v", "w", "tau")
HEAD_EDGES = {
    "head1": [("u", "v"), ("v", "w"), ("w", "tau")],
    "head2": [("u", "w"), ("v", "w"), ("v", "tau"), ("w", "tau")],
}
STEPS = 20
HITTING = "hitting_time_normalized"


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


def page(result: dict, steps: int = STEPS) -> dict:
    """index.html's data: the two heads and their mix as one layer, with each operator's
    minimax fidelity and hitting time, and the graph's edges as attention with every
    node's flow to the sink."""
    ops = operators()
    heads = jnp.stack([ops[name] for name in HEAD_EDGES])
    walk = {
        name: float(metrics.hitting_time(op, steps, walk="normalized")) for name, op in ops.items()
    }
    row = lambda name: {
        html.FIDELITY: html.stat(result[name]["minimax_fidelity"]),
        HITTING: html.stat(walk[name]),
    }
    rows = [{"name": "mix: 0.5 / 0.5", "kind": "mix", "values": row("mixed")}]
    rows += [
        {"name": numbering.head_name(h), "kind": "head", "head": h, "values": row(name)}
        for h, name in enumerate(HEAD_EDGES)
    ]
    phi = lambda name: [result[name]["node_fidelity"][n] for n in NODES]
    view = packing.layer(heads, [phi(name) for name in HEAD_EDGES], {"0.5 / 0.5": phi("mixed")})
    return {
        "title": "Example 2 (the paper's Figure 3): two heads and their mix",
        "notes": [
            "Nodes u, v, w and the sink tau; every node keeps a self-loop. Rows of the "
            "'attention' are receivers, row-normalised. Fidelity in %, hitting time on the "
            f"normalised walk in steps; horizon {steps}.",
        ],
        "fields": [
            {
                "name": html.FIDELITY,
                "label": "minimax fidelity",
                "unit": "fraction",
                "scale": 100,
                "display_unit": "%",
            },
            {
                "name": HITTING,
                "label": "hitting time, normalised",
                "unit": "steps",
                "scale": 1,
                "display_unit": "steps",
            },
        ],
        "layers": [{"key": "0", "number": 1, "label": "Example 2", "rows": rows}],
        "views": [{"name": "Example 2", "labels": list(NODES), "pool": 1, "layers": {"0": view}}],
    }


def write(out_dir: str | Path, steps: int = STEPS) -> dict:
    """Write example2_<operator>.png for each operator, example2.json and index.html;
    return the summary."""
    out_dir = Path(out_dir)
    result = summary(steps)
    figures = {
        f"example2_{name}.png": lambda name=name, op=op: plot_operator(name, op, steps)
        for name, op in operators().items()
    }
    files.write_figures(out_dir, figures, dpi=120)
    files.write_json(out_dir / "example2.json", result)
    html.write(out_dir, page(result, steps))
    return result


def format_summary(result: dict) -> str:
    lines = [f"{'operator':<8}" + "".join(f"{n:>8}" for n in NODES) + f"{'minimax':>10}"]
    for name, row in result.items():
        cells = "".join(f"{100 * row['node_fidelity'][n]:7.2f}%" for n in NODES)
        lines.append(f"{name:<8}{cells}{100 * row['minimax_fidelity']:9.2f}%")
    return "\n".join(lines)
