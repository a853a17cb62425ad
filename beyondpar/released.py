"""The weights released with the paper: PyTorch state dicts of its Transformer (.pt, or
converted to .npz) read into this package's Flax model, checked key by key and shape by
shape."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np

from beyondpar import model as model_lib
from beyondpar.base import checks, files


def read_state_dict(path: Path) -> dict[str, np.ndarray]:
    """Key -> array of a state dict saved as .npz, or as .pt / .pth (needs torch)."""
    if path.suffix == ".npz":
        return files.read_npz(path)
    if path.suffix in (".pt", ".pth"):
        try:
            import torch
        except ImportError as err:
            raise ImportError(
                f"reading {path.name} needs the 'torch' package (pip install torch), "
                "or convert it to .npz (key -> array)"
            ) from err
        state = torch.load(path, map_location="cpu", weights_only=True)
        return {k: v.detach().cpu().numpy() for k, v in state.items()}
    raise ValueError(f"path must end in .npz, .pt or .pth, got {path.name!r}")


def _expected_keys(num_layers: int) -> list[str]:
    keys = ["token_emb.weight", "pos_emb.weight", "out_proj.weight", "out_proj.bias"]
    for i in range(num_layers):
        for lin in ("attn.W_q", "attn.W_k", "attn.W_v", "attn.out_proj", "mlp.0", "mlp.2"):
            keys += [f"layers.{i}.{lin}.weight", f"layers.{i}.{lin}.bias"]
        keys += [f"layers.{i}.ln1.weight", f"layers.{i}.ln2.weight"]
    return keys


def config_from_state_dict(state: dict[str, np.ndarray], num_heads: int) -> model_lib.ModelConfig:
    """The architecture a PyTorch state dict of the paper's model implies."""
    missing = [
        k for k in ("token_emb.weight", "pos_emb.weight", "layers.0.mlp.0.weight") if k not in state
    ]
    if missing:
        raise ValueError(f"state dict is missing keys {missing}; is it the paper's model?")
    num_layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("layers."))
    vocab, embed = state["token_emb.weight"].shape
    return model_lib.ModelConfig(
        vocab_size=int(vocab),
        embed_dim=int(embed),
        num_layers=num_layers,
        num_heads=num_heads,
        mlp_dim=int(state["layers.0.mlp.0.weight"].shape[0]),
        max_len=int(state["pos_emb.weight"].shape[0]),
    )


def _dense(state, name):
    # PyTorch Linear stores weight as (out, in): y = x @ W.T + b.
    return {"kernel": state[f"{name}.weight"].T, "bias": state[f"{name}.bias"]}


def params_from_state_dict(state: dict[str, np.ndarray], cfg: model_lib.ModelConfig) -> dict:
    expected = _expected_keys(cfg.num_layers)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"state dict keys differ: missing {missing}, unexpected {unexpected}")
    params = {
        "token_emb": {"embedding": state["token_emb.weight"]},
        "pos_emb": {"embedding": state["pos_emb.weight"]},
        "head": _dense(state, "out_proj"),
    }
    for i in range(cfg.num_layers):
        p = f"layers.{i}"
        params[f"layers_{i}"] = {
            "ln1": {"scale": state[f"{p}.ln1.weight"]},
            "ln2": {"scale": state[f"{p}.ln2.weight"]},
            "attn": {
                name: _dense(state, f"{p}.attn.{torch_name}")
                for name, torch_name in (
                    ("query", "W_q"),
                    ("key", "W_k"),
                    ("value", "W_v"),
                    ("out", "out_proj"),
                )
            },
            "mlp": {"hidden": _dense(state, f"{p}.mlp.0"), "output": _dense(state, f"{p}.mlp.2")},
        }
    _check_shapes(params, cfg)
    return params


def _check_shapes(params, cfg):
    module = model_lib.Transformer(cfg)
    like = jax.eval_shape(lambda: model_lib.init_params(module, jax.random.PRNGKey(0)))
    flat_like = dict(jax.tree_util.tree_leaves_with_path(like))
    wrong = [
        f"{jax.tree_util.keystr(path)}: expected {flat_like[path].shape}, got {leaf.shape}"
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
        if flat_like[path].shape != leaf.shape
    ]
    if wrong:
        raise ValueError("state dict shapes do not fit the model: " + "; ".join(wrong))


def import_reference(path: str | os.PathLike, num_heads: int):
    """(module, params) of a checkpoint released with the paper (.npz or PyTorch .pt)."""
    path = Path(path)
    if not path.is_file():
        raise checks.path_error(
            path, f"path must be an existing checkpoint file, got {str(path)!r}"
        )
    state = {k: np.asarray(v, np.float32) for k, v in read_state_dict(path).items()}
    cfg = config_from_state_dict(state, num_heads)
    return model_lib.Transformer(cfg), params_from_state_dict(state, cfg)
