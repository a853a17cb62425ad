"""Files a run writes: atomically (a reader never sees a half-written file), JSON lines
that survive a killed writer, .npz archives, and figures."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import tokenize
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

# mkstemp makes files private (0600); finished files get the usual umask-based mode.
_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it over `path` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


# What a damaged archive raises while its index or an array is read: the zip layer, the
# decompressor, and numpy's parser of an array's header (ValueError, SyntaxError, ...).
_DAMAGED_NPZ = (
    zipfile.BadZipFile,
    EOFError,
    zlib.error,
    ValueError,
    SyntaxError,
    tokenize.TokenError,
)


def read_npz(path: str | os.PathLike) -> dict:
    """Every array of an .npz file; a file that is not one, or a damaged or cut-short
    archive, is a ValueError naming it. The file is opened here so that it is closed even
    when the archive is damaged (np.load leaves its own handle open when the zip is bad)."""
    with open(path, "rb") as handle:
        start = handle.read(6)
        handle.seek(0)
        if start.startswith(b"\x93NUMPY"):
            raise ValueError(f"{path} must be an .npz archive, got a single .npy array")
        if start and not start.startswith(b"PK"):
            raise ValueError(f"{path} is not an .npz archive (it does not start as a zip file)")
        try:
            with np.load(handle) as data:
                return {name: np.asarray(data[name]) for name in data.files}
        except _DAMAGED_NPZ as err:
            raise ValueError(
                f"{path} is not a whole .npz archive (damaged or cut short: {err})"
            ) from err


def read_utf8(path: str | os.PathLike, argument: str) -> str:
    """The text of a file the user named by `argument` (a flag or config field); a file that
    is missing, binary or not UTF-8 is a ValueError naming the argument, the file and the
    first bad byte, so every corpus and text reader says it the same way."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ValueError(f"{argument} {path} cannot be read: {err.strerror}") from err
    if b"\x00" in raw:
        raise ValueError(f"{argument} {path} must be text, got binary (it holds NUL bytes)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{argument} {path} must be UTF-8 text, got byte 0x{raw[err.start]:02x} "
            f"at offset {err.start} ({err.reason})"
        ) from err


def read_json(path: str | os.PathLike) -> dict:
    """The JSON object a file holds; a damaged one (not JSON, or not an object) is a
    ValueError naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON (damaged or cut short?): {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def write_json(path: str | os.PathLike, obj) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display is needed or opened)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | os.PathLike, **kwargs) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=Path(path).suffix.lstrip(".") or "png", **kwargs)
    return Path(path)


def write_figures(
    out_dir: str | os.PathLike, figures: dict[str, Callable[[], object]], dpi: int = 110
) -> list[Path]:
    """Each `figures[name]()` saved as out_dir/name and closed; returns the paths."""
    plt = pyplot()
    written = []
    for name, make in figures.items():
        fig = make()
        try:
            written.append(save_figure(fig, Path(out_dir) / name, dpi=dpi))
        finally:
            plt.close(fig)
    return written


def append_json_line(path: str | os.PathLike, record) -> None:
    """Append one record as one JSON line, flushed and synced: a reader skips a torn last
    line (a killed writer), never reads half a record; a torn line is never glued on."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        torn = f.tell() > 0 and not _ends_with_newline(path)
        f.write(("\n" if torn else "") + json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_json_lines(path: str | os.PathLike, keys, problems: list[str] | None = None) -> list:
    """Records (JSON objects holding every key in `keys`) of a JSON-lines file. A torn last
    line is ignored; any other line that is not a record is skipped and named in
    `problems` when given."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number < len(lines) and problems is not None:
                problems.append(f"{path}:{number}: not valid JSON; skipped")
            continue
        missing = [k for k in keys if not isinstance(record, dict) or k not in record]
        if missing:
            if problems is not None:
                problems.append(f"{path}:{number}: not a record (no {', '.join(missing)}); skipped")
            continue
        records.append(record)
    return records


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
