"""An independent PyTorch version of the paper's model and its training step: the baseline
`train_suite` measures JAX against, in the same run, when torch is installed (the `torch`
extra; the package never needs it).

Written from the architecture in the reference data's description, the way the paper's
own code is: token + position embeddings, pre-norm blocks with RMSNorm (epsilon: float32
machine epsilon, PyTorch's default), separate q/k/v/output projections with bias, causal
softmax attention with dropout 0.1 on its weights, a ReLU MLP with dropout on its output,
an output projection without a final norm; Adam, mean cross-entropy over every position.
Eager PyTorch with its own kernels, as a user would run it.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np


def available() -> bool:
    """Whether torch can be imported (located, not imported)."""
    return importlib.util.find_spec("torch") is not None


def device_for(jax_backend: str) -> str:
    """The torch device matching JAX's backend: a GPU run is compared with PyTorch on the
    same GPU (CUDA), anything else with PyTorch on the CPU."""
    import torch

    return "cuda" if jax_backend == "gpu" and torch.cuda.is_available() else "cpu"


def init_params(cfg, seed: int = 0, device: str = "cpu") -> dict:
    """Parameters of the paper's model (`model.ModelConfig` sizes) as torch tensors on
    `device` (drawn on the CPU, so every device starts from the same values)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    d, f = cfg.embed_dim, cfg.mlp_dim

    def linear(n_in, n_out):  # PyTorch's default Linear initialisation
        bound = 1 / math.sqrt(n_in)
        w = (torch.rand(n_out, n_in, generator=g) * 2 - 1) * bound
        return w, (torch.rand(n_out, generator=g) * 2 - 1) * bound

    p = {
        "tok": torch.randn(cfg.vocab_size, d, generator=g),
        "pos": torch.randn(cfg.max_len, d, generator=g),
    }
    p["head.w"], p["head.b"] = linear(d, cfg.vocab_size)
    for i in range(cfg.num_layers):
        p[f"{i}.ln1"], p[f"{i}.ln2"] = torch.ones(d), torch.ones(d)
        for name in ("q", "k", "v", "o"):
            p[f"{i}.{name}.w"], p[f"{i}.{name}.b"] = linear(d, d)
        p[f"{i}.mlp1.w"], p[f"{i}.mlp1.b"] = linear(d, f)
        p[f"{i}.mlp2.w"], p[f"{i}.mlp2.b"] = linear(f, d)
    return {k: v.to(device).requires_grad_() for k, v in p.items()}


def forward(p: dict, tokens, cfg, training: bool = True):
    """Logits (B, T, V) of token ids (B, T)."""
    import torch
    import torch.nn.functional as F

    b, t = tokens.shape
    h, d = cfg.num_heads, cfg.embed_dim
    rate = cfg.dropout_rate if training else 0.0
    future = ~torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
    x = p["tok"][tokens] + p["pos"][:t]
    for i in range(cfg.num_layers):
        y = F.rms_norm(x, (d,), p[f"{i}.ln1"])
        q, k, v = (
            F.linear(y, p[f"{i}.{n}.w"], p[f"{i}.{n}.b"]).view(b, t, h, d // h).transpose(1, 2)
            for n in ("q", "k", "v")
        )
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
        weights = F.dropout(scores.masked_fill(future, float("-inf")).softmax(-1), rate)
        out = (weights @ v).transpose(1, 2).reshape(b, t, d)
        x = x + F.linear(out, p[f"{i}.o.w"], p[f"{i}.o.b"])
        y = F.rms_norm(x, (d,), p[f"{i}.ln2"])
        hidden = F.relu(F.linear(y, p[f"{i}.mlp1.w"], p[f"{i}.mlp1.b"]))
        x = x + F.dropout(F.linear(hidden, p[f"{i}.mlp2.w"], p[f"{i}.mlp2.b"]), rate)
    return F.linear(x, p["head.w"], p["head.b"])


def step_runner(cfg, inputs: np.ndarray, targets: np.ndarray, threads: int, device="cpu"):
    """One Adam step on the batch on `device` per call, after two warm-up steps, with
    `threads` intra-op threads (the cores the JAX step runs on). Each step ends by reading
    its loss, which waits for the device."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    p = init_params(cfg, device=device)
    opt = torch.optim.Adam(p.values(), lr=1e-3)
    tokens = torch.from_numpy(np.array(inputs)).to(device)
    labels = torch.from_numpy(np.array(targets)).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = forward(p, tokens.long(), cfg)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), labels.long().reshape(-1))
        loss.backward()
        opt.step()
        return float(loss.detach())

    for _ in range(2):
        step()
    return step
