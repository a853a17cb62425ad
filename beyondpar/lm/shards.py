"""A corpus tokenized once into shards on disk, and read back.

A shard folder holds `index.json` (the tokenizer and corpus it was made from, by name and
fingerprint) and, per shard of `shard_documents` documents, `shard_NNNNN.npy` (the
documents' tokens end to end, no separators) and `shard_NNNNN.json` (per document: its
token count, its UTF-8 byte count and its split key). Each file is written atomically and
a shard's .json last, so a shard counts only once it is whole: after a kill (even -9) a
rerun keeps the finished shards, skips their documents and redoes the rest. A folder
made from another tokenizer or corpus is refused, never mixed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import itertools
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import tqdm

from beyondpar.base import checks, files
from beyondpar.lm import corpus, tokenizer

INDEX = corpus.SHARD_INDEX
FORMAT_VERSION = 1
SHARD_DOCUMENTS = 1024
LOCK_FILE = ".lock"


@dataclasses.dataclass(frozen=True)
class Tokenized:
    """Documents as tokens: `tokens` end to end, and per document its token count, its
    UTF-8 byte count and its split key (from a hash of its text: the held-out split
    does not depend on the tokenizer)."""

    tokens: np.ndarray
    lengths: np.ndarray
    num_bytes: np.ndarray
    keys: np.ndarray  # uint64

    @property
    def num_documents(self) -> int:
        return len(self.lengths)


def token_dtype(vocab_size: int):
    """The smallest unsigned dtype that holds every id (bytes: one byte a token)."""
    return np.uint8 if vocab_size <= 256 else np.uint16 if vocab_size <= 65536 else np.uint32


def split_key(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


def tokenize(docs: Iterable[corpus.Document], tok) -> Tokenized:
    """Documents -> `Tokenized`, in memory."""
    docs = list(docs)
    ids = tok.encode_batch([d.text for d in docs])
    dtype = token_dtype(tok.vocab_size)
    return Tokenized(
        tokens=np.concatenate([np.zeros(0, dtype), *(i.astype(dtype) for i in ids)]),
        lengths=np.asarray([len(i) for i in ids], np.int64),
        num_bytes=np.asarray([len(d.text.encode("utf-8")) for d in docs], np.int64),
        keys=np.asarray([split_key(d.text) for d in docs], np.uint64),
    )


def concatenate(parts: list[Tokenized]) -> Tokenized:
    fields = ("tokens", "lengths", "num_bytes", "keys")
    return Tokenized(**{f: np.concatenate([getattr(p, f) for p in parts]) for f in fields})


def describe(tok, path: str, fmt: str, text_field: str, shard_documents: int) -> dict:
    """What `index.json` records of the tokenizer and the corpus."""
    return {
        "format_version": FORMAT_VERSION,
        "tokenizer": tok.name,
        "tokenizer_fingerprint": tok.fingerprint,
        "vocab_size": int(tok.vocab_size),
        "eos_id": int(tok.eos_id),
        "corpus": path or "(default: Python standard library)",
        "corpus_format": corpus.resolve_format(path, fmt),
        "text_field": text_field,
        "corpus_fingerprint": corpus.fingerprint(path, fmt, text_field),
        "shard_documents": int(shard_documents),
    }


# index field -> (what differs, the field that names it to a person)
_MUST_MATCH = {
    "tokenizer_fingerprint": ("tokenizer", "tokenizer"),
    "corpus_fingerprint": ("corpus", "corpus"),
    "shard_documents": ("shard size", "shard_documents"),
    "format_version": ("format", "format_version"),
}


def check_index(out: Path, wanted: dict) -> dict:
    """The folder's index; refused in one line when it was made from another tokenizer,
    corpus (or the same path with other contents), shard size or format."""
    found = files.read_json(out / INDEX)
    for field, (what, name) in _MUST_MATCH.items():
        if found.get(field) != wanted[field]:
            expected, got = wanted[name], found.get(name)
            if expected == got:  # same name, other contents: show the fingerprints
                expected = f"{expected} ({str(wanted[field])[:12]})"
                got = f"{got} ({str(found.get(field))[:12]})"
            raise ValueError(
                f"{out} holds token shards of another {what}: expected {name} {expected!r}, "
                f"got {got!r}; use another output folder or the shards' own {name}"
            )
    return found


def shard_name(index: int) -> str:
    return f"shard_{index:05d}"


@contextlib.contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """Hold the folder's lock, waiting for another process that holds it (the processes
    of a multi-host run all load: the first tokenizes, the others then find it done).
    The kernel releases it when the holder dies, even on kill -9."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write(
    path: str,
    fmt: str,
    text_field: str,
    tok,
    out,
    shard_documents: int = SHARD_DOCUMENTS,
    progress: bool = True,
) -> Path:
    """Tokenize the corpus at `path` into shards in `out` (resuming a killed run); the
    finished folder's path. An empty corpus writes nothing and is refused."""
    out = Path(out).expanduser()
    checks.positive_int("shard_documents", shard_documents)
    wanted = describe(tok, path, fmt, text_field, shard_documents)
    if (out / INDEX).is_file() and check_index(out, wanted).get("complete"):
        return out
    docs = corpus.documents(path, fmt, text_field)
    first = next(docs, None)
    if first is None:
        raise ValueError(
            f"data.path {path!r} must hold at least one document, got none (empty corpus)"
        )
    created = not out.exists()
    with exclusive(out):
        if (out / INDEX).is_file() and check_index(out, wanted).get("complete"):
            return out  # another process finished it while this one waited
        _remove_partial(out)
        if not (out / INDEX).is_file():
            files.write_json(out / INDEX, {**wanted, "complete": False})
        try:
            docs = itertools.chain([first], docs)
            total = corpus.count_hint(path, fmt)
            totals = _write_shards(docs, tok, out, shard_documents, progress, total)
        except ValueError:
            if created:  # bad input found part way: leave no folder that looks resumable
                shutil.rmtree(out, ignore_errors=True)
            raise
        files.write_json(out / INDEX, {**wanted, **totals, "complete": True})
    return out


def _remove_partial(out: Path) -> None:
    """Temporary files of a killed writer, and a shard's tokens without its .json."""
    for stale in out.glob(".shard_*"):
        stale.unlink(missing_ok=True)
    for npy in out.glob("shard_*.npy"):
        if not npy.with_suffix(".json").is_file():
            npy.unlink(missing_ok=True)


def _write_shards(docs, tok, out: Path, shard_documents: int, progress: bool, total=None) -> dict:
    counts = {"num_shards": 0, "documents": 0, "tokens": 0}
    bar = tqdm.tqdm(desc="tokenizing", unit="doc", total=total, disable=not progress)
    with bar:
        for index in itertools.count():
            batch = list(itertools.islice(docs, shard_documents))
            if not batch:
                break
            name = shard_name(index)
            meta_path = out / f"{name}.json"
            if meta_path.is_file():
                meta = files.read_json(meta_path)
            else:
                meta = _write_shard(batch, tok, out / f"{name}.npy", meta_path)
            counts["num_shards"] += 1
            counts["documents"] += len(batch)
            counts["tokens"] += int(sum(meta["lengths"]))
            bar.update(len(batch))
    return counts


def _write_shard(batch, tok, npy_path: Path, meta_path: Path) -> dict:
    part = tokenize(batch, tok)
    with files.atomic_path(npy_path) as tmp:
        np.save(tmp, part.tokens)
    meta = {
        "documents": [d.source for d in batch],
        "lengths": part.lengths.tolist(),
        "num_bytes": part.num_bytes.tolist(),
        "keys": [int(k) for k in part.keys],
    }
    files.write_json(meta_path, meta)
    return meta


def read_index(out, tok=None) -> dict:
    """The index of a finished shard folder; with `tok`, refused unless the shards were
    made by that tokenizer."""
    out = Path(out).expanduser()
    if not (out / INDEX).is_file():
        raise checks.path_error(
            out, f"data.path {out} must be a token shard folder holding {INDEX}, got none"
        )
    index = files.read_json(out / INDEX)
    if not index.get("complete"):
        raise ValueError(
            f"data.path {out} must hold finished token shards, got unfinished ones "
            "(rerun launch/tokenize.py to finish them)"
        )
    if tok is not None and index.get("tokenizer_fingerprint") != tok.fingerprint:
        raise ValueError(
            f"data.tokenizer must be the tokenizer the shards in {out} were made with, "
            f"{index.get('tokenizer')!r}, got {tok.name!r}"
        )
    return index


def read(out, tok=None) -> tuple[dict, Tokenized]:
    """(index, every document's tokens) of a finished shard folder, in memory."""
    index = read_index(out, tok)
    parts = [read_shard(Path(out).expanduser(), i) for i in range(index["num_shards"])]
    return index, concatenate(parts)


def read_meta(out: Path, index: int) -> dict:
    return files.read_json(out / f"{shard_name(index)}.json")


def read_shard(out: Path, index: int) -> Tokenized:
    """One shard's documents; its tokens memory-mapped."""
    name = shard_name(index)
    meta = read_meta(out, index)
    tokens = np.load(out / f"{name}.npy", mmap_mode="r")
    lengths = np.asarray(meta["lengths"], np.int64)
    if len(tokens) != lengths.sum():
        raise ValueError(
            f"token shard {out / name}.npy must hold {lengths.sum()} tokens, got {len(tokens)}"
        )
    num_bytes = np.asarray(meta["num_bytes"], np.int64)
    return Tokenized(tokens, lengths, num_bytes, np.asarray(meta["keys"], np.uint64))


def summary(out) -> str:
    """One line on a finished shard folder."""
    index = files.read_json(Path(out) / INDEX)
    return (
        f"{out}: {index['tokens']} tokens of {index['documents']} documents in "
        f"{index['num_shards']} shard(s), tokenizer {index['tokenizer']} "
        f"(vocabulary {index['vocab_size']})"
    )


def tokenize_corpus(
    path: str,
    tokenizer_spec: str,
    out,
    fmt: str = "auto",
    text_field: str = "text",
    shard_documents: int = SHARD_DOCUMENTS,
    progress: bool = True,
) -> str:
    """`launch/tokenize.py`: the corpus at `path` into shards in `out` by the tokenizer
    `tokenizer_spec` ("bytes", a tokenizer.json or a .gguf file); one line on the result."""
    tok = tokenizer.load(tokenizer_spec)
    return summary(write(path, fmt, text_field, tok, out, shard_documents, progress))
