"""A corpus on disk -> documents -> windows of exactly T tokens, in a stated order.

A corpus is a `.txt` file (documents separated by blank lines), a `.jsonl` file (a `text`
field per line) or a folder of `.txt` files (one document each, in name order). Every
document is cut into consecutive windows of T tokens; a shorter tail is dropped and
counted, never silently. Bad input is a ValueError naming the file, line or flag.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np

from beyondpar.base import checks, files

_BLANK_LINES = re.compile(r"\n[ \t]*\n")


@dataclasses.dataclass(frozen=True)
class Document:
    source: str  # file, or file:line for .jsonl
    text: str


@dataclasses.dataclass(frozen=True)
class Windows:
    """Token windows (W, T) with where each came from and what was left out."""

    tokens: np.ndarray
    document: np.ndarray  # (W,) index of the source document
    num_documents: int
    documents_used: int
    dropped_tail_tokens: int
    short_documents: int  # documents shorter than one window
    total_windows: int  # before --max_windows
    sources: list[str]

    @property
    def position(self) -> np.ndarray:
        """(W,) each window's place among its document's windows: 0, 1, ..."""
        return positions(self.document)


def positions(document_W) -> np.ndarray:
    """Each window's place in its document (0 for its first window), for windows cut
    document by document, so that a document's windows follow each other."""
    document_W = np.asarray(document_W)
    first = np.r_[True, document_W[1:] != document_W[:-1]] if len(document_W) else []
    starts = np.flatnonzero(first)
    return np.arange(len(document_W)) - np.repeat(starts, np.diff(np.r_[starts, len(document_W)]))


def _corpus_path(path: str | os.PathLike) -> Path:
    """`path` expanded, refused unless it is a file or a folder (named as the flag)."""
    path = Path(path).expanduser()
    if not (path.is_dir() or path.is_file()):
        raise checks.path_error(path, f"--corpus {path} is neither a file nor a folder")
    return path


def read_documents(path: str | os.PathLike) -> list[Document]:
    """The documents of a corpus path, in file order (folders: files sorted by name)."""
    path = _corpus_path(path)
    if path.is_dir():
        found = _folder_files(path)
        if not found:
            raise ValueError(f"--corpus folder {path} holds no .txt file")
        docs = [Document(str(p), files.read_utf8(p, "--corpus")) for p in found]
    elif path.suffix == ".jsonl":
        docs = _jsonl_documents(path)
    elif path.suffix == ".txt":
        parts = _BLANK_LINES.split(files.read_utf8(path, "--corpus"))
        docs = [Document(str(path), part) for part in parts]
    else:
        raise ValueError(
            f"--corpus must be a .txt file, a .jsonl file or a folder of .txt files, got {path}"
        )
    docs = [d for d in docs if d.text.strip()]
    if not docs:
        raise ValueError(f"--corpus {path} holds no document (it is empty)")
    return docs


def _folder_files(folder: Path) -> list[Path]:
    """A corpus folder's documents: its .txt files (not folders named so), by name."""
    return sorted(p for p in folder.iterdir() if p.suffix == ".txt" and p.is_file())


def _jsonl_documents(path: Path) -> list[Document]:
    docs = []
    for number, line in enumerate(files.read_utf8(path, "--corpus").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"--corpus {path}:{number} is not JSON: {err.msg}") from err
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ValueError(f"--corpus {path}:{number} must be an object with a string 'text'")
        docs.append(Document(f"{path}:{number}", record["text"]))
    return docs


def fingerprint(path: str | os.PathLike) -> str:
    """SHA-256 over the corpus files' names and bytes: a changed corpus is another run."""
    path = _corpus_path(path)
    paths = _folder_files(path) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for p in paths:
        digest.update(p.name.encode() + b"\0" + p.read_bytes())
    return digest.hexdigest()


def make_windows(
    docs: list[Document], tokenizer, num_tokens: int, max_windows: int | None, context: int
) -> Windows:
    """Consecutive windows of `num_tokens` tokens, document by document; the first
    `max_windows` of them in that order."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 2:
        raise ValueError(f"--tokens must be an integer >= 2, got {num_tokens!r}")
    if num_tokens > context:
        raise ValueError(
            f"--tokens={num_tokens} is longer than the model's context of {context} tokens"
        )
    if max_windows is not None:
        max_windows = checks.positive_int("--max_windows", max_windows)
    rows, owner, dropped, short, longest = [], [], 0, 0, 0
    for index, doc in enumerate(docs):
        ids = tokenizer.encode(doc.text).ids
        longest = max(longest, len(ids))
        count = len(ids) // num_tokens
        short += count == 0
        dropped += len(ids) - count * num_tokens
        rows += [ids[k * num_tokens : (k + 1) * num_tokens] for k in range(count)]
        owner += [index] * count
    if not rows:
        raise ValueError(
            f"no document of the corpus is as long as --tokens={num_tokens} "
            f"(the longest has {longest} tokens)"
        )
    total = len(rows)
    keep = total if max_windows is None else min(max_windows, total)
    document = np.asarray(owner[:keep])
    return Windows(
        tokens=np.asarray(rows[:keep], np.int32),
        document=document,
        num_documents=len(docs),
        documents_used=len(set(document.tolist())),
        dropped_tail_tokens=dropped,
        short_documents=short,
        total_windows=total,
        sources=[d.source for d in docs],
    )
