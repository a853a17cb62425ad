"""Atomic files, JSON lines and .npz archives: a write is whole or absent, and a damaged
file is a ValueError naming it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from beyondpar.base import files


def test_a_damaged_json_file_is_a_value_error_naming_it(tmp_path):
    path = tmp_path / "settings.json"
    files.write_json(path, {"spec": {"layers": [0]}})
    assert files.read_json(path) == {"spec": {"layers": [0]}}
    path.write_text('{"spec": {"lay')
    with pytest.raises(ValueError) as err:
        files.read_json(path)
    assert str(err.value).startswith(f"{path} is not valid JSON (damaged or cut short?): ")
    path.write_text("[1, 2]")
    with pytest.raises(ValueError) as err:
        files.read_json(path)
    assert str(err.value) == f"{path} must hold a JSON object, got list"


def test_a_cut_short_npz_is_a_value_error_naming_it(tmp_path):
    """An .npz cut anywhere (before its index, or inside an array) is one ValueError that
    names the file, never a zipfile or EOF error."""
    good = tmp_path / "good.npz"
    np.savez(good, attention=np.ones((2, 8, 8)))
    whole = good.read_bytes()
    assert files.read_npz(good)["attention"].shape == (2, 8, 8)
    cut = tmp_path / "cut.npz"
    for size in (len(whole) // 2, 40):
        cut.write_bytes(whole[:size])
        with pytest.raises(ValueError) as err:
            files.read_npz(cut)
        assert str(err.value).startswith(f"{cut} is not a whole .npz archive (damaged or cut")


def test_an_empty_npz_is_a_value_error_naming_it(tmp_path):
    """A file with no bytes at all (a write that never started) is the same one error."""
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    with pytest.raises(ValueError) as err:
        files.read_npz(empty)
    assert str(err.value).startswith(f"{empty} is not a whole .npz archive (damaged or cut")


def test_a_json_file_that_is_not_utf8_is_a_value_error_naming_it(tmp_path):
    path = tmp_path / "settings.json"
    path.write_bytes(b'{"model": "\xff\xfe"}')
    with pytest.raises(ValueError) as err:
        files.read_json(path)
    assert str(err.value).startswith(f"{path} is not valid JSON (damaged or cut short?): ")


def test_atomic_path_failure_leaves_target_and_folder_untouched(tmp_path):
    """A writer that fails mid-way leaves the old file as it was and no temporary file
    behind; the temporary file lives in the target's folder (so the rename is atomic)."""
    target = tmp_path / "out" / "result.json"
    files.write_text(target, "old\n")
    with pytest.raises(RuntimeError, match="disk full"), files.atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp != target
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["result.json"]
    files.write_json(target, {"b": 1, "a": [2]})
    assert target.read_text() == '{\n  "a": [\n    2\n  ],\n  "b": 1\n}\n'
    assert sorted(p.name for p in target.parent.iterdir()) == ["result.json"]


def test_atomic_path_interrupted_by_ctrl_c_leaves_nothing_behind(tmp_path):
    """Ctrl-C (KeyboardInterrupt, not an Exception) inside the block still removes the
    temporary file, and a target that did not exist is not created."""
    target = tmp_path / "metrics.npz"
    with pytest.raises(KeyboardInterrupt), files.atomic_path(target) as tmp:
        tmp.write_bytes(b"partial")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_read_json_lines_ignores_a_torn_last_line_but_names_a_bad_middle_one(tmp_path):
    """A half-written last line is what a killed writer leaves: it is dropped quietly. A
    broken line with records after it is damage, reported with its line number; a JSON
    value that lacks a key is reported as not a record."""
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 1}\n{"ste\n[3]\n{"step": 4, "x": 2}\n{"step": 5, "x"')
    problems = []
    records = files.read_json_lines(path, ["step"], problems)
    assert records == [{"step": 1}, {"step": 4, "x": 2}]
    assert problems == [
        f"{path}:2: not valid JSON; skipped",
        f"{path}:3: not a record (no step); skipped",
    ]
    assert files.read_json_lines(tmp_path / "absent.jsonl", ["step"], problems) == []


def test_read_json_lines_reports_json_values_that_are_not_objects(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('7\n"step"\n{"step": 2}\n')
    problems = []
    assert files.read_json_lines(path, ["step"], problems) == [{"step": 2}]
    assert problems == [
        f"{path}:1: not a record (no step); skipped",
        f"{path}:2: not a record (no step); skipped",
    ]


def test_atomic_files_get_the_mode_of_an_ordinary_new_file(tmp_path, monkeypatch):
    """Under the usual umask 022 a new file is 0644, where a temporary file is 0600."""
    monkeypatch.setattr(files, "_UMASK", 0o022)  # read once, when the module is imported
    previous = os.umask(0o022)
    try:
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
        written = files.write_text(tmp_path / "out" / "atomic.txt", "x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(written.stat().st_mode) == 0o644
    assert stat.S_IMODE(plain.stat().st_mode) == 0o644


_KILLED_WRITER = """
import os, signal, sys
from beyondpar.base import files
path = sys.argv[1]
files.append_json_line(path, {"step": 1, "loss": 0.5})
with open(path, "a") as f:
    f.write('{"step": 2, "lo')
    f.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_append_after_a_killed_writer_starts_on_a_new_line(tmp_path):
    """A writer killed mid-record leaves a torn line; the next append must start on a
    fresh line, so its record is read back whole and only the torn one is lost."""
    path = tmp_path / "metrics.jsonl"
    killed = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], check=False)
    assert killed.returncode == -9
    files.append_json_line(path, {"step": 3, "loss": 0.25})
    problems = []
    records = files.read_json_lines(path, ["step", "loss"], problems)
    assert records == [{"step": 1, "loss": 0.5}, {"step": 3, "loss": 0.25}]
    assert problems == [f"{path}:2: not valid JSON; skipped"]
    assert path.read_text().splitlines()[2] == json.dumps({"step": 3, "loss": 0.25})


def test_an_npz_damaged_inside_or_not_an_npz_at_all_is_named(tmp_path):
    """Flipped bytes in a compressed array or in an array's header, a text file and a
    single .npy array under an .npz name: each one ValueError naming the file."""
    attention = np.random.default_rng(0).random((2, 50, 50))
    compressed, plain = tmp_path / "c.npz", tmp_path / "u.npz"
    np.savez_compressed(compressed, attention=attention)
    np.savez(plain, attention=attention)
    data = bytearray(compressed.read_bytes())
    data[200] ^= 0xFF
    data[300] ^= 0xFF
    (tmp_path / "flipped.npz").write_bytes(bytes(data))
    data = bytearray(plain.read_bytes())
    at = data.find(b"{'descr'")
    data[at + 3 : at + 9] = b"(((((("
    (tmp_path / "header.npz").write_bytes(bytes(data))
    for name in ("flipped.npz", "header.npz"):
        with pytest.raises(ValueError, match="is not a whole .npz archive") as err:
            files.read_npz(tmp_path / name)
        assert str(err.value).startswith(f"{tmp_path / name} ")
    (tmp_path / "text.npz").write_text("hello, a text file\n")
    with pytest.raises(ValueError, match="text.npz is not an .npz archive .it does not start"):
        files.read_npz(tmp_path / "text.npz")
    with open(tmp_path / "single.npz", "wb") as f:
        np.save(f, attention)
    with pytest.raises(ValueError, match="single.npz must be an .npz archive, got a single"):
        files.read_npz(tmp_path / "single.npz")


@pytest.mark.parametrize(
    "content,message",
    [
        (b"ok \xc3\xa9\xe6\x9d\xb1", None),
        (b"caf\xe9 au lait", r"--corpus .*x.txt must be UTF-8 text, got byte 0xe9 at offset 3 \("),
        (b"GGUF\x00\x01", r"--corpus .*x.txt must be text, got binary \(it holds NUL bytes\)"),
    ],
)
def test_read_utf8_names_the_argument_the_file_and_the_first_bad_byte(tmp_path, content, message):
    """One reader for every corpus and text file: a good file's text; a binary or
    non-UTF-8 one is one line naming the argument, the file and the byte."""
    path = tmp_path / "x.txt"
    path.write_bytes(content)
    if message is None:
        assert files.read_utf8(path, "--corpus") == "ok é東"
        return
    with pytest.raises(ValueError, match=message):
        files.read_utf8(path, "--corpus")


def test_read_utf8_of_a_missing_file_names_it(tmp_path):
    with pytest.raises(ValueError, match=r"data.path .*gone.txt cannot be read: No such file"):
        files.read_utf8(tmp_path / "gone.txt", "data.path")


def test_read_utf8_names_the_first_bad_byte_and_its_offset(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes("é ok".encode() + b"\xff\xfe rest")
    with pytest.raises(ValueError) as err:
        files.read_utf8(path, "--text")
    message = str(err.value)
    assert message.startswith(f"--text {path} must be UTF-8 text, got byte 0xff at offset 5 (")


def test_read_utf8_cut_multibyte_character_is_at_its_first_byte(tmp_path):
    path = tmp_path / "cut.txt"
    path.write_bytes(b"ab" + "€".encode()[:2])  # e2 82, the third byte missing
    with pytest.raises(ValueError, match=r"got byte 0xe2 at offset 2 \("):
        files.read_utf8(path, "--text")


def test_read_utf8_finds_a_nul_byte_anywhere(tmp_path):
    path = tmp_path / "late.bin"
    path.write_bytes(b"a" * 5000 + b"\x00" + b"b")
    with pytest.raises(ValueError) as err:
        files.read_utf8(path, "data.path")
    assert str(err.value).startswith(f"data.path {path} must be text, got binary")


def test_read_utf8_unreadable_path_is_a_value_error_naming_the_argument(tmp_path):
    for path in (tmp_path / "missing.txt", tmp_path):  # absent; a folder
        with pytest.raises(ValueError) as err:
            files.read_utf8(path, "--corpus")
        assert str(err.value).startswith(f"--corpus {path} cannot be read: ")


def test_read_utf8_returns_non_ascii_text_unchanged(tmp_path):
    text = "naïve café — ✓ 日本\n"
    path = tmp_path / "ok.txt"
    path.write_bytes(text.encode())
    assert files.read_utf8(str(path), "--text") == text
