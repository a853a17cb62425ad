"""A text corpus on disk -> documents (source, text), in a fixed order.

Formats (`data.format`; "auto" picks by the path):
- "text": a folder of text files, one document per file, every non-hidden file under it
  in order of relative path (`.jsonl` files in it are read as "jsonl"); or one text file,
  documents separated by blank lines.
- "jsonl": one JSON object per line, the document in its `text_field` (a folder: every
  file under it read so).
- "shards": a folder written by `launch/tokenize_corpus.py` (it holds `index.json`), read by
  `beyondpar.lm.shards`, not here.

The default corpus (`data.path` ""), real text on every Python 3.11 install, nothing to
download: the Python standard library's own files (PSF License Agreement, the licence of
CPython, https://docs.python.org/3/license.html), read from
`sysconfig.get_paths()["stdlib"]`:
1. every topic of `pydoc_data/topics.py` (the Language Reference's text that `help()`
   shows), one document per topic, in name order (about 0.74 MB on 3.11.7);
2. then the standard library's `.py` files, one document each, in order of relative path,
   leaving out the folders `test`, `tests`, `idle_test`, `site-packages`, `encodings`
   (generated codec tables) and `pydoc_data`, taken while the corpus stays within
   `DEFAULT_CAP_BYTES` (4 MiB = 4,194,304 UTF-8 bytes).
On CPython 3.11.7 that is 4,131,836 UTF-8 bytes in 295 documents (79 topics, then 216
files from `__future__.py` to `http/client.py`); another patch release has slightly other
files, so the corpus fingerprint and its cache folder name the Python version.

Bad input is one ValueError naming the file (and line), what it must be and what it is.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import json
import os
import re
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from beyondpar.base import checks, files

DEFAULT = ""
DEFAULT_CAP_BYTES = 4 * 2**20
FORMATS = ("auto", "text", "jsonl", "shards")
SHARD_INDEX = "index.json"
_SKIPPED = {"test", "tests", "idle_test", "site-packages", "encodings", "pydoc_data", "__pycache__"}
_BLANK_LINES = re.compile(r"\n[ \t]*\n")


@dataclasses.dataclass(frozen=True)
class Document:
    source: str  # file, file:line for JSON lines, pydoc_data/topics.py:<topic>
    text: str


def resolve_format(path: str, fmt: str) -> str:
    """The format of a corpus path: `fmt` itself unless it is "auto"."""
    checks.one_of("data.format", fmt, FORMATS)
    if path == DEFAULT:
        if fmt not in ("auto", "text"):
            raise ValueError(
                f"data.format must be 'auto' or 'text' for the default corpus, got {fmt!r}"
            )
        return "text"
    p = Path(path).expanduser()
    if not p.exists():
        raise checks.MissingPathError(
            f"data.path must be a corpus file or folder, got {path!r} (nothing there)"
        )
    if fmt != "auto":
        return fmt
    if p.is_dir():
        return "shards" if (p / SHARD_INDEX).is_file() else "text"
    return "jsonl" if p.suffix == ".jsonl" else "text"


def documents(path: str, fmt: str, text_field: str = "text") -> Iterator[Document]:
    """The documents of a corpus, lazily (a large corpus is never held whole)."""
    fmt = resolve_format(path, fmt)
    if path == DEFAULT:
        yield from default_documents()
        return
    p = Path(path).expanduser()
    if fmt == "shards":
        raise ValueError(
            f"data.path must be a text or JSON-lines corpus to tokenize, got {p}, "
            "a folder of token shards (already tokenized)"
        )
    yield from (d for d in _path_documents(p, fmt, text_field) if d.text)


def _path_documents(p: Path, fmt: str, text_field: str) -> Iterator[Document]:
    if p.is_dir():
        for file in folder_files(p):
            kind = "jsonl" if fmt == "jsonl" or file.suffix == ".jsonl" else "text"
            yield from _file_documents(file, kind, text_field, whole=True)
    else:
        yield from _file_documents(p, fmt, text_field, whole=False)


def count_hint(path: str, fmt: str) -> int | None:
    """How many documents a corpus holds, when that is known without reading it (a
    folder of text files, the default corpus): a progress bar's total."""
    if path == DEFAULT:
        return len(_default_documents())
    p = Path(path).expanduser()
    if not p.is_dir() or resolve_format(path, fmt) != "text":
        return None
    found = folder_files(p)
    if any(f.suffix == ".jsonl" for f in found):
        return None
    return sum(1 for f in found if f.stat().st_size)  # an empty file is no document


def folder_files(folder: Path) -> list[Path]:
    """Every non-hidden regular file under `folder`, by relative path."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(root) / n for n in names if not n.startswith(".")]
    return sorted((p for p in found if p.is_file()), key=lambda p: p.relative_to(folder).parts)


def _file_documents(path: Path, fmt: str, text_field: str, whole: bool) -> Iterator[Document]:
    text = files.read_utf8(path, "data.path")
    if fmt == "jsonl":
        yield from _json_lines(path, text, text_field)
    elif whole:
        yield Document(str(path), text)
    else:
        yield from (Document(str(path), part) for part in _BLANK_LINES.split(text) if part.strip())


def _json_lines(path: Path, text: str, field: str) -> Iterator[Document]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"data.path {path}:{number} must be a JSON object, got invalid JSON ({err.msg})"
            ) from err
        value = record.get(field) if isinstance(record, dict) else None
        if not isinstance(value, str):
            raise ValueError(
                f"data.path {path}:{number} must be an object with a string {field!r} "
                f"(data.text_field), got {_kind(record, field)}"
            )
        if "\x00" in value:
            raise ValueError(f"data.path {path}:{number} must hold text, got a NUL character")
        yield Document(f"{path}:{number}", value)


def _kind(record, field: str) -> str:
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}"
    return (
        f"{field!r} of type {type(record[field]).__name__}" if field in record else f"no {field!r}"
    )


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def default_files() -> list[Path]:
    """The standard library's .py files of the default corpus, before the size cap."""
    root = stdlib_root()
    found = [p for p in root.rglob("*.py") if not _SKIPPED & set(p.relative_to(root).parts[:-1])]
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def default_documents() -> Iterator[Document]:
    """The default corpus: pydoc's topics, then stdlib files while within the cap."""
    return iter(_default_documents())


@functools.cache
def _default_documents() -> tuple[Document, ...]:
    return tuple(_read_default())


def _read_default() -> Iterator[Document]:
    root = stdlib_root()
    topics = _pydoc_topics(root / "pydoc_data" / "topics.py")
    used = 0
    for name in sorted(topics):
        used += len(topics[name].encode("utf-8"))
        yield Document(f"pydoc_data/topics.py:{name}", topics[name])
    for path in default_files():
        text = files.read_utf8(path, "data.path")
        used += len(text.encode("utf-8"))
        if used > DEFAULT_CAP_BYTES:
            return
        yield Document(str(path.relative_to(root)), text)


def _pydoc_topics(path: Path) -> dict[str, str]:
    """The `topics` dict of pydoc_data/topics.py, read without importing it."""
    for node in ast.parse(files.read_utf8(path, "data.path")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            "topics"
        ]:
            return ast.literal_eval(node.value)
    raise ValueError(f"{path} must define a dict 'topics', got none")


def fingerprint(path: str, fmt: str, text_field: str) -> str:
    """SHA-256 over what the corpus's documents are read from: files' relative names
    and bytes (the format and text field too); the default corpus's documents and the
    Python version. A changed corpus has another fingerprint."""
    digest = hashlib.sha256(f"{resolve_format(path, fmt)}\0{text_field}\0".encode())
    if path == DEFAULT:
        digest.update(sys.version.encode())
        for doc in default_documents():
            digest.update(doc.source.encode() + b"\0" + doc.text.encode() + b"\0")
        return digest.hexdigest()
    p = Path(path).expanduser()
    for file in folder_files(p) if p.is_dir() else [p]:
        name = file.relative_to(p) if p.is_dir() else file.name
        digest.update(str(name).encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda handle=handle: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()
