"""The packed training and held-out streams of a split, built from token shards one
shard at a time into `.npy` files beside them and read back memory-mapped, so a corpus
larger than memory trains with the pages it touches (the in-memory path of
`beyondpar.lm.packing` gives the same arrays for small corpora).

`<shards>/split-<heldout_fraction>/` holds `train.npy`, `heldout.npy` and `split.json`
(the counts), each written atomically and `split.json` last: present means whole.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from beyondpar.base import files
from beyondpar.lm import packing, shards

SPLIT_FILE = "split.json"


@dataclasses.dataclass(frozen=True)
class Streams:
    train: np.ndarray
    heldout: np.ndarray
    train_documents: int
    heldout_documents: int
    heldout_bytes: int  # UTF-8 bytes of the held-out documents, one per separator


def in_memory(docs: shards.Tokenized, fraction: float, eos_id: int) -> Streams:
    held = packing.heldout_mask(docs.keys, fraction)
    return Streams(
        train=packing.pack(docs, ~held, eos_id),
        heldout=packing.pack(docs, held, eos_id),
        train_documents=int((~held).sum()),
        heldout_documents=int(held.sum()),
        heldout_bytes=int(docs.num_bytes[held].sum() + held.sum()),
    )


def split_folder(shard_folder: Path, fraction: float) -> Path:
    return Path(shard_folder) / f"split-{fraction!r}"


def on_disk(shard_folder: Path, index: dict, fraction: float) -> Streams:
    """The split's streams, memory-mapped; built first when absent."""
    folder = split_folder(shard_folder, fraction)
    if not (folder / SPLIT_FILE).is_file():
        _build(shard_folder, index, fraction, folder)
    counts = files.read_json(folder / SPLIT_FILE)
    return Streams(
        train=np.load(folder / "train.npy", mmap_mode="r"),
        heldout=np.load(folder / "heldout.npy", mmap_mode="r"),
        **counts,
    )


def _build(shard_folder: Path, index: dict, fraction: float, folder: Path) -> None:
    for stale in folder.glob(".*.npy"):  # temporary files of a killed build
        stale.unlink(missing_ok=True)
    metas = [shards.read_meta(shard_folder, i) for i in range(index["num_shards"])]
    lengths = np.concatenate([np.asarray(m["lengths"], np.int64) for m in metas])
    keys = np.concatenate([np.asarray(m["keys"], np.uint64) for m in metas])
    num_bytes = np.concatenate([np.asarray(m["num_bytes"], np.int64) for m in metas])
    held = packing.heldout_mask(keys, fraction)
    dtype = shards.token_dtype(index["vocab_size"])
    for name, keep in (("train", ~held), ("heldout", held)):
        size = int(lengths[keep].sum() + keep.sum())
        with files.atomic_path(folder / f"{name}.npy") as tmp:
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(size,))
            _fill(out, shard_folder, metas, keep, index["eos_id"])
            out.flush()
            del out
    counts = {
        "train_documents": int((~held).sum()),
        "heldout_documents": int(held.sum()),
        "heldout_bytes": int(num_bytes[held].sum() + held.sum()),
    }
    files.write_json(folder / SPLIT_FILE, counts)


def _fill(out: np.ndarray, shard_folder: Path, metas: list[dict], keep: np.ndarray, eos: int):
    """Pack the kept documents shard by shard into `out` (one shard in memory at once)."""
    at, first = 0, 0
    for i, meta in enumerate(metas):
        count = len(meta["lengths"])
        part = shards.read_shard(shard_folder, i)
        packed = packing.pack(part, keep[first : first + count], eos)
        out[at : at + len(packed)] = packed
        at, first = at + len(packed), first + count
