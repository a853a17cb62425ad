"""Make the tiny Hugging Face fixtures under tests/data/hf, or check the committed ones.

Each fixture is a folder as `save_pretrained` writes it (config.json,
generation_config.json, model.safetensors) with random weights drawn from a seed, plus
tokenizer.json, fixture.json (the versions that made it) and expected.npz: the text, its
token ids (2 x 64: the ids, then the same ids reversed), and the logits (B x T x V) and
eager attention of every layer (B x L x H x T x T) that transformers computes for them in
float64 (see `Spec.upcast` for two exceptions), stored as float32. What each fixture is
lives in `hf_specs.py`.

torch and transformers are never dependencies of the project: run this in a scratch
environment, from the repository root:

    python3 -m venv /tmp/hfenv
    /tmp/hfenv/bin/pip install torch transformers safetensors numpy

(torch's CPU-only build is enough and much smaller: install it first, from its CPU wheel
index or a local `torch-*+cpu` wheel.)

    /tmp/hfenv/bin/python tests/fixture_scripts/make_hf_fixtures.py --check
    /tmp/hfenv/bin/python tests/fixture_scripts/make_hf_fixtures.py llama-tiny --out /tmp/hf
    /tmp/hfenv/bin/python tests/fixture_scripts/make_hf_fixtures.py NEW-NAME --out tests/data/hf

`--check` proves the committed fixtures are what this script makes from their weights:
it loads each committed folder into transformers, recomputes expected.npz and compares it
(float arrays to --rtol/--atol, the rest exactly); and it makes the fixture afresh from
its spec in a temporary folder and compares everything but the weights' values (configs,
tokenizer.json, tensor names, shapes and dtypes, the text and tokens). The committed
weights were drawn before this script existed, by laws that `hf_specs` reconstructs from
their statistics but from unknown seeds: a remade fixture has new weights and so new
expected outputs, and the parity tests pass on it all the same, since they compare the
project's model with transformers on the same weights (a tolerance set from the float32
error of the committed weights may need a look).
"""

import argparse
import copy
import json
import shutil
import struct
import sys
import tempfile
import zlib
from pathlib import Path

import hf_specs
import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig
from transformers.pytorch_utils import Conv1D

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
# Tensors of a model beside the text model (Gemma 3's vision tower and its projector).
SIDE = ("vision_tower", "multi_modal_projector")
EMBEDDINGS = ("embed_tokens", "wte", "wpe", "embed_in", "lm_head", "embed_out")
FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "fixture.json",
    "expected.npz",
)


def make_tokenizer() -> Tokenizer:
    """The byte-level BPE every fixture has: 300 ids trained on `TOKENIZER_CORPUS`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=hf_specs.VOCAB_SIZE,
        special_tokens=[hf_specs.SPECIAL_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(hf_specs.TOKENIZER_CORPUS), trainer)
    return tokenizer


def head_dim(text) -> int:
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def qk_mask(leaf: str, shape, text) -> torch.Tensor | None:
    """Which entries of a projection's weight or bias belong to queries and keys (True),
    or None for a tensor that has none. Fused projections lay them out per family: Phi-3's
    rows q, k, v; GPT-2's columns q, k, v (its Conv1D is in x out); GPT-NeoX's rows per
    head, q, k, v."""
    if leaf in ("q_proj", "k_proj"):
        return torch.ones(shape, dtype=torch.bool)
    d, heads = head_dim(text), text.num_attention_heads
    mask = torch.zeros(shape, dtype=torch.bool)
    if leaf == "qkv_proj":
        kv = getattr(text, "num_key_value_heads", None) or heads
        mask[: (heads + kv) * d] = True
    elif leaf == "c_attn":
        mask[..., : 2 * heads * d] = True
    elif leaf == "query_key_value":
        mask.view(heads, 3, -1)[:, :2] = True
    else:
        return None
    return mask


def is_gemma_norm(module) -> bool:
    """Gemma's RMS norms scale by 1 + w: the stored weight is the scale minus 1."""
    kind = type(module).__name__
    return kind.startswith("Gemma") and kind.endswith("RMSNorm")


def weight_law(name: str, module, shape, text, init: hf_specs.Init):
    """(mean, std) of the normal law of one tensor; std may be a tensor (fused q/k/v)."""
    owner, _, kind = name.rpartition(".")
    leaf = owner.rpartition(".")[2]
    if any(side in name for side in SIDE):
        return 0.0, init.side_std
    if "norm" in leaf or leaf.startswith("ln_"):
        if kind == "bias":
            return init.norm_bias or (0.0, init.bias_std)
        qk = init.qk_norm is not None and leaf in ("q_norm", "k_norm")
        mean, std = init.qk_norm if qk else init.norm
        return mean - float(is_gemma_norm(module)), std
    if kind == "bias":
        return 0.0, init.bias_std
    if leaf in EMBEDDINGS:
        return 0.0, init.embed_std
    if len(shape) < 2:
        raise ValueError(f"no law for tensor {name} of shape {tuple(shape)}: add one here")
    fan_in = shape[0] if isinstance(module, Conv1D) else int(np.prod(shape[1:]))
    std = init.matrix_std or fan_in**-0.5
    qk_std = init.qk_std or init.qk_gain * fan_in**-0.5
    mask = qk_mask(leaf, shape, text)
    if mask is None:
        return 0.0, std
    return 0.0, torch.where(mask, qk_std, std)


def draw_weights(model, init: hf_specs.Init, seed: int) -> None:
    """Every parameter drawn from one generator in the model's order (tied ones once)."""
    text = model.config.get_text_config()
    modules = dict(model.named_modules())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            mean, std = weight_law(name, modules[name.rpartition(".")[0]], param.shape, text, init)
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            param.copy_(noise * std + mean)


def write_json(path: Path, data: dict) -> None:
    """As transformers writes a config: sorted keys, indent 2, a final newline."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def build_model(spec: hf_specs.Spec, folder: Path):
    """The spec's model in float32, built as transformers builds it from the config."""
    if spec.written is not None:
        write_json(folder / "config.json", spec.written)
        config = AutoConfig.from_pretrained(folder)
    else:
        config = AutoConfig.for_model(**copy.deepcopy(spec.config))
    return getattr(transformers, config.architectures[0])(config)


def write_config(spec: hf_specs.Spec, folder: Path) -> None:
    """Replace or edit the config.json that save_pretrained wrote, as the spec says."""
    if spec.written is not None:
        write_json(folder / "config.json", spec.written)
    elif spec.edit:
        data = json.loads((folder / "config.json").read_text())
        for key, value in spec.edit.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        write_json(folder / "config.json", data)


def seed_of(name: str, offset: int = 0) -> int:
    return zlib.crc32(name.encode()) + offset


def make(name: str, spec: hf_specs.Spec, folder: Path, seed: int) -> Path:
    """Write one fixture folder: weights, configs, tokenizer, versions, expected outputs."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    model = build_model(spec, folder)
    draw_weights(model, spec.init, seed)
    model.save_pretrained(folder)
    write_config(spec, folder)
    make_tokenizer().save(str(folder / "tokenizer.json"))
    versions = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokens": hf_specs.TOKENS,
    }
    (folder / "fixture.json").write_text(json.dumps(versions, indent=1) + "\n")
    np.savez(folder / "expected.npz", **expected_outputs(folder, spec))
    return folder


def load(folder: Path, upcast: bool = False):
    """A fixture as transformers reads it, in float64 with eager attention (with
    `upcast`: read in float32, then converted by `.double()`)."""
    config = AutoConfig.from_pretrained(folder)
    cls = getattr(transformers, config.architectures[0])
    if upcast:
        return cls.from_pretrained(folder, attn_implementation="eager").double().eval()
    return cls.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager").eval()


def forward(model, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Logits (B x T x V) and the attention of every layer (B x L x H x T x T), float32."""
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(tokens), output_attentions=True)
    attention = torch.stack(out.attentions, dim=1)
    return out.logits.float().numpy(), attention.float().numpy()


def token_rows(folder: Path) -> np.ndarray:
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(hf_specs.TEXT).ids
    ids = ids[: hf_specs.TOKENS]
    return np.array([ids, ids[::-1]], dtype=np.int64)


def expected_outputs(folder: Path, spec: hf_specs.Spec) -> dict:
    """expected.npz's arrays, in its order: text, tokens, logits, attention, then the
    same three suffixed `_N` for each shorter length N (one fresh model per length, so
    that no rope state carries over from the longer run)."""
    tokens = token_rows(folder)
    out = {"text": np.array(hf_specs.TEXT), "tokens": tokens}
    out["logits"], out["attention"] = forward(load(folder, spec.upcast), tokens)
    for n in spec.short:
        part = np.ascontiguousarray(tokens[:, :n])
        out[f"tokens_{n}"] = part
        out[f"logits_{n}"], out[f"attention_{n}"] = forward(load(folder, spec.upcast), part)
    return out


def tensor_layout(path: Path) -> dict:
    """A safetensors file's header: every tensor's dtype and shape, and its metadata."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return {k: v if k == "__metadata__" else (v["dtype"], v["shape"]) for k, v in header.items()}


def json_without_version(path: Path) -> dict:
    data = json.loads(path.read_text())
    data.pop("transformers_version", None)
    return data


def layout_diffs(made: Path, committed: Path) -> list[str]:
    """What differs between a fixture made afresh and the committed one, weights' values
    and the arrays computed from them aside."""
    diffs = []
    names = sorted(p.name for p in committed.iterdir())
    if names != sorted(FILES):
        diffs.append(f"files {names}, want {sorted(FILES)}")
    for name in ("config.json", "generation_config.json"):
        if json_without_version(made / name) != json_without_version(committed / name):
            diffs.append(f"{name} is not what the spec makes")
    if (made / "tokenizer.json").read_bytes() != (committed / "tokenizer.json").read_bytes():
        diffs.append("tokenizer.json is not what make_tokenizer trains")
    if tensor_layout(made / "model.safetensors") != tensor_layout(committed / "model.safetensors"):
        diffs.append("model.safetensors holds other tensor names, shapes or dtypes")
    fixture = json.loads((committed / "fixture.json").read_text())
    if fixture.get("tokens") != hf_specs.TOKENS:
        diffs.append(f"fixture.json tokens {fixture.get('tokens')}, want {hf_specs.TOKENS}")
    mine, theirs = np.load(made / "expected.npz"), np.load(committed / "expected.npz")
    if mine.files != theirs.files:
        diffs.append(f"expected.npz keys {theirs.files}, want {mine.files}")
    for key in set(mine.files) & set(theirs.files):
        a, b = mine[key], theirs[key]
        if a.dtype != b.dtype or a.shape != b.shape:
            diffs.append(f"expected.npz {key}: {b.dtype}{b.shape}, want {a.dtype}{a.shape}")
        elif not key.startswith(("logits", "attention")) and not np.array_equal(a, b):
            diffs.append(f"expected.npz {key} differs")
    return diffs


def output_diffs(committed: Path, spec: hf_specs.Spec, rtol: float, atol: float):
    """Recompute expected.npz from the committed weights; return the largest absolute
    difference of each float array and what fails."""
    want = dict(np.load(committed / "expected.npz"))
    got = expected_outputs(committed, spec)
    worst, fails = {}, []
    for key, value in got.items():
        if key not in want:
            fails.append(f"expected.npz lacks {key}")
        elif value.dtype.kind != "f":
            if not np.array_equal(value, want[key]):
                fails.append(f"{key} differs")
        elif value.shape != want[key].shape:
            fails.append(f"{key} shape {want[key].shape}, recomputed {value.shape}")
        else:
            worst[key] = float(np.abs(value - want[key]).max())
            if not np.allclose(value, want[key], rtol=rtol, atol=atol):
                fails.append(f"{key} off by up to {worst[key]:.3g}")
    return worst, fails


def check(name: str, spec: hf_specs.Spec, hf: Path, rtol: float, atol: float) -> bool:
    """Check one committed fixture and print one line on it."""
    committed = hf / name
    with tempfile.TemporaryDirectory() as tmp:
        made = make(name, spec, Path(tmp) / name, seed_of(name))
        fails = layout_diffs(made, committed)
    worst, output_fails = output_diffs(committed, spec, rtol, atol)
    fails += output_fails
    versions = json.loads((committed / "fixture.json").read_text())
    shown = ", ".join(f"{k} {v:.3g}" if v else f"{k} exact" for k, v in worst.items())
    made_with = f"made with transformers {versions.get('transformers')}"
    verdict = "ok" if not fails else "FAIL: " + "; ".join(fails)
    print(f"{name}: {verdict} ({shown}; {made_with})", flush=True)
    return not fails


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="fixtures (default: every spec)")
    parser.add_argument("--check", action="store_true", help="check the committed fixtures")
    parser.add_argument("--out", type=Path, help="where to make fixtures (NAME/ under it)")
    parser.add_argument("--hf", type=Path, default=HF, help="the committed fixtures")
    parser.add_argument("--seed", type=int, default=0, help="added to each name's seed")
    parser.add_argument("--rtol", type=float, default=1e-6)
    parser.add_argument("--atol", type=float, default=1e-6)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(hf_specs.SPECS))
    if unknown:
        parser.error(f"no spec for {unknown}: add one to hf_specs.SPECS")
    if not args.check and args.out is None:
        parser.error("give --out DIR to make fixtures (tests/data/hf to replace them)")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    names = args.names or list(hf_specs.SPECS)
    if args.check:
        passed = [check(n, hf_specs.SPECS[n], args.hf, args.rtol, args.atol) for n in names]
        print(f"{sum(passed)} of {len(passed)} fixtures match")
        return 0 if all(passed) else 1
    for name in names:
        folder = make(name, hf_specs.SPECS[name], args.out / name, seed_of(name, args.seed))
        print(f"made {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
