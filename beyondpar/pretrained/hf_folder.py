"""Hugging Face checkpoint folders on disk: cache lookup, config.json, safetensors shards,
tokenizer.json.

Nothing is downloaded. A model name is looked up in the local Hugging Face cache, laid
out as `models--org--name/refs/main` (a commit hash) -> `snapshots/<hash>/`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from pathlib import Path

import numpy as np

from beyondpar.base import checks, files

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
_NAME = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def hub_cache() -> Path:
    """$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def package_file(package: str, name: str) -> Path | None:
    """A data file shipped inside an installed Python package (e.g. a GGUF model), or None
    when the package or the file is absent. The package is located, never imported."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / name
    return path if path.is_file() else None


def resolve(path_or_name: str | os.PathLike) -> Path:
    """The checkpoint folder of a path, or of a model name in the local cache."""
    path = Path(path_or_name).expanduser()
    if path.is_dir():
        return path
    name = str(path_or_name)
    if path.exists() or not _NAME.match(name):
        raise checks.path_error(
            path,
            f"path_or_name must be a checkpoint folder, a GGUF file or a model name, got {name!r}",
        )
    repo = hub_cache() / f"models--{name.replace('/', '--')}"
    ref = repo / "refs" / "main"
    snapshot = repo / "snapshots" / ref.read_text().strip() if ref.is_file() else None
    if snapshot is None or not snapshot.is_dir():
        raise checks.MissingPathError(
            f"model {name!r} is neither a folder nor in the local Hugging Face cache: looked for "
            f"{ref} -> {repo / 'snapshots'}/<hash>/ (cache set by HF_HUB_CACHE or HF_HOME); "
            "nothing is downloaded, see the README for getting weights into the cache"
        )
    return snapshot


def read_config(folder: Path) -> dict:
    path = folder / CONFIG
    if not path.is_file():
        raise checks.path_error(path, f"checkpoint folder must hold {CONFIG}, got none in {folder}")
    return files.read_json(path)


def shard_files(folder: Path) -> dict[str, Path]:
    """tensor name -> file holding it: one model.safetensors or the shards of the index."""
    index = folder / INDEX
    if index.is_file():
        weight_map = files.read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} must map tensor names to files under 'weight_map'")
        shards = {name: folder / file for name, file in weight_map.items()}
        missing = sorted({str(p.name) for p in shards.values() if not p.is_file()})
        if missing:
            raise checks.MissingPathError(
                f"{INDEX} in {folder} lists shards that are absent: {missing}"
            )
        return shards
    single = folder / WEIGHTS
    if not single.is_file():
        raise checks.path_error(
            single,
            f"checkpoint folder must hold {WEIGHTS} or {INDEX} with its shards, "
            f"got neither in {folder}",
        )
    with _open_safetensors(single) as f:
        return {name: single for name in f.keys()}  # noqa: SIM118 - not a dict


class Safetensors:
    """The tensors of a checkpoint's safetensors files, read by name: each file opened
    once (and closed on exit), one tensor at a time (`workers` = 1)."""

    workers = 1

    def __init__(self, shards: dict[str, Path]):
        self.shards = shards
        self._open: dict[Path, object] = {}  # path -> open safetensors handle
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def tensor(self, name: str) -> np.ndarray:
        path = self.shards[name]
        if path not in self._open:
            self._open[path] = self._stack.enter_context(_open_safetensors(path))
        try:
            return self._open[path].get_tensor(name)
        except Exception as err:  # safetensors raises its own error types
            message = f"weights file {path}: tensor {name!r} cannot be read: {err}"
            raise ValueError(message) from err

    def read(self, name: str, transpose: bool, dtype=None, order=None) -> np.ndarray:
        """The tensor as the model wants it: rows taken in `order` when given (a family's
        own layout of a fused tensor), transposed when asked (a view), cast to `dtype`
        when given, else in its stored dtype."""
        array = self.tensor(name)
        if order is not None:
            check_rows(name, order, array.shape[0])
            array = array[order]
        array = array.T if transpose else array
        return array if dtype is None else array.astype(dtype, copy=False)


def check_rows(name: str, order, rows: int) -> None:
    """A row order must name every row of the stored tensor."""
    if len(order) != rows:
        raise ValueError(f"tensor {name!r} must have {len(order)} rows, got {rows}")


@contextlib.contextmanager
def _open_safetensors(path: Path):
    from safetensors import safe_open

    try:
        handle = safe_open(path, framework="numpy")
    except Exception as err:  # SafetensorError, OSError: a cut or overwritten file
        message = f"weights file {path} cannot be read (damaged or cut short?): {err}"
        raise ValueError(message) from err
    with handle as f:
        yield f


def read_tokenizer(folder: Path):
    path = folder / TOKENIZER
    if not path.is_file():
        raise checks.path_error(
            path, f"checkpoint folder must hold {TOKENIZER}, got none in {folder}"
        )
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on bad JSON
        raise ValueError(f"{path} is not a valid tokenizer file: {err}") from err
